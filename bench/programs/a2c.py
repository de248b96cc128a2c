"""Port of ikostrikov/pytorch-a2c-ppo-acktr-gail with ``--algo a2c`` on a classic-control
task: the shared ``Policy`` (an MLP actor tower, an MLP critic tower, a categorical head),
n-step rollouts from several parallel environments, bootstrapped discounted returns cut
by the episode masks, ``value_loss_coef * value_loss + action_loss - entropy_coef *
entropy``, RMSprop, gradient clipping and the linear learning-rate decay.

Source: github.com/ikostrikov/pytorch-a2c-ppo-acktr-gail, ``main.py``,
``a2c_ppo_acktr/algo/a2c_acktr.py``, ``a2c_ppo_acktr/model.py``,
``a2c_ppo_acktr/distributions.py``, ``a2c_ppo_acktr/storage.py``,
``a2c_ppo_acktr/envs.py``, ``a2c_ppo_acktr/utils.py``, ``a2c_ppo_acktr/arguments.py`` and
``evaluation.py`` at commit 41332b78dfb50321c29bade65f9d244387f68a60 (MIT, Copyright (c)
2017 Ilya Kostrikov). Written anew from the facts of those files; no code copied. Gym is
not installed: the environment (the data, not the program) is CartPole-v0 written here
as a vectorised numpy environment (gym's ``cartpole.py`` equations, the 200-step
``TimeLimit``, reset on done as ``SubprocVecEnv`` does, the episode return reported in
``info['episode']`` as the ``Monitor`` wrapper does, ``bad_transition`` as
``TimeLimitMask`` sets it), behind the repository's ``VecNormalize`` (observations
standardised by a running mean/variance and clipped to 10, rewards divided by the running
standard deviation of the discounted return, clipped to 10; ``gamma=None``, no reward
normalisation, for the evaluation envs).

Kept: ``Policy`` with ``forward`` raising ``NotImplementedError`` and ``act`` /
``get_value`` / ``evaluate_actions``; ``MLPBase`` (``actor`` and ``critic`` towers
``Linear(obs, 64), Tanh, Linear(64, 64), Tanh``, ``critic_linear`` ``Linear(64, 1)``,
orthogonal init with gain sqrt(2) and zero biases); the ``Categorical`` head (a linear
layer, orthogonal gain 0.01, ``FixedCategorical`` with ``sample().unsqueeze(-1)``,
``log_probs`` of shape (N, 1), ``mode``); ``RolloutStorage`` (obs, rewards,
value_preds, returns, action_log_probs, actions, masks, bad_masks; ``insert``,
``after_update``, ``compute_returns`` without GAE and without proper time limits, the
defaults: ``returns[step] = returns[step + 1] * gamma * masks[step + 1] +
rewards[step]``); ``A2C_ACKTR`` (``RMSprop(lr=7e-4, eps=1e-5, alpha=0.99)``;
``update``: ``evaluate_actions`` on the flattened rollout, values and log-probs viewed
back to ``(num_steps, num_processes, 1)``, ``advantages = returns[:-1] - values``,
``value_loss = advantages.pow(2).mean()``, ``action_loss = -(advantages.detach() *
action_log_probs).mean()``, ``zero_grad``, ``(value_loss * 0.5 + action_loss -
dist_entropy * 0.01).backward()``, ``clip_grad_norm_(..., 0.5)``, ``step``);
``main.py``'s loop (``torch.manual_seed``, ``update_linear_schedule`` at every update
(``--use-linear-lr-decay``, as the README's continuous-control commands pass it),
``num_steps`` 5 steps of ``act`` under ``no_grad`` per update, masks from ``done``,
``get_value`` of the last observation, ``compute_returns``, ``agent.update``,
``after_update``, the last 10 training episode returns kept in a deque);
``evaluate`` (deterministic actions, eval envs seeded ``seed + num_processes`` and
normalised with the training ``obs_rms`` frozen, 10 episodes).
Shrunk: ``num_processes`` 8 instead of 16; ``num_env_steps`` 40,000 instead of 10e6
(1,000 updates of 8 x 5 steps); no log/save directories, checkpoints or prints; the
evaluation runs once, after training (``--eval-interval`` is None by default).
Measure only (not in the program): the mean of the final ``evaluate`` (10 deterministic
episodes, 200 at most) and the mean of the last 10 training episode returns.

nndx, as the author would add it: ``nndx.Monitor(actor_critic, agent.optimizer)``
around the update loop, every update's total loss logged. The probes need a batch with
inputs and targets; the first one there is is the first rollout: inputs ``(obs, rnn_hxs,
masks)`` as ``Policy`` takes them and targets ``(actions, returns)``, scored by the
update's loss written as a function of the ``(values, action_log_probs, dist_entropy,
rnn_hxs)`` that ``evaluate_actions`` returns. The model given to nndx is
``actor_critic``, the ``Policy`` the optimizer trains, as the author wrote it: its
``forward`` raises ``NotImplementedError`` (the program calls ``act``/
``evaluate_actions``), so every probe that calls the model fails, and that is recorded,
not worked around. A preflight ``nndx.probe`` at the first update (before the first
step), with the optimizer; after training ``nndx.probe`` on the same batch with
``monitor=mon`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "a2c"
SOURCE = Source("ikostrikov/pytorch-a2c-ppo-acktr-gail", "a2c_ppo_acktr/algo/a2c_acktr.py",
                "41332b78dfb50321c29bade65f9d244387f68a60", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--algo a2c, CartPole-v0, 8 processes, 40k steps)"),
        Variant(
            "returns_flattened",
            "update subtracts the (N, 1) values from the returns flattened with view(-1): advantages broadcast "
            "to (N, N), so the critic regresses to the batch's mean return and every action's advantage is the "
            "batch mean minus its own value",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/PacktPublishing/Deep-Reinforcement-Learning-Hands-On/issues/33",
             "https://github.com/MorvanZhou/pytorch-A3C/issues/5",
             "https://github.com/thu-ml/tianshou/pull/155",
             "https://github.com/tensortrade-org/tensortrade/pull/191"),
            Measure("late_train_return", "mean of the last 10 training episode returns (main.py's printed "
                    "'Last 10 training episodes: mean reward') at least 15 below the healthy run's: 175.7 buggy "
                    "against 200.0 healthy on seed 0 (the deterministic evaluate() reaches 200 in both)",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
        Variant(
            "masks_not_applied",
            "compute_returns leaves out masks[step + 1]: returns run on across episode ends, so the step that "
            "dropped the pole is credited with the next episode's rewards",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/ucla-rlcourse/RLexample/pull/2",
             "https://github.com/higgsfield-ai/higgsfield/issues/19",
             "https://github.com/seungeunrho/minimalRL/pull/21"),
            Measure("eval_return", "final evaluate() mean return at least 30 below the healthy run's: 145.3 "
                    "buggy against 200.0 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

# arguments.py defaults for --algo a2c, and the shrink
LR, EPS, ALPHA, GAMMA = 7e-4, 1e-5, 0.99, 0.99
ENTROPY_COEF, VALUE_LOSS_COEF, MAX_GRAD_NORM = 0.01, 0.5, 0.5
NUM_PROCESSES, NUM_STEPS = 8, 5  # 16 processes in arguments.py
NUM_ENV_STEPS = 40_000  # 10e6 in arguments.py
USE_GAE, GAE_LAMBDA, USE_PROPER_TIME_LIMITS, USE_LINEAR_LR_DECAY = False, 0.95, False, True


# --------------------------------------------------------------------------- the environment (the data)


class RunningMeanStd:
    """baselines' running mean/variance (parallel update of the moments)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, batch_count = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean, self.var, self.count = self.mean + delta * batch_count / total, m2 / total, total


