"""Port of CleanRL's ``sac_continuous_action.py``: Soft Actor-Critic with a tanh-squashed
Gaussian actor, twin soft Q networks and their Polyak-averaged targets, and automatic
entropy tuning.

Source: github.com/vwxyzjn/cleanrl, ``cleanrl/sac_continuous_action.py`` at commit
fe8d8a03c41a7ef5b523e2e354bd01c363e786bb (the file last changed in
004f8a086a892a2a180f4dd332b90d83a968aa7a), with the ``ReplayBuffer`` of
``cleanrl_utils/buffers.py`` at the same commit (MIT, Copyright (c) 2019 CleanRL
developers). Written anew from the facts of those files; no code copied. Gymnasium/MuJoCo
are not installed: the environment (the data, not the program) is a small goal-reaching
task written in numpy here, ``PointGoal``: the observation is a point's position and a goal
in [-1, 1]^2 (4 numbers), the action a move in [-2, 2]^2 (a Box whose bounds are not
+-1, so ``action_scale`` 2 and ``action_bias`` 0 are exercised) scaled by 0.05 per step,
the reward minus the distance to the goal after the move, ``terminated`` within 0.05 of
the goal, ``truncated`` after 50 steps, position and goal drawn uniformly at each reset;
wrapped as gymnasium's ``SyncVectorEnv`` with one env (same-step autoreset,
``final_observation``/``final_info`` in the infos) and ``RecordEpisodeStatistics`` (the
episode's return ``r`` and length ``l``).

Kept: ``Args`` (gamma 0.99, tau 0.005, policy_lr 3e-4, q_lr 1e-3, policy_frequency 2,
target_network_frequency 1, alpha 0.2, autotune on); ``SoftQNetwork`` (``fc1`` over
``cat([x, a], 1)``, ReLU, ``fc2``, ReLU, ``fc3`` to one value); ``Actor`` (``fc1``, ``fc2``
with ReLU, ``fc_mean`` and ``fc_logstd``; the log-std through ``tanh`` and rescaled into
[LOG_STD_MIN, LOG_STD_MAX] = [-5, 2]; ``action_scale``/``action_bias`` buffers from the
action space's bounds; ``get_action``: ``Normal(mean, std).rsample()``, ``tanh``, scaled
and shifted, the log-prob with the tanh correction ``log(action_scale * (1 - y^2) + 1e-6)``
summed over the action dimensions with ``keepdim=True``, and the squashed mean);
``qf1``/``qf2`` and their targets loaded from them; one ``Adam`` over both Q networks'
parameters, one over the actor's; ``target_entropy = -prod(action_shape)``, ``log_alpha``
zeros(1) with ``requires_grad`` and its own ``Adam(lr=q_lr)``; the seeding (``random``,
``numpy``, ``torch``, the action space, ``envs.reset(seed=...)``); the loop: random actions
until ``learning_starts``, then ``actor.get_action``; ``real_next_obs`` taken from
``final_observation`` on truncation; ``rb.add(obs, real_next_obs, actions, rewards,
terminations, infos)`` with ``handle_timeout_termination=False``; past ``learning_starts``
every step: a sampled batch, under ``no_grad`` the next actions and log-probs of the
actor, ``min`` of the target Q's minus ``alpha * next_state_log_pi``,
``rewards.flatten() + (1 - dones.flatten()) * gamma * (...).view(-1)``;
``qf1(obs, actions).view(-1)`` and ``qf2``'s, ``mse_loss`` each, their sum, one step; every
``policy_frequency`` steps, ``policy_frequency`` actor updates (``((alpha * log_pi) -
min(qf1_pi, qf2_pi)).mean()``) each followed by the alpha update (``log_pi`` under
``no_grad``, ``(-log_alpha.exp() * (log_pi + target_entropy)).mean()``, ``alpha =
log_alpha.exp().item()``); the Polyak updates of both targets every
``target_network_frequency`` steps; the episodic returns as printed.
Shrunk: hidden width 64 instead of 256, ``batch_size`` 64 instead of 256, ``buffer_size``
the run's length instead of 1e6, ``learning_starts`` 300 instead of 5e3,
``total_timesteps`` 2,000 instead of 1e6; no TensorBoard writer, W&B or video (the
every-100-steps scalars are kept in a list).
Measure only (not in the program): the mean return of 10 evaluation episodes (env seeded
``seed + 100``) acting with ``get_action``'s squashed mean, after training, and the mean of
the last 10 training episodes' returns (what the program prints).

nndx, as the author would add it: as in the TD3 port, the preflight ``nndx.probe`` runs at
the first update, on its batch: ``qf1`` with inputs ``(observations, actions)``, the
target ``next_q_value`` computed for them, the program's own Q loss as a function of one
Q network's output (``mse_loss(q.view(-1), target)``), and ``q_optimizer``. Two
``nndx.Monitor``s around the loop: ``{"qf1", "qf2"}`` with ``q_optimizer`` and
``F.mse_loss`` wrapped (``qf1_loss``/``qf2_loss`` computed through ``mon_q.loss_fn``),
``qf_loss`` logged; the actor with ``actor_optimizer``, each ``actor_loss`` logged
(``log_alpha`` is no module: its optimizer is not watched). After training each
Monitor's report is diagnosed (the critics are two modules, so there is no one model to
probe them with, as with the CycleGAN port's generators); the author reads them ranked
together.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sac"
SOURCE = Source("vwxyzjn/cleanrl", "cleanrl/sac_continuous_action.py", "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb",
                "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: width 64, batch 64, 2,000 steps)"),
        Variant(
            "q_values_not_flattened",
            "qf1(data.observations, data.actions) and qf2(...) without .view(-1): the (batch, 1) Q values are "
            "regressed on the (batch,) next_q_value, mse_loss broadcasts them to (batch, batch) (a UserWarning, no "
            "error) and every Q value is pulled to the batch's mean target",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/vwxyzjn/cleanrl/issues/379", "https://github.com/thu-ml/tianshou/issues/43",
             "https://github.com/BY571/Soft-Actor-Critic-and-Extensions/issues/4",
             "https://github.com/sunwuzhou03/reinforcement-learning-lab/issues/1"),
            Measure("eval_return", "evaluation return of the squashed mean at least 5 below the healthy run's: "
                    "-56.6 against -16.8 healthy on seed 0 (a random policy scores about -56)",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "actor_q_detached",
            "actor_loss = ((alpha * log_pi) - min_qf_pi.detach()).mean() (the fix offered for an in-place autograd "
            "error): no gradient of the soft Q values reaches the actor, which only follows the entropy term",
            (C.DETACHED_GRAPH,),
            ("https://github.com/TianhongDai/reinforcement-learning-algorithms/issues/8",
             "https://github.com/kashif/firedup/issues/9", "https://github.com/ray-project/ray/pull/47179"),
            Measure("eval_return", "evaluation return of the squashed mean at least 5 below the healthy run's: "
                    "-56.8 against -16.8 healthy on seed 0 (the policy stays at chance)",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
    )
}

ARGS = {"total_timesteps": 2000, "buffer_size": 2000, "gamma": 0.99, "tau": 0.005, "batch_size": 64,
        "learning_starts": 300, "policy_lr": 3e-4, "q_lr": 1e-3, "policy_frequency": 2,
        "target_network_frequency": 1, "alpha": 0.2, "autotune": True}  # fmt: skip
HIDDEN = 64
LOG_STD_MAX = 2
LOG_STD_MIN = -5


# --------------------------------------------------------------------------- the environment (the data)


class Box:
    """gymnasium.spaces.Box, as much of it as the program uses."""

    def __init__(self, low: float, high: float, shape: tuple[int, ...], dtype=np.float32) -> None:
        self.low, self.high = np.full(shape, low, dtype=dtype), np.full(shape, high, dtype=dtype)
        self.shape, self.dtype = shape, dtype
        self.rng = np.random.RandomState()

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def sample(self) -> np.ndarray:
        return self.rng.uniform(self.low, self.high).astype(self.dtype)


class PointGoal:
    """Move a point to a goal (see the module docstring); gymnasium's reset/step API."""

    max_episode_steps = 50

    def __init__(self) -> None:
        self.observation_space = Box(-np.inf, np.inf, (4,))
        self.action_space = Box(-2.0, 2.0, (2,))
        self.rng = np.random.RandomState()
        self.pos, self.goal, self.t = np.zeros(2), np.zeros(2), 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.goal]).astype(np.float32)

    def reset(self, seed: int | None = None):
        if seed is not None:
            self.rng = np.random.RandomState(seed)
        self.pos, self.goal, self.t = self.rng.uniform(-1, 1, 2), self.rng.uniform(-1, 1, 2), 0
        return self._obs(), {}

    def step(self, action: np.ndarray):
        a = np.clip(action, self.action_space.low, self.action_space.high)
        self.pos = np.clip(self.pos + 0.05 * a, -1.0, 1.0)
        self.t += 1
        dist = float(np.linalg.norm(self.pos - self.goal))
        return self._obs(), -dist, dist < 0.05, self.t >= self.max_episode_steps, {}


