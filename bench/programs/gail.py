"""Port of ikostrikov/pytorch-a2c-ppo-acktr-gail with ``--algo ppo --gail``: generative
adversarial imitation learning. A discriminator (an MLP on state-action pairs) is trained
with binary cross-entropy plus a gradient penalty to tell the expert's pairs from the
policy's; its output, turned into a reward and normalised by a running return standard
deviation, replaces the environment's reward; PPO updates the policy on it.

Source: github.com/ikostrikov/pytorch-a2c-ppo-acktr-gail, ``main.py``,
``a2c_ppo_acktr/algo/gail.py``, ``a2c_ppo_acktr/algo/ppo.py``, ``a2c_ppo_acktr/model.py``,
``a2c_ppo_acktr/distributions.py``, ``a2c_ppo_acktr/storage.py``, ``a2c_ppo_acktr/envs.py``,
``a2c_ppo_acktr/utils.py``, ``a2c_ppo_acktr/arguments.py`` and ``evaluation.py`` at commit
41332b78dfb50321c29bade65f9d244387f68a60 (MIT, Copyright (c) 2017 Ilya Kostrikov). Written
anew from the facts of those files; no code copied.

Kept: the run of ``gail_experts/README.md`` (``--algo ppo --use-gae --num-processes 1 --lr
3e-4 --entropy-coef 0 --value-loss-coef 0.5 --ppo-epoch 10 --gamma 0.99 --gae-lambda 0.95
--use-linear-lr-decay --use-proper-time-limits --gail``, ``--gail-batch-size 128`` and
``--gail-epoch 5`` by default, ``--clip-param 0.2``, ``--eps 1e-5``, ``--max-grad-norm
0.5``). ``gail.Discriminator``: ``trunk = Linear(obs + act, 100), Tanh, Linear(100, 100),
Tanh, Linear(100, 1)``, ``Adam(trunk.parameters())`` at its default lr; ``update``:
``self.train()``, the rollout's ``feed_forward_generator(None, mini_batch_size=
gail_batch_size)`` zipped with the expert loader, per pair of batches the policy's and the
expert's logits (expert states passed through the training env's ``_obfilt(...,
update=False)``), ``binary_cross_entropy_with_logits`` against ones (expert) and zeros
(policy), ``compute_grad_pen`` (a per-sample ``alpha`` mixing expert and policy pairs,
``autograd.grad(..., create_graph=True, retain_graph=True)``, ``lambda_ * (||grad|| -
1)^2``, ``lambda_ = 10``), ``zero_grad`` / ``(gail_loss + grad_pen).backward()`` / ``step``;
``predict_reward``: under ``no_grad``, ``self.eval()``, ``s = sigmoid(D)``, ``reward = log s
- log(1 - s)``, the discounted return of those rewards (cut by the masks) fed to a running
variance, the reward divided by its standard deviation. ``gail.ExpertDataset``: a random
subset of the expert trajectories, each subsampled every ``subsample_frequency`` steps from
a random offset, indexed as (state, action) pairs; the loader ``shuffle=True``,
``drop_last`` when the set exceeds a batch. ``main.py``'s loop: ``num_steps`` steps of
``act`` under ``no_grad`` per update, masks and ``bad_masks`` (``TimeLimitMask``), at each
update the linear LR decay, ``envs.venv.eval()`` (the observation statistics frozen) from
update 10 on, 100 discriminator epochs for the first 10 updates and ``gail_epoch`` after,
the rollout's rewards replaced by ``predict_reward``, ``compute_returns`` with GAE and proper
time limits, ``agent.update``, ``after_update``, the last 10 training episode returns kept.
``PPO``: ``Adam(lr, eps)``; ``update``: advantages ``returns - value_preds`` standardised,
``ppo_epoch`` passes of ``feed_forward_generator(advantages, num_mini_batch)``, the clipped
surrogate, the clipped value loss ``0.5 * max(...)``, ``zero_grad`` / ``(value_loss *
value_loss_coef + action_loss - dist_entropy * entropy_coef).backward()`` /
``clip_grad_norm_`` / ``step``. ``Policy`` (``forward`` raises ``NotImplementedError``;
``act`` / ``get_value`` / ``evaluate_actions``) with ``MLPBase`` (actor and critic towers
``Linear(obs, 64), Tanh, Linear(64, 64), Tanh``, ``critic_linear``, orthogonal init gain
sqrt(2), zero biases) and the ``DiagGaussian`` head (``fc_mean`` orthogonal gain 1, a
learned ``AddBias`` log-std from 0, ``FixedNormal`` summing log-probs and entropies over the
action dimensions). ``RolloutStorage`` with float actions (a ``Box`` space). The
environment behind ``VecNormalize`` (observations standardised by a running mean/variance
and clipped to 10; the env reward scaled by the running std of its discounted return, which
GAIL overwrites anyway) and the ``Monitor`` wrapper's ``info['episode']`` with the true
return. ``evaluate``: deterministic actions, an eval env seeded ``seed + num_processes``
normalised with the training ``obs_rms`` frozen, 10 episodes.
Shrunk: no gym or MuJoCo: the environment (the data, not the program) is a point mass
written here: a 2-D position in a 10 x 10 room (raw coordinates 0..10, the goal at (7.5,
2.5)), a 2-D velocity command clipped to [-1, 1] moving it 0.4 a step, reward minus the
distance to the goal, 24 steps per episode (``TimeLimit``, ``bad_transition`` at the
limit), starts uniform in [1, 9]^2. The expert trajectories (``trajs_*.pt``: raw states,
actions, rewards, lengths) are 32 episodes of a proportional controller toward the goal
with Gaussian action noise 0.1, made from the seed. ``num_steps`` 240 instead of 2048
(10 episodes a rollout), 60 updates (14,400 env steps) instead of 10M steps, 8 PPO
mini-batches (of 30) instead of 32; the expert set 16 trajectories subsampled every 2 steps
(192 pairs, about the 200 that 4 of HalfCheetah's 1,000-step trajectories every 20 give:
one discriminator batch of 128 per epoch, as there) instead of 4 every 20.
No log/save directories, prints or checkpoints; ``evaluate`` runs once, after training.
Measure only (not in the program): the mean true return of the final ``evaluate`` and of
the last 10 training episodes (``info['episode']['r']``, which main.py prints).

nndx, as a GAN author would add it (like the SNGAN and WGAN-GP ports): the discriminator's
``trunk`` is the one model with a loss of its own, so at the first update (the first
rollout is the first policy data there is) a preflight ``nndx.probe`` of ``discr.trunk``
with its optimizer on 64 expert and 64 policy pairs built as ``update`` builds them,
labelled as ``update`` labels them, with ``binary_cross_entropy_with_logits`` as the loss;
one ``nndx.Monitor`` per model/optimizer pair (``discr.trunk`` with ``discr.optimizer``,
``actor_critic`` with ``agent.optimizer``), every discriminator loss (``gail_loss +
grad_pen``) and every PPO mini-batch loss logged to its Monitor; after training
``nndx.probe(discr.trunk, ..., monitor=mon_discr)`` on the same batch and the policy
Monitor's report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data
from torch import autograd
from torch.utils.data.sampler import BatchSampler, SubsetRandomSampler

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "gail"
SOURCE = Source("ikostrikov/pytorch-a2c-ppo-acktr-gail", "a2c_ppo_acktr/algo/gail.py",
                "41332b78dfb50321c29bade65f9d244387f68a60", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "gail_experts/README.md's PPO + GAIL run (shrunk: a 2-D point mass, 14.4k env steps)"),
        Variant(
            "expert_states_not_normalized",
            "Discriminator.update feeds the expert states raw (the obsfilt(expert_state, update=False) call left "
            "out) while the policy's states come out of VecNormalize standardised: the discriminator separates "
            "the two by their scale alone and its reward carries no imitation signal",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/andrewliao11/gail-tf/pull/9",
             "https://github.com/HumanCompatibleAI/imitation/pull/256",
             "https://github.com/hill-a/stable-baselines/issues/931"),
            Measure("eval_return", "final evaluate() mean true return at least 30 below the healthy run's: "
                    "-149.7 buggy against -31.8 healthy on seed 0 (the expert's -24.1)",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "discriminator_labels_swapped",
            "the discriminator trained with the expert's logits against zeros and the policy's against ones, "
            "while predict_reward still rewards log D - log(1 - D): the policy is paid for looking unlike the expert",
            (C.LABELS_MISALIGNED, C.WRONG_LOSS),
            ("https://github.com/p-christ/Deep-Reinforcement-Learning-Algorithms-with-PyTorch/issues/74",
             "https://github.com/jatinarora2702/gail-pytorch/issues/1",
             "https://github.com/fangihsiao/GAIL-Tensorflow/issues/1"),
            Measure("eval_return", "final evaluate() mean true return at least 30 below the healthy run's: "
                    "-163.0 buggy against -31.8 healthy on seed 0 (the expert's -24.1)",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

# gail_experts/README.md's command and arguments.py's defaults, and the shrink
LR, EPS, GAMMA, GAE_LAMBDA = 3e-4, 1e-5, 0.99, 0.95
ENTROPY_COEF, VALUE_LOSS_COEF, MAX_GRAD_NORM, CLIP_PARAM = 0.0, 0.5, 0.5, 0.2
PPO_EPOCH, NUM_MINI_BATCH = 10, 8  # 32 mini-batches in the README's command
NUM_PROCESSES, NUM_STEPS = 1, 240  # 2048 steps in the README's command
NUM_ENV_STEPS = 14_400  # 10e6 in the README's command: 60 updates here
USE_GAE, USE_PROPER_TIME_LIMITS, USE_LINEAR_LR_DECAY = True, True, True
GAIL_BATCH_SIZE, GAIL_EPOCH, GAIL_WARMUP_UPDATES, GAIL_WARMUP_EPOCH = 128, 5, 10, 100
NUM_TRAJECTORIES, SUBSAMPLE_FREQUENCY = 16, 2  # 4 and 20 in main.py
EXPERT_EPISODES = 32
PROBE = 64

# the point mass (the environment: the data)
ROOM, GOAL, SPEED, MAX_EPISODE_STEPS = 10.0, np.array([7.5, 2.5]), 0.4, 24
OBS_DIM, ACT_DIM = 2, 2


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


class VecPointMass:
    """``num_envs`` point masses stepped together, reset on done, with the ``TimeLimit``,
    ``TimeLimitMask`` and ``Monitor`` wrappers' bookkeeping."""

    def __init__(self, num_envs: int, seed: int) -> None:
        self.num_envs = num_envs
        self.rng = np.random.RandomState(seed)
        self.pos = np.zeros((num_envs, OBS_DIM))
        self.elapsed = np.zeros(num_envs, dtype=int)
        self.ep_return = np.zeros(num_envs)

    def _start(self, n: int) -> np.ndarray:
        return self.rng.uniform(1.0, ROOM - 1.0, size=(n, OBS_DIM))

    def reset(self) -> np.ndarray:
        self.pos = self._start(self.num_envs)
        self.elapsed[:] = 0
        self.ep_return[:] = 0.0
        return self.pos.copy()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        action = np.clip(action, -1.0, 1.0)
        self.pos = np.clip(self.pos + SPEED * action, 0.0, ROOM)
        reward = -np.linalg.norm(self.pos - GOAL, axis=1)
        self.elapsed += 1
        self.ep_return += reward
        done = self.elapsed >= MAX_EPISODE_STEPS
        infos: list[dict] = [{} for _ in range(self.num_envs)]
        obs = self.pos.copy()
        for i in np.nonzero(done)[0]:
            infos[i]["episode"] = {"r": float(self.ep_return[i]), "l": int(self.elapsed[i])}
            infos[i]["bad_transition"] = True  # only the time limit ends an episode
            obs[i] = self.pos[i] = self._start(1)[0]
            self.elapsed[i], self.ep_return[i] = 0, 0.0
        return obs, reward, done, infos