class VecCartPole:
    """``num_envs`` CartPole-v0 copies stepped together, reset on done; gym's equations."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold, x_threshold, max_episode_steps = 12 * 2 * math.pi / 360, 2.4, 200

    def __init__(self, num_envs: int, seed: int) -> None:
        self.num_envs = num_envs
        self.rng = np.random.RandomState(seed)
        self.state = np.zeros((num_envs, 4))
        self.elapsed = np.zeros(num_envs, dtype=int)
        self.ep_return = np.zeros(num_envs)

    def reset(self) -> np.ndarray:
        self.state = self.rng.uniform(-0.05, 0.05, size=(self.num_envs, 4))
        self.elapsed[:] = 0
        self.ep_return[:] = 0.0
        return self.state.copy()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(action == 1, self.force_mag, -self.force_mag)
        total_mass, polemass_length = self.masspole + self.masscart, self.masspole * self.length
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        thetaacc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass))
        xacc = temp - polemass_length * thetaacc * cos / total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        self.state = np.stack([x, x_dot, theta, theta_dot], axis=1)
        self.elapsed += 1
        reward = np.ones(self.num_envs)
        self.ep_return += reward
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        truncated = self.elapsed >= self.max_episode_steps
        done = terminated | truncated
        infos: list[dict] = [{} for _ in range(self.num_envs)]
        for i in np.nonzero(done)[0]:
            infos[i]["episode"] = {"r": float(self.ep_return[i]), "l": int(self.elapsed[i])}
            if truncated[i] and not terminated[i]:
                infos[i]["bad_transition"] = True
            self.state[i] = self.rng.uniform(-0.05, 0.05, size=4)
            self.elapsed[i], self.ep_return[i] = 0, 0.0
        return self.state.copy(), reward, done, infos


class VecNormalize:
    """The repository's VecNormalize + VecPyTorch: standardised float tensors out."""

    def __init__(self, venv: VecCartPole, gamma: float | None, clip_obs: float = 10.0, clip_reward: float = 10.0,
                 epsilon: float = 1e-8) -> None:  # fmt: skip
        self.venv, self.gamma, self.epsilon = venv, gamma, epsilon
        self.clip_obs, self.clip_reward = clip_obs, clip_reward
        self.obs_rms = RunningMeanStd((4,))
        self.ret_rms = RunningMeanStd(())
        self.ret = np.zeros(venv.num_envs)
        self.training = True

    def eval(self) -> None:
        self.training = False

    def _obfilt(self, obs: np.ndarray) -> np.ndarray:
        if self.training:
            self.obs_rms.update(obs)
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon),
                       -self.clip_obs, self.clip_obs)

    def reset(self) -> torch.Tensor:
        self.ret = np.zeros(self.venv.num_envs)
        return torch.from_numpy(self._obfilt(self.venv.reset())).float()

    def step(self, action: torch.Tensor):
        obs, rews, news, infos = self.venv.step(action.squeeze(1).cpu().numpy())
        self.ret = self.ret * (self.gamma or 0.0) + rews
        obs = self._obfilt(obs)
        if self.gamma is not None:
            self.ret_rms.update(self.ret)
            rews = np.clip(rews / np.sqrt(self.ret_rms.var + self.epsilon), -self.clip_reward, self.clip_reward)
        self.ret[news] = 0.0
        return (torch.from_numpy(obs).float(), torch.from_numpy(rews).unsqueeze(1).float(), news, infos)