class SyncVectorEnv:
    """gymnasium.vector.SyncVectorEnv over ``RecordEpisodeStatistics``-wrapped envs
    (gymnasium 0.29's same-step autoreset: the returned observation is the new episode's,
    the last one is in ``infos["final_observation"]``, the statistics in ``final_info``)."""

    def __init__(self, env_fns) -> None:
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self._returns = np.zeros(self.num_envs)
        self._lengths = np.zeros(self.num_envs, dtype=int)

    def reset(self, seed: int | None = None):
        obs = [env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(self.envs)]
        self._returns[:], self._lengths[:] = 0.0, 0
        return np.stack(obs), {}

    def step(self, actions: np.ndarray):
        obs, rewards, terms, truncs = [], [], [], []
        infos: dict = {}
        for i, env in enumerate(self.envs):
            o, r, term, trunc, _ = env.step(actions[i])
            self._returns[i] += r
            self._lengths[i] += 1
            if term or trunc:
                infos.setdefault("final_observation", np.array([None] * self.num_envs, dtype=object))
                infos.setdefault("final_info", np.array([None] * self.num_envs, dtype=object))
                infos["final_observation"][i] = o
                infos["final_info"][i] = {"episode": {"r": np.array([self._returns[i]]),
                                                      "l": np.array([self._lengths[i]])}}  # fmt: skip
                self._returns[i], self._lengths[i] = 0.0, 0
                o, _ = env.reset()
            obs.append(o)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
        return np.stack(obs), np.array(rewards), np.array(terms), np.array(truncs), infos

    def close(self) -> None:
        pass