def expert_action(pos: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    return np.clip(GOAL - pos + 0.1 * rng.randn(*pos.shape), -1.0, 1.0)


def expert_trajectories(seed: int) -> dict[str, torch.Tensor]:
    """What ``convert_to_pytorch.py`` writes: raw states, actions, rewards, lengths."""
    env = VecPointMass(EXPERT_EPISODES, seed + 10_000)
    rng = np.random.RandomState(seed + 20_000)
    obs = env.reset()
    states, actions, rewards = [], [], []
    for _ in range(MAX_EPISODE_STEPS):
        act = expert_action(obs, rng)
        states.append(obs.copy())
        actions.append(act)
        obs, rew, _, _ = env.step(act)
        rewards.append(rew)
    return {
        "states": torch.from_numpy(np.stack(states, 1)).float(),
        "actions": torch.from_numpy(np.stack(actions, 1)).float(),
        "rewards": torch.from_numpy(np.stack(rewards, 1)).float(),
        "lengths": torch.full((EXPERT_EPISODES,), MAX_EPISODE_STEPS, dtype=torch.long),
    }


class VecNormalize:
    """The repository's VecNormalize (stable-baselines3's, with ``_obfilt(obs, update)``,
    ``train`` / ``eval``) + VecPyTorch: float tensors out."""

    def __init__(self, venv: VecPointMass, gamma: float | None, clip_obs: float = 10.0, clip_reward: float = 10.0,
                 epsilon: float = 1e-8) -> None:  # fmt: skip
        self.venv, self.gamma, self.epsilon = venv, gamma, epsilon
        self.clip_obs, self.clip_reward = clip_obs, clip_reward
        self.obs_rms = RunningMeanStd((OBS_DIM,))
        self.ret_rms = RunningMeanStd(())
        self.ret = np.zeros(venv.num_envs)
        self.training = True

    def train(self) -> None:
        self.training = True

    def eval(self) -> None:
        self.training = False

    def _obfilt(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        if self.training and update:
            self.obs_rms.update(obs)
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon),
                       -self.clip_obs, self.clip_obs)  # fmt: skip

    def reset(self) -> torch.Tensor:
        self.ret = np.zeros(self.venv.num_envs)
        return torch.from_numpy(self._obfilt(self.venv.reset())).float()

    def step(self, action: torch.Tensor):
        obs, rews, news, infos = self.venv.step(action.cpu().numpy())
        self.ret = self.ret * (self.gamma or 0.0) + rews
        obs = self._obfilt(obs)
        if self.gamma is not None:
            self.ret_rms.update(self.ret)
            rews = np.clip(rews / np.sqrt(self.ret_rms.var + self.epsilon), -self.clip_reward, self.clip_reward)
        self.ret[news] = 0.0
        return torch.from_numpy(obs).float(), torch.from_numpy(rews).unsqueeze(1).float(), news, infos