def make_vec_envs(seed: int, num_processes: int, gamma: float | None) -> VecNormalize:
    return VecNormalize(VecCartPole(num_processes, seed), gamma)


# --------------------------------------------------------------------------- the program (model.py, distributions.py)


def init(module: nn.Module, weight_init, bias_init, gain: float = 1.0) -> nn.Module:
    weight_init(module.weight.data, gain=gain)
    bias_init(module.bias.data)
    return module


class FixedCategorical(torch.distributions.Categorical):
    def sample(self) -> torch.Tensor:
        return super().sample().unsqueeze(-1)

    def log_probs(self, actions: torch.Tensor) -> torch.Tensor:
        return super().log_prob(actions.squeeze(-1)).view(actions.size(0), -1).sum(-1).unsqueeze(-1)

    def mode(self) -> torch.Tensor:
        return self.probs.argmax(dim=-1, keepdim=True)


class Categorical(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int) -> None:
        super().__init__()
        self.linear = init(nn.Linear(num_inputs, num_outputs), nn.init.orthogonal_,
                           lambda x: nn.init.constant_(x, 0), gain=0.01)

    def forward(self, x: torch.Tensor) -> FixedCategorical:
        return FixedCategorical(logits=self.linear(x))


class MLPBase(nn.Module):
    def __init__(self, num_inputs: int, hidden_size: int = 64) -> None:
        super().__init__()
        init_ = lambda m: init(m, nn.init.orthogonal_, lambda x: nn.init.constant_(x, 0), np.sqrt(2))  # noqa: E731
        self.actor = nn.Sequential(init_(nn.Linear(num_inputs, hidden_size)), nn.Tanh(),
                                   init_(nn.Linear(hidden_size, hidden_size)), nn.Tanh())
        self.critic = nn.Sequential(init_(nn.Linear(num_inputs, hidden_size)), nn.Tanh(),
                                    init_(nn.Linear(hidden_size, hidden_size)), nn.Tanh())
        self.critic_linear = init_(nn.Linear(hidden_size, 1))
        self.output_size = hidden_size
        self.recurrent_hidden_state_size = 1
        self.is_recurrent = False
        self.train()

    def forward(self, inputs: torch.Tensor, rnn_hxs: torch.Tensor, masks: torch.Tensor):
        hidden_critic = self.critic(inputs)
        hidden_actor = self.actor(inputs)
        return self.critic_linear(hidden_critic), hidden_actor, rnn_hxs