def make_env(seed: int, idx: int):
    def thunk():
        env = PointGoal()
        env.action_space.seed(seed)
        return env

    return thunk


# --------------------------------------------------------------------------- cleanrl_utils/buffers.py


class ReplayBufferSamples:
    def __init__(self, observations, actions, next_observations, dones, rewards) -> None:
        self.observations, self.actions, self.next_observations = observations, actions, next_observations
        self.dones, self.rewards = dones, rewards


class ReplayBuffer:
    """The one-env case of the buffer: arrays of (buffer_size, n_envs, ...), sampled uniformly,
    ``dones`` and ``rewards`` returned as (batch, 1)."""

    def __init__(self, buffer_size: int, observation_space: Box, action_space: Box, n_envs: int = 1) -> None:
        self.buffer_size, self.n_envs, self.pos, self.full = buffer_size, n_envs, 0, False
        self.observations = np.zeros((buffer_size, n_envs, *observation_space.shape), dtype=np.float32)
        self.next_observations = np.zeros((buffer_size, n_envs, *observation_space.shape), dtype=np.float32)
        self.actions = np.zeros((buffer_size, n_envs, *action_space.shape), dtype=np.float32)
        self.rewards = np.zeros((buffer_size, n_envs), dtype=np.float32)
        self.dones = np.zeros((buffer_size, n_envs), dtype=np.float32)

    def add(self, obs, next_obs, action, reward, done, infos) -> None:
        self.observations[self.pos] = np.array(obs)
        self.next_observations[self.pos] = np.array(next_obs)
        self.actions[self.pos] = np.array(action)
        self.rewards[self.pos] = np.array(reward)
        self.dones[self.pos] = np.array(done)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full, self.pos = True, 0

    def sample(self, batch_size: int) -> ReplayBufferSamples:
        upper = self.buffer_size if self.full else self.pos
        batch_inds = np.random.randint(0, upper, size=batch_size)
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        t = torch.as_tensor
        return ReplayBufferSamples(
            t(self.observations[batch_inds, env_indices, :]), t(self.actions[batch_inds, env_indices, :]),
            t(self.next_observations[batch_inds, env_indices, :]),
            t(self.dones[batch_inds, env_indices].reshape(-1, 1)), t(self.rewards[batch_inds, env_indices].reshape(-1, 1)),
        )  # fmt: skip