def make_vec_envs(seed: int, num_processes: int, gamma: float | None) -> VecNormalize:
    return VecNormalize(VecPointMass(num_processes, seed), gamma)


# --------------------------------------------------------------------------- utils.py, distributions.py, model.py


def init(module: nn.Module, weight_init, bias_init, gain: float = 1.0) -> nn.Module:
    weight_init(module.weight.data, gain=gain)
    bias_init(module.bias.data)
    return module


class AddBias(nn.Module):
    def __init__(self, bias: torch.Tensor) -> None:
        super().__init__()
        self._bias = nn.Parameter(bias.unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._bias.t().view(1, -1)


class FixedNormal(torch.distributions.Normal):
    def log_probs(self, actions: torch.Tensor) -> torch.Tensor:
        return super().log_prob(actions).sum(-1, keepdim=True)

    def entropy(self) -> torch.Tensor:
        return super().entropy().sum(-1)

    def mode(self) -> torch.Tensor:
        return self.mean


class DiagGaussian(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int) -> None:
        super().__init__()
        self.fc_mean = init(nn.Linear(num_inputs, num_outputs), nn.init.orthogonal_, lambda x: nn.init.constant_(x, 0))
        self.logstd = AddBias(torch.zeros(num_outputs))

    def forward(self, x: torch.Tensor) -> FixedNormal:
        action_mean = self.fc_mean(x)
        action_logstd = self.logstd(torch.zeros(action_mean.size()))
        return FixedNormal(action_mean, action_logstd.exp())


class MLPBase(nn.Module):
    def __init__(self, num_inputs: int, hidden_size: int = 64) -> None:
        super().__init__()
        init_ = lambda m: init(m, nn.init.orthogonal_, lambda x: nn.init.constant_(x, 0), np.sqrt(2))  # noqa: E731
        self.actor = nn.Sequential(init_(nn.Linear(num_inputs, hidden_size)), nn.Tanh(),
                                   init_(nn.Linear(hidden_size, hidden_size)), nn.Tanh())  # fmt: skip
        self.critic = nn.Sequential(init_(nn.Linear(num_inputs, hidden_size)), nn.Tanh(),
                                    init_(nn.Linear(hidden_size, hidden_size)), nn.Tanh())  # fmt: skip
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
    def __init__(self, obs_shape: tuple[int, ...], action_dim: int) -> None:
        super().__init__()
        self.base = MLPBase(obs_shape[0])
        self.dist = DiagGaussian(self.base.output_size, action_dim)  # a Box action space

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
    def __init__(self, num_steps: int, num_processes: int, obs_shape: tuple[int, ...], action_dim: int,
                 recurrent_hidden_state_size: int) -> None:  # fmt: skip
        self.obs = torch.zeros(num_steps + 1, num_processes, *obs_shape)
        self.recurrent_hidden_states = torch.zeros(num_steps + 1, num_processes, recurrent_hidden_state_size)
        self.rewards = torch.zeros(num_steps, num_processes, 1)
        self.value_preds = torch.zeros(num_steps + 1, num_processes, 1)
        self.returns = torch.zeros(num_steps + 1, num_processes, 1)
        self.action_log_probs = torch.zeros(num_steps, num_processes, 1)
        self.actions = torch.zeros(num_steps, num_processes, action_dim)  # a Box space: float actions
        self.masks = torch.ones(num_steps + 1, num_processes, 1)
        self.bad_masks = torch.ones(num_steps + 1, num_processes, 1)
        self.num_steps, self.step = num_steps, 0

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
        assert use_gae and use_proper_time_limits  # the README's GAIL command
        self.value_preds[-1] = next_value
        gae = 0
        for step in reversed(range(self.rewards.size(0))):
            delta = (self.rewards[step] + gamma * self.value_preds[step + 1] * self.masks[step + 1]
                     - self.value_preds[step])  # fmt: skip
            gae = delta + gamma * gae_lambda * self.masks[step + 1] * gae
            gae = gae * self.bad_masks[step + 1]
            self.returns[step] = gae + self.value_preds[step]

    def feed_forward_generator(self, advantages, num_mini_batch=None, mini_batch_size=None):
        num_steps, num_processes = self.rewards.size()[0:2]
        batch_size = num_processes * num_steps
        if mini_batch_size is None:
            assert batch_size >= num_mini_batch
            mini_batch_size = batch_size // num_mini_batch
        sampler = BatchSampler(SubsetRandomSampler(range(batch_size)), mini_batch_size, drop_last=True)
        for indices in sampler:
            obs_batch = self.obs[:-1].view(-1, *self.obs.size()[2:])[indices]
            recurrent_hidden_states_batch = self.recurrent_hidden_states[:-1].view(
                -1, self.recurrent_hidden_states.size(-1))[indices]  # fmt: skip
            actions_batch = self.actions.view(-1, self.actions.size(-1))[indices]
            value_preds_batch = self.value_preds[:-1].view(-1, 1)[indices]
            return_batch = self.returns[:-1].view(-1, 1)[indices]
            masks_batch = self.masks[:-1].view(-1, 1)[indices]
            old_action_log_probs_batch = self.action_log_probs.view(-1, 1)[indices]
            adv_targ = None if advantages is None else advantages.view(-1, 1)[indices]
            yield (obs_batch, recurrent_hidden_states_batch, actions_batch, value_preds_batch, return_batch,
                   masks_batch, old_action_log_probs_batch, adv_targ)  # fmt: skip


# --------------------------------------------------------------------------- algo/ppo.py


class PPO:
    def __init__(self, actor_critic: Policy, clip_param: float, ppo_epoch: int, num_mini_batch: int,
                 value_loss_coef: float, entropy_coef: float, lr: float, eps: float, max_grad_norm: float,
                 use_clipped_value_loss: bool = True) -> None:  # fmt: skip
        self.actor_critic = actor_critic
        self.clip_param, self.ppo_epoch, self.num_mini_batch = clip_param, ppo_epoch, num_mini_batch
        self.value_loss_coef, self.entropy_coef = value_loss_coef, entropy_coef
        self.max_grad_norm, self.use_clipped_value_loss = max_grad_norm, use_clipped_value_loss
        self.optimizer = optim.Adam(actor_critic.parameters(), lr=lr, eps=eps)
        self.mon = None

    def update(self, rollouts: RolloutStorage, nx: Nndx) -> tuple[float, float, float]:
        advantages = rollouts.returns[:-1] - rollouts.value_preds[:-1]
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-5)
        value_loss_epoch = action_loss_epoch = dist_entropy_epoch = 0.0
        for _ in range(self.ppo_epoch):
            for sample in rollouts.feed_forward_generator(advantages, self.num_mini_batch):
                (obs_batch, recurrent_hidden_states_batch, actions_batch, value_preds_batch, return_batch,
                 masks_batch, old_action_log_probs_batch, adv_targ) = sample  # fmt: skip
                values, action_log_probs, dist_entropy, _ = self.actor_critic.evaluate_actions(
                    obs_batch, recurrent_hidden_states_batch, masks_batch, actions_batch)
                ratio = torch.exp(action_log_probs - old_action_log_probs_batch)
                surr1 = ratio * adv_targ
                surr2 = torch.clamp(ratio, 1.0 - self.clip_param, 1.0 + self.clip_param) * adv_targ
                action_loss = -torch.min(surr1, surr2).mean()
                if self.use_clipped_value_loss:
                    value_pred_clipped = value_preds_batch + (values - value_preds_batch).clamp(
                        -self.clip_param, self.clip_param)
                    value_losses = (values - return_batch).pow(2)
                    value_losses_clipped = (value_pred_clipped - return_batch).pow(2)
                    value_loss = 0.5 * torch.max(value_losses, value_losses_clipped).mean()
                else:
                    value_loss = 0.5 * (return_batch - values).pow(2).mean()
                self.optimizer.zero_grad()
                loss = value_loss * self.value_loss_coef + action_loss - dist_entropy * self.entropy_coef
                loss.backward()
                nn.utils.clip_grad_norm_(self.actor_critic.parameters(), self.max_grad_norm)
                self.optimizer.step()
                nx.timed(lambda: self.mon.log(loss))
                value_loss_epoch += value_loss.item()
                action_loss_epoch += action_loss.item()
                dist_entropy_epoch += dist_entropy.item()
        num_updates = self.ppo_epoch * self.num_mini_batch
        return value_loss_epoch / num_updates, action_loss_epoch / num_updates, dist_entropy_epoch / num_updates