class Policy(nn.Module):
    def __init__(self, obs_shape: tuple[int, ...], num_actions: int) -> None:
        super().__init__()
        self.base = MLPBase(obs_shape[0])
        self.dist = Categorical(self.base.output_size, num_actions)

    @property
    def is_recurrent(self) -> bool:
        return self.base.is_recurrent

    @property
    def recurrent_hidden_state_size(self) -> int:
        return self.base.recurrent_hidden_state_size

    def forward(self, inputs, rnn_hxs, masks):
        raise NotImplementedError

    def act(self, inputs, rnn_hxs, masks, deterministic: bool = False):
        value, actor_features, rnn_hxs = self.base(inputs, rnn_hxs, masks)
        dist = self.dist(actor_features)
        action = dist.mode() if deterministic else dist.sample()
        action_log_probs = dist.log_probs(action)
        return value, action, action_log_probs, rnn_hxs

    def get_value(self, inputs, rnn_hxs, masks) -> torch.Tensor:
        value, _, _ = self.base(inputs, rnn_hxs, masks)
        return value

    def evaluate_actions(self, inputs, rnn_hxs, masks, action):
        value, actor_features, rnn_hxs = self.base(inputs, rnn_hxs, masks)
        dist = self.dist(actor_features)
        action_log_probs = dist.log_probs(action)
        dist_entropy = dist.entropy().mean()
        return value, action_log_probs, dist_entropy, rnn_hxs


# --------------------------------------------------------------------------- storage.py


class RolloutStorage:
    def __init__(self, num_steps: int, num_processes: int, obs_shape: tuple[int, ...], recurrent_hidden_state_size: int,
                 variant: str) -> None:  # fmt: skip
        self.obs = torch.zeros(num_steps + 1, num_processes, *obs_shape)
        self.recurrent_hidden_states = torch.zeros(num_steps + 1, num_processes, recurrent_hidden_state_size)
        self.rewards = torch.zeros(num_steps, num_processes, 1)
        self.value_preds = torch.zeros(num_steps + 1, num_processes, 1)
        self.returns = torch.zeros(num_steps + 1, num_processes, 1)
        self.action_log_probs = torch.zeros(num_steps, num_processes, 1)
        self.actions = torch.zeros(num_steps, num_processes, 1).long()  # Discrete
        self.masks = torch.ones(num_steps + 1, num_processes, 1)
        self.bad_masks = torch.ones(num_steps + 1, num_processes, 1)
        self.num_steps, self.step, self.variant = num_steps, 0, variant

    def insert(self, obs, recurrent_hidden_states, actions, action_log_probs, value_preds, rewards, masks, bad_masks):
        self.obs[self.step + 1].copy_(obs)
        self.recurrent_hidden_states[self.step + 1].copy_(recurrent_hidden_states)
        self.actions[self.step].copy_(actions)
        self.action_log_probs[self.step].copy_(action_log_probs)
        self.value_preds[self.step].copy_(value_preds)
        self.rewards[self.step].copy_(rewards)
        self.masks[self.step + 1].copy_(masks)
        self.bad_masks[self.step + 1].copy_(bad_masks)
        self.step = (self.step + 1) % self.num_steps

    def after_update(self) -> None:
        self.obs[0].copy_(self.obs[-1])
        self.recurrent_hidden_states[0].copy_(self.recurrent_hidden_states[-1])
        self.masks[0].copy_(self.masks[-1])
        self.bad_masks[0].copy_(self.bad_masks[-1])

    def compute_returns(self, next_value, use_gae, gamma, gae_lambda, use_proper_time_limits=True) -> None:
        # the defaults for --algo a2c: no GAE, no proper time limits
        assert not use_gae and not use_proper_time_limits
        self.returns[-1] = next_value
        for step in reversed(range(self.rewards.size(0))):
            if self.variant == "masks_not_applied":
                self.returns[step] = self.returns[step + 1] * gamma + self.rewards[step]
            else:
                self.returns[step] = self.returns[step + 1] * gamma * self.masks[step + 1] + self.rewards[step]