# --------------------------------------------------------------------------- the agent


class SoftQNetwork(nn.Module):
    def __init__(self, env: SyncVectorEnv) -> None:
        super().__init__()
        n_in = int(np.prod(env.single_observation_space.shape) + np.prod(env.single_action_space.shape))
        self.fc1 = nn.Linear(n_in, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, env: SyncVectorEnv) -> None:
        super().__init__()
        n_obs, n_act = int(np.prod(env.single_observation_space.shape)), int(np.prod(env.single_action_space.shape))
        self.fc1 = nn.Linear(n_obs, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.fc_mean = nn.Linear(HIDDEN, n_act)
        self.fc_logstd = nn.Linear(HIDDEN, n_act)
        space = env.single_action_space
        self.register_buffer("action_scale", torch.tensor((space.high - space.low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((space.high + space.low) / 2.0, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # From SpinUp / Denis Yarats
        return mean, log_std

    def get_action(self, x: torch.Tensor):
        mean, log_std = self(x)
        std = log_std.exp()
        normal = torch.distributions.Normal(mean, std)
        x_t = normal.rsample()  # the reparameterization trick
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = normal.log_prob(x_t)
        log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)  # enforcing the action bound
        log_prob = log_prob.sum(1, keepdim=True)
        mean = torch.tanh(mean) * self.action_scale + self.action_bias
        return action, log_prob, mean


def evaluate(actor: Actor, seed: int, episodes: int = 10) -> float:
    """Measure only: the squashed mean's return on ``episodes`` fresh episodes."""
    env = PointGoal()
    total = 0.0
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + 100 + k)
        done = False
        while not done:
            with torch.no_grad():
                _, _, action = actor.get_action(torch.as_tensor(obs[None]))
            obs, reward, term, trunc, _ = env.step(action[0].numpy())
            total += reward
            done = term or trunc
    return total / episodes


# --------------------------------------------------------------------------- the script's main


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    envs = SyncVectorEnv([make_env(seed + i, i) for i in range(1)])
    assert isinstance(envs.single_action_space, Box), "only continuous action space is supported"

    actor = Actor(envs)
    qf1, qf2 = SoftQNetwork(envs), SoftQNetwork(envs)
    qf1_target, qf2_target = SoftQNetwork(envs), SoftQNetwork(envs)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args["q_lr"])
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args["policy_lr"])

    if args["autotune"]:
        target_entropy = -torch.prod(torch.Tensor(envs.single_action_space.shape)).item()
        log_alpha = torch.zeros(1, requires_grad=True)
        alpha = log_alpha.exp().item()
        a_optimizer = optim.Adam([log_alpha], lr=args["q_lr"])
    else:
        alpha = args["alpha"]

    rb = ReplayBuffer(args["buffer_size"], envs.single_observation_space, envs.single_action_space, n_envs=1)

    flatten = variant != "q_values_not_flattened"

    def q_loss_fn(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The program's Q loss as a function of one Q network's output and next_q_value."""
        return F.mse_loss(q.view(-1) if flatten else q, target)

    mon_q = mon_actor = None
    returns: list[float] = []
    scalars: list[dict[str, float]] = []
    obs, _ = envs.reset(seed=seed)
    for global_step in range(args["total_timesteps"]):
        if global_step < args["learning_starts"]:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            actions, _, _ = actor.get_action(torch.Tensor(obs))
            actions = actions.detach().cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        if "final_info" in infos:
            for info in infos["final_info"]:
                if info is not None:
                    returns.append(float(info["episode"]["r"][0]))  # print(f"global_step=..., episodic_return=...")
                    break

        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_observation"][idx]
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        obs = next_obs

        if global_step > args["learning_starts"]:
            data = rb.sample(args["batch_size"])
            with torch.no_grad():
                next_state_actions, next_state_log_pi, _ = actor.get_action(data.next_observations)
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                qf2_next_target = qf2_target(data.next_observations, next_state_actions)
                min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
                next_q_value = (data.rewards.flatten()
                                + (1 - data.dones.flatten()) * args["gamma"] * (min_qf_next_target).view(-1))  # fmt: skip

            if mon_q is None:  # the author's preflight, on the first batch there is
                probe_batch = ((data.observations, data.actions), next_q_value)
                nx.preflight(qf1, probe_batch, q_loss_fn, optimizer=q_optimizer)
                mon_q = nx.monitor({"qf1": qf1, "qf2": qf2}, q_optimizer, every=10, loss_fn=F.mse_loss)
                mon_actor = nx.monitor(actor, actor_optimizer, every=10)

            qf1_a_values = qf1(data.observations, data.actions)
            qf2_a_values = qf2(data.observations, data.actions)
            if flatten:
                qf1_a_values, qf2_a_values = qf1_a_values.view(-1), qf2_a_values.view(-1)
            qf1_loss = mon_q.loss_fn(qf1_a_values, next_q_value)
            qf2_loss = mon_q.loss_fn(qf2_a_values, next_q_value)
            qf_loss = qf1_loss + qf2_loss

            q_optimizer.zero_grad()
            qf_loss.backward()
            q_optimizer.step()
            nx.timed(lambda: mon_q.log(qf_loss))

            if global_step % args["policy_frequency"] == 0:  # TD3 delayed update support
                for _ in range(args["policy_frequency"]):  # compensate for the delay
                    pi, log_pi, _ = actor.get_action(data.observations)
                    qf1_pi = qf1(data.observations, pi)
                    qf2_pi = qf2(data.observations, pi)
                    min_qf_pi = torch.min(qf1_pi, qf2_pi)
                    if variant == "actor_q_detached":
                        min_qf_pi = min_qf_pi.detach()
                    actor_loss = ((alpha * log_pi) - min_qf_pi).mean()

                    actor_optimizer.zero_grad()
                    actor_loss.backward()
                    actor_optimizer.step()
                    nx.timed(lambda: mon_actor.log(actor_loss))

                    if args["autotune"]:
                        with torch.no_grad():
                            _, log_pi, _ = actor.get_action(data.observations)
                        alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()

                        a_optimizer.zero_grad()
                        alpha_loss.backward()
                        a_optimizer.step()
                        alpha = log_alpha.exp().item()

            if global_step % args["target_network_frequency"] == 0:
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args["tau"] * param.data + (1 - args["tau"]) * target_param.data)
                for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                    target_param.data.copy_(args["tau"] * param.data + (1 - args["tau"]) * target_param.data)

            if global_step % 100 == 0:  # the writer's scalars
                scalars.append({"qf1_values": qf1_a_values.mean().item(), "qf_loss": qf_loss.item() / 2.0,
                                "actor_loss": actor_loss.item(), "alpha": alpha})  # fmt: skip

    envs.close()
    if mon_q is not None:
        nx.finish(mon_q)
        nx.finish(mon_actor)
    late = returns[-10:]
    return {
        "eval_return": float(evaluate(actor, seed)),
        "late_return": float(sum(late) / max(1, len(late))),
        "episodes": float(len(returns)),
        "final_alpha": float(alpha),
        "final_q": float(scalars[-1]["qf1_values"]) if scalars else float("nan"),
    }