# --------------------------------------------------------------------------- algo/gail.py


class Discriminator(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, variant: str) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Tanh(),
                                   nn.Linear(hidden_dim, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, 1))  # fmt: skip
        self.trunk.train()
        self.optimizer = torch.optim.Adam(self.trunk.parameters())
        self.returns = None
        self.ret_rms = RunningMeanStd(shape=())
        self.variant = variant
        self.mon = None

    def compute_grad_pen(self, expert_state, expert_action, policy_state, policy_action, lambda_: float = 10):
        alpha = torch.rand(expert_state.size(0), 1)
        expert_data = torch.cat([expert_state, expert_action], dim=1)
        policy_data = torch.cat([policy_state, policy_action], dim=1)
        alpha = alpha.expand_as(expert_data)
        mixup_data = alpha * expert_data + (1 - alpha) * policy_data
        mixup_data.requires_grad = True
        disc = self.trunk(mixup_data)
        ones = torch.ones(disc.size())
        grad = autograd.grad(outputs=disc, inputs=mixup_data, grad_outputs=ones, create_graph=True,
                             retain_graph=True, only_inputs=True)[0]  # fmt: skip
        return lambda_ * (grad.norm(2, dim=1) - 1).pow(2).mean()

    def expert_inputs(self, expert_state: torch.Tensor, obsfilt) -> torch.Tensor:
        """``update``'s expert states: through the env's filter (the bug: left raw)."""
        if self.variant == "expert_states_not_normalized":
            return expert_state
        return torch.FloatTensor(obsfilt(expert_state.numpy(), update=False))

    def labels(self, expert_d: torch.Tensor, policy_d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.variant == "discriminator_labels_swapped":
            return torch.zeros(expert_d.size()), torch.ones(policy_d.size())
        return torch.ones(expert_d.size()), torch.zeros(policy_d.size())

    def update(self, expert_loader, rollouts: RolloutStorage, obsfilt, nx: Nndx) -> float:
        self.train()
        policy_data_generator = rollouts.feed_forward_generator(None, mini_batch_size=expert_loader.batch_size)
        loss = 0.0
        n = 0
        for expert_batch, policy_batch in zip(expert_loader, policy_data_generator):
            policy_state, policy_action = policy_batch[0], policy_batch[2]
            policy_d = self.trunk(torch.cat([policy_state, policy_action], dim=1))
            expert_state, expert_action = expert_batch
            expert_state = self.expert_inputs(expert_state, obsfilt)
            expert_d = self.trunk(torch.cat([expert_state, expert_action], dim=1))
            expert_target, policy_target = self.labels(expert_d, policy_d)
            expert_loss = F.binary_cross_entropy_with_logits(expert_d, expert_target)
            policy_loss = F.binary_cross_entropy_with_logits(policy_d, policy_target)
            gail_loss = expert_loss + policy_loss
            grad_pen = self.compute_grad_pen(expert_state, expert_action, policy_state, policy_action)
            loss += (gail_loss + grad_pen).item()
            n += 1
            self.optimizer.zero_grad()
            total = gail_loss + grad_pen
            total.backward()
            self.optimizer.step()
            nx.timed(lambda: self.mon.log(total))
        return loss / n

    def predict_reward(self, state, action, gamma, masks, update_rms: bool = True) -> torch.Tensor:
        with torch.no_grad():
            self.eval()
            d = self.trunk(torch.cat([state, action], dim=1))
            s = torch.sigmoid(d)
            reward = s.log() - (1 - s).log()
            if self.returns is None:
                self.returns = reward.clone()
            if update_rms:
                self.returns = self.returns * masks * gamma + reward
                self.ret_rms.update(self.returns.cpu().numpy())
            return reward / np.sqrt(self.ret_rms.var + 1e-8)


class ExpertDataset(torch.utils.data.Dataset):
    def __init__(self, all_trajectories: dict[str, torch.Tensor], num_trajectories: int = 4,
                 subsample_frequency: int = 20) -> None:  # fmt: skip
        perm = torch.randperm(all_trajectories["states"].size(0))
        idx = perm[:num_trajectories]
        self.trajectories: dict[str, torch.Tensor] = {}
        start_idx = torch.randint(0, subsample_frequency, size=(num_trajectories,)).long()
        for k, v in all_trajectories.items():
            data = v[idx]
            if k != "lengths":
                samples = [data[i, start_idx[i] :: subsample_frequency] for i in range(num_trajectories)]
                self.trajectories[k] = torch.stack(samples)
            else:
                self.trajectories[k] = data // subsample_frequency
        self.length = int(self.trajectories["lengths"].sum().item())
        self.get_idx = []
        traj_idx, i = 0, 0
        for _ in range(self.length):
            while self.trajectories["lengths"][traj_idx].item() <= i:
                i -= self.trajectories["lengths"][traj_idx].item()
                traj_idx += 1
            self.get_idx.append((traj_idx, i))
            i += 1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        traj_idx, i = self.get_idx[i]
        return self.trajectories["states"][traj_idx][i], self.trajectories["actions"][traj_idx][i]


# --------------------------------------------------------------------------- evaluation.py, main.py


def update_linear_schedule(optimizer: optim.Optimizer, epoch: int, total_num_epochs: int, initial_lr: float) -> None:
    lr = initial_lr - (initial_lr * (epoch / float(total_num_epochs)))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


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


def probe_batch(discr: Discriminator, expert_dataset: ExpertDataset, rollouts: RolloutStorage, obsfilt):
    """64 expert and 64 policy pairs, as ``update`` builds and labels them."""
    states = torch.stack([expert_dataset[i][0] for i in range(PROBE)])
    actions = torch.stack([expert_dataset[i][1] for i in range(PROBE)])
    expert = torch.cat([discr.expert_inputs(states, obsfilt), actions], dim=1)
    policy = torch.cat([rollouts.obs[:PROBE, 0], rollouts.actions[:PROBE, 0]], dim=1)
    expert_target, policy_target = discr.labels(torch.zeros(PROBE, 1), torch.zeros(PROBE, 1))
    return torch.cat([expert, policy]).clone(), torch.cat([expert_target, policy_target])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    seed = 1 + seed  # arguments.py's default seed, plus the runner's offset
    torch.manual_seed(seed)
    envs = make_vec_envs(seed, NUM_PROCESSES, GAMMA)
    actor_critic = Policy((OBS_DIM,), ACT_DIM)
    agent = PPO(actor_critic, CLIP_PARAM, PPO_EPOCH, NUM_MINI_BATCH, VALUE_LOSS_COEF, ENTROPY_COEF, lr=LR, eps=EPS,
                max_grad_norm=MAX_GRAD_NORM)  # fmt: skip

    discr = Discriminator(OBS_DIM + ACT_DIM, 100, variant)
    expert_dataset = ExpertDataset(expert_trajectories(seed), num_trajectories=NUM_TRAJECTORIES,
                                   subsample_frequency=SUBSAMPLE_FREQUENCY)  # fmt: skip
    drop_last = len(expert_dataset) > GAIL_BATCH_SIZE
    gail_train_loader = torch.utils.data.DataLoader(dataset=expert_dataset, batch_size=GAIL_BATCH_SIZE, shuffle=True,
                                                    drop_last=drop_last)  # fmt: skip

    rollouts = RolloutStorage(NUM_STEPS, NUM_PROCESSES, (OBS_DIM,), ACT_DIM, actor_critic.recurrent_hidden_state_size)
    obs = envs.reset()
    rollouts.obs[0].copy_(obs)
    episode_rewards: deque[float] = deque(maxlen=10)
    first_probe = None

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

        if first_probe is None:  # the author's preflight, on the first policy data there is
            first_probe = probe_batch(discr, expert_dataset, rollouts, envs._obfilt)
            nx.preflight(discr.trunk, first_probe, F.binary_cross_entropy_with_logits, optimizer=discr.optimizer)
            discr.mon = nx.monitor(discr.trunk, discr.optimizer, every=10)
            agent.mon = nx.monitor(actor_critic, agent.optimizer, every=10)

        # --gail
        if j >= 10:
            envs.eval()  # envs.venv.eval(): the observation statistics frozen
        gail_epoch = GAIL_EPOCH if j >= GAIL_WARMUP_UPDATES else GAIL_WARMUP_EPOCH  # warm up
        for _ in range(gail_epoch):
            discr.update(gail_train_loader, rollouts, envs._obfilt, nx)
        for step in range(NUM_STEPS):
            rollouts.rewards[step] = discr.predict_reward(rollouts.obs[step], rollouts.actions[step], GAMMA,
                                                          rollouts.masks[step])  # fmt: skip

        rollouts.compute_returns(next_value, USE_GAE, GAMMA, GAE_LAMBDA, USE_PROPER_TIME_LIMITS)
        agent.update(rollouts, nx)
        rollouts.after_update()

    nx.finish(discr.mon, discr.trunk, first_probe, F.binary_cross_entropy_with_logits, optimizer=discr.optimizer)
    nx.finish(agent.mon)

    eval_return = evaluate(actor_critic, envs.obs_rms, seed, NUM_PROCESSES)
    expert_return = float(expert_trajectories(seed)["rewards"].sum(1).mean())
    return {
        "eval_return": eval_return,
        "late_train_return": float(np.mean(episode_rewards)) if episode_rewards else float("nan"),
        "expert_return": expert_return,
        "final_action_std": float(actor_critic.dist.logstd._bias.detach().exp().mean()),
    }