# --------------------------------------------------------------------------- a2c_acktr.py


def a2c_loss(output, targets) -> torch.Tensor:
    """``update``'s loss for the probes, from what ``evaluate_actions`` returns; targets
    ``(actions, returns)`` flattened to (N, 1)."""
    values, action_log_probs, dist_entropy, _ = output
    _, returns = targets
    advantages = returns - values
    value_loss = advantages.pow(2).mean()
    action_loss = -(advantages.detach() * action_log_probs).mean()
    return value_loss * VALUE_LOSS_COEF + action_loss - dist_entropy * ENTROPY_COEF


class A2C_ACKTR:  # noqa: N801 - the source's name
    def __init__(self, actor_critic: Policy, value_loss_coef: float, entropy_coef: float, lr: float, eps: float,
                 alpha: float, max_grad_norm: float, variant: str) -> None:  # fmt: skip
        self.actor_critic = actor_critic
        self.value_loss_coef, self.entropy_coef, self.max_grad_norm = value_loss_coef, entropy_coef, max_grad_norm
        self.optimizer = optim.RMSprop(actor_critic.parameters(), lr, eps=eps, alpha=alpha)
        self.variant = variant
        self.mon = None
        self.first_batch = None

    def update(self, rollouts: RolloutStorage, nx: Nndx) -> tuple[float, float, float]:
        obs_shape = rollouts.obs.size()[2:]
        action_shape = rollouts.actions.size()[-1]
        num_steps, num_processes, _ = rollouts.rewards.size()

        if self.first_batch is None:  # the author's preflight, on the first rollout there is
            inputs = (rollouts.obs[:-1].reshape(-1, *obs_shape).clone(),
                      rollouts.recurrent_hidden_states[0].reshape(-1, 1).repeat(num_steps, 1).clone(),
                      rollouts.masks[:-1].reshape(-1, 1).clone())  # fmt: skip
            targets = (rollouts.actions.reshape(-1, action_shape).clone(), rollouts.returns[:-1].reshape(-1, 1).clone())
            self.first_batch = (inputs, targets)
            nx.preflight(self.actor_critic, self.first_batch, a2c_loss, optimizer=self.optimizer)
            self.mon = nx.monitor(self.actor_critic, self.optimizer, every=10)

        values, action_log_probs, dist_entropy, _ = self.actor_critic.evaluate_actions(
            rollouts.obs[:-1].view(-1, *obs_shape),
            rollouts.recurrent_hidden_states[0].view(-1, self.actor_critic.recurrent_hidden_state_size),
            rollouts.masks[:-1].view(-1, 1),
            rollouts.actions.view(-1, action_shape))

        if self.variant == "returns_flattened":
            advantages = rollouts.returns[:-1].view(-1) - values  # (N,) - (N, 1): (N, N)
        else:
            values = values.view(num_steps, num_processes, 1)
            action_log_probs = action_log_probs.view(num_steps, num_processes, 1)
            advantages = rollouts.returns[:-1] - values
        value_loss = advantages.pow(2).mean()
        action_loss = -(advantages.detach() * action_log_probs).mean()

        self.optimizer.zero_grad()
        loss = value_loss * self.value_loss_coef + action_loss - dist_entropy * self.entropy_coef
        loss.backward()
        nn.utils.clip_grad_norm_(self.actor_critic.parameters(), self.max_grad_norm)
        self.optimizer.step()
        nx.timed(lambda: self.mon.log(loss))
        return value_loss.item(), action_loss.item(), dist_entropy.item()


def update_linear_schedule(optimizer: optim.Optimizer, epoch: int, total_num_epochs: int, initial_lr: float) -> None:
    lr = initial_lr - (initial_lr * (epoch / float(total_num_epochs)))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


# --------------------------------------------------------------------------- evaluation.py, main.py


def evaluate(actor_critic: Policy, obs_rms: RunningMeanStd, seed: int, num_processes: int) -> float:
    eval_envs = make_vec_envs(seed + num_processes, num_processes, None)
    eval_envs.eval()
    eval_envs.obs_rms = obs_rms
    eval_episode_rewards: list[float] = []
    obs = eval_envs.reset()
    eval_recurrent_hidden_states = torch.zeros(num_processes, actor_critic.recurrent_hidden_state_size)
    eval_masks = torch.zeros(num_processes, 1)
    while len(eval_episode_rewards) < 10:
        with torch.no_grad():
            _, action, _, eval_recurrent_hidden_states = actor_critic.act(
                obs, eval_recurrent_hidden_states, eval_masks, deterministic=True)
        obs, _, done, infos = eval_envs.step(action)
        eval_masks = torch.tensor([[0.0] if done_ else [1.0] for done_ in done], dtype=torch.float32)
        for info in infos:
            if "episode" in info:
                eval_episode_rewards.append(info["episode"]["r"])
    return float(np.mean(eval_episode_rewards))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    seed = 1 + seed  # arguments.py's default seed, plus the runner's offset
    torch.manual_seed(seed)
    envs = make_vec_envs(seed, NUM_PROCESSES, GAMMA)
    actor_critic = Policy((4,), 2)
    agent = A2C_ACKTR(actor_critic, VALUE_LOSS_COEF, ENTROPY_COEF, lr=LR, eps=EPS, alpha=ALPHA,
                      max_grad_norm=MAX_GRAD_NORM, variant=variant)  # fmt: skip
    rollouts = RolloutStorage(NUM_STEPS, NUM_PROCESSES, (4,), actor_critic.recurrent_hidden_state_size, variant)
    obs = envs.reset()
    rollouts.obs[0].copy_(obs)
    episode_rewards: deque[float] = deque(maxlen=10)
    losses: list[tuple[float, float, float]] = []

    num_updates = int(NUM_ENV_STEPS) // NUM_STEPS // NUM_PROCESSES
    for j in range(num_updates):
        if USE_LINEAR_LR_DECAY:
            update_linear_schedule(agent.optimizer, j, num_updates, LR)
        for step in range(NUM_STEPS):
            with torch.no_grad():
                value, action, action_log_prob, recurrent_hidden_states = actor_critic.act(
                    rollouts.obs[step], rollouts.recurrent_hidden_states[step], rollouts.masks[step])
            obs, reward, done, infos = envs.step(action)
            for info in infos:
                if "episode" in info:
                    episode_rewards.append(info["episode"]["r"])
            masks = torch.FloatTensor([[0.0] if done_ else [1.0] for done_ in done])
            bad_masks = torch.FloatTensor([[0.0] if "bad_transition" in info else [1.0] for info in infos])
            rollouts.insert(obs, recurrent_hidden_states, action, action_log_prob, value, reward, masks, bad_masks)
        with torch.no_grad():
            next_value = actor_critic.get_value(rollouts.obs[-1], rollouts.recurrent_hidden_states[-1],
                                                rollouts.masks[-1]).detach()  # fmt: skip
        rollouts.compute_returns(next_value, USE_GAE, GAMMA, GAE_LAMBDA, USE_PROPER_TIME_LIMITS)
        losses.append(agent.update(rollouts, nx))
        rollouts.after_update()

    if agent.mon is not None:
        nx.finish(agent.mon, actor_critic, agent.first_batch, a2c_loss, optimizer=agent.optimizer)

    eval_return = evaluate(actor_critic, envs.obs_rms, seed, NUM_PROCESSES)
    late = losses[-100:]
    return {
        "eval_return": eval_return,
        "late_train_return": float(np.mean(episode_rewards)) if episode_rewards else 0.0,
        "late_value_loss": float(np.mean([v for v, _, _ in late])),
        "late_entropy": float(np.mean([e for _, _, e in late])),
    }
