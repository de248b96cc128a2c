"""Port of sfujim/TD3 (Twin Delayed DDPG: a deterministic tanh actor, twin Q critics trained
on the clipped double-Q target, target policy smoothing, delayed actor and target updates).

Source: github.com/sfujim/TD3, ``TD3.py``, ``main.py`` and ``utils.py`` at commit
34770ccdcb51df6f6c7d85c1ba7e40d71b940d16 (MIT, Copyright (c) 2020 Scott Fujimoto).
Written anew from the facts of those files; no code copied. Gym/MuJoCo are not installed:
the environment (the data, not the program) is a small continuous-control task written
in numpy here, ``PointReach``: a point in the square [-1, 1]^2 (the state, 2 numbers)
moved by an action in [-1, 1]^2 (``max_action`` 1.0) scaled by 0.1 each step, the
reward minus its distance to the origin after the move, terminal when it comes within
0.05 of the origin, 50 steps at most (``_max_episode_steps``), the start uniform in the
square; ``reset``/``step``/``action_space.sample()`` in gym's old API, as ``main.py`` uses it.

Kept: ``Actor`` (``l1``, ``l2``, ``l3``: ReLU, ReLU, ``max_action * tanh``); ``Critic``
with two Q heads over ``cat([state, action], 1)`` (``l1``-``l3``, ``l4``-``l6``),
``forward`` returning ``(q1, q2)`` and ``Q1``; ``TD3`` with ``actor_target`` and
``critic_target`` deep copies, ``Adam(lr=3e-4)`` for each, discount 0.99, tau 0.005,
``policy_noise`` 0.2 and ``noise_clip`` 0.5 (times ``max_action``, as ``main.py`` passes
them), ``policy_freq`` 2; ``train`` (``total_it += 1``; a sampled batch; under
``no_grad`` the target action ``actor_target(next_state) + clamp(randn * policy_noise,
-noise_clip, noise_clip)`` clamped to the action range, ``min`` of the target twins,
``reward + not_done * discount * target_Q``; ``mse_loss(current_Q1, target_Q) +
mse_loss(current_Q2, target_Q)``, ``zero_grad``, ``backward``, ``step``; every
``policy_freq`` iterations ``actor_loss = -critic.Q1(state, actor(state)).mean()``, its
step, then the Polyak updates of both targets); ``ReplayBuffer`` (numpy arrays, ``ptr``
and ``size``, ``not_done = 1 - done``, ``np.random.randint`` sampling, ``FloatTensor``s of
shape ``(batch, 1)`` for reward and not_done); ``main.py``'s loop (random actions for
``start_timesteps``, then ``select_action + N(0, max_action * expl_noise)`` clipped,
``done_bool`` 0 at the time limit, ``policy.train`` every step once past
``start_timesteps``, reset on done, ``eval_policy`` of 10 episodes on an eval env seeded
``seed + 100`` every ``eval_freq`` steps and once before training); the seeds
(``torch.manual_seed``, ``np.random.seed``, the env's and the action space's).
Shrunk: hidden width 64 instead of 256, ``batch_size`` 100 instead of 256,
``start_timesteps`` 1,000 instead of 25e3, ``max_timesteps`` 3,000 instead of 1e6,
``eval_freq`` 1,000 instead of 5e3; no result files or model saving.
Measure only (not in the program): the last ``eval_policy`` return (the program's own
evaluation), and the mean of the last 10 training episodes' returns.

nndx, as the author would add it: two networks with two optimizers, as in a GAN port:
the critic's batch is the first sampled batch, inputs ``(state, action)`` and targets
the ``target_Q`` computed for it, scored by the program's twin MSE as a function of the
critic's ``(q1, q2)``; the preflight ``nndx.probe`` of the critic runs at the first
``policy.train`` call (with its optimizer). ``nndx.Monitor(critic, critic_optimizer)``
and ``nndx.Monitor(actor, actor_optimizer)`` around the loop, every critic loss logged to
the first and every actor loss to the second. After training ``nndx.probe`` of the critic
on its first batch with ``monitor=mon_critic`` and the actor's Monitor report (its loss
runs through the critic, so there is no target to probe it with); the findings the
author reads are the two merged.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "td3"
SOURCE = Source("sfujim/TD3", "TD3.py", "34770ccdcb51df6f6c7d85c1ba7e40d71b940d16", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: width 64, batch 100, 3,000 steps)"),
        Variant(
            "reward_not_reshaped",
            "the replay buffer returns the rewards with shape (batch,) instead of (batch, 1): reward + "
            "not_done * discount * target_Q broadcasts to (batch, batch) and each Q regresses to the batch's "
            "mean reward plus its own bootstrap",
            (C.SHAPE_BROADCAST,),
            ("https://spinningup.openai.com/en/latest/spinningup/exercise2_2_soln.html",
             "https://github.com/thu-ml/tianshou/pull/159",
             "https://github.com/tensorflow/agents/issues/854"),
            Measure("final_eval", "last eval_policy return at least 5 below the healthy run's: -32.8/-42.6/-27.3 "
                    "buggy against -3.0/-6.6/-1.7 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "actor_loss_on_buffer_actions",
            "actor_loss = -critic.Q1(state, action).mean() with the replay buffer's actions instead of "
            "actor(state): the actor is not in the loss's graph, its parameters get no gradient and never move",
            (C.DETACHED_GRAPH,),
            ("https://github.com/floodsung/DDPG/issues/14",
             "https://github.com/backgom2357/Recommender_system_via_deep_RL/issues/14",
             "https://github.com/thu-ml/tianshou/issues/1268"),
            Measure("final_eval", "last eval_policy return at least 5 below the healthy run's: -51.6/-40.1/-35.6 "
                    "buggy (the untrained actor's) against -3.0/-6.6/-1.7 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
    )
}

HIDDEN, BATCH_SIZE, START_TIMESTEPS, MAX_TIMESTEPS, EVAL_FREQ = 64, 100, 1000, 3000, 1000
EXPL_NOISE, DISCOUNT, TAU, POLICY_NOISE, NOISE_CLIP, POLICY_FREQ = 0.1, 0.99, 0.005, 0.2, 0.5, 2


# --------------------------------------------------------------------------- the environment (the data)


class _Box:
    def __init__(self, low: float, high: float, shape: tuple[int, ...], rng: np.random.RandomState) -> None:
        self.low, self.high, self.shape = np.full(shape, low), np.full(shape, high), shape
        self.rng = rng

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def sample(self) -> np.ndarray:
        return self.rng.uniform(self.low, self.high)


class PointReach:
    """Move a point to the origin (see the module docstring); gym's old reset/step API."""

    _max_episode_steps = 50

    def __init__(self) -> None:
        self.rng = np.random.RandomState(0)
        self.observation_space = _Box(-1.0, 1.0, (2,), np.random.RandomState(0))
        self.action_space = _Box(-1.0, 1.0, (2,), np.random.RandomState(0))
        self.pos = np.zeros(2)
        self.t = 0

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def reset(self) -> np.ndarray:
        self.pos, self.t = self.rng.uniform(-1.0, 1.0, size=2), 0
        return self.pos.copy()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        self.t += 1
        dist = float(np.linalg.norm(self.pos))
        done = dist < 0.05 or self.t >= self._max_episode_steps
        return self.pos.copy(), -dist, done, {}


# --------------------------------------------------------------------------- the program (TD3.py, utils.py)


class Actor(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, max_action: float) -> None:
        super().__init__()
        self.l1 = nn.Linear(state_dim, HIDDEN)
        self.l2 = nn.Linear(HIDDEN, HIDDEN)
        self.l3 = nn.Linear(HIDDEN, action_dim)
        self.max_action = max_action

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.l1(state))
        a = F.relu(self.l2(a))
        return self.max_action * torch.tanh(self.l3(a))


class Critic(nn.Module):
    def __init__(self, state_dim: int, action_dim: int) -> None:
        super().__init__()
        self.l1 = nn.Linear(state_dim + action_dim, HIDDEN)
        self.l2 = nn.Linear(HIDDEN, HIDDEN)
        self.l3 = nn.Linear(HIDDEN, 1)
        self.l4 = nn.Linear(state_dim + action_dim, HIDDEN)
        self.l5 = nn.Linear(HIDDEN, HIDDEN)
        self.l6 = nn.Linear(HIDDEN, 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sa = torch.cat([state, action], 1)
        q1 = self.l3(F.relu(self.l2(F.relu(self.l1(sa)))))
        q2 = self.l6(F.relu(self.l5(F.relu(self.l4(sa)))))
        return q1, q2

    def Q1(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # noqa: N802 - the source's name
        sa = torch.cat([state, action], 1)
        return self.l3(F.relu(self.l2(F.relu(self.l1(sa)))))


def critic_loss_fn(output: tuple[torch.Tensor, torch.Tensor], target_Q: torch.Tensor) -> torch.Tensor:  # noqa: N803
    """The program's critic loss as a function of the critic's (q1, q2) and the TD target."""
    current_Q1, current_Q2 = output  # noqa: N806
    return F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)


class ReplayBuffer:
    def __init__(self, state_dim: int, action_dim: int, max_size: int = int(1e6), flat_reward: bool = False) -> None:
        self.max_size, self.ptr, self.size = max_size, 0, 0
        self.state = np.zeros((max_size, state_dim))
        self.action = np.zeros((max_size, action_dim))
        self.next_state = np.zeros((max_size, state_dim))
        self.reward = np.zeros(max_size) if flat_reward else np.zeros((max_size, 1))
        self.not_done = np.zeros((max_size, 1))

    def add(self, state, action, next_state, reward, done) -> None:
        self.state[self.ptr] = state
        self.action[self.ptr] = action
        self.next_state[self.ptr] = next_state
        self.reward[self.ptr] = reward
        self.not_done[self.ptr] = 1.0 - done
        self.ptr = (self.ptr + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def sample(self, batch_size: int):
        ind = np.random.randint(0, self.size, size=batch_size)
        return (torch.FloatTensor(self.state[ind]), torch.FloatTensor(self.action[ind]),
                torch.FloatTensor(self.next_state[ind]), torch.FloatTensor(self.reward[ind]),
                torch.FloatTensor(self.not_done[ind]))  # fmt: skip


class TD3:
    def __init__(self, state_dim: int, action_dim: int, max_action: float, nx: Nndx, variant: str,
                 discount: float = 0.99, tau: float = 0.005, policy_noise: float = 0.2, noise_clip: float = 0.5,
                 policy_freq: int = 2) -> None:  # fmt: skip
        self.actor = Actor(state_dim, action_dim, max_action)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=3e-4)
        self.critic = Critic(state_dim, action_dim)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=3e-4)
        self.max_action, self.discount, self.tau = max_action, discount, tau
        self.policy_noise, self.noise_clip, self.policy_freq = policy_noise, noise_clip, policy_freq
        self.total_it = 0
        self.nx, self.variant = nx, variant
        self.mon_critic = self.mon_actor = None
        self.probe_batch = None

    def select_action(self, state: np.ndarray) -> np.ndarray:
        state_t = torch.FloatTensor(state.reshape(1, -1))
        return self.actor(state_t).cpu().data.numpy().flatten()

    def train(self, replay_buffer: ReplayBuffer, batch_size: int = 256) -> None:
        self.total_it += 1
        state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)
        with torch.no_grad():
            noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
            next_action = (self.actor_target(next_state) + noise).clamp(-self.max_action, self.max_action)
            target_Q1, target_Q2 = self.critic_target(next_state, next_action)  # noqa: N806
            target_Q = torch.min(target_Q1, target_Q2)  # noqa: N806
            target_Q = reward + not_done * self.discount * target_Q  # noqa: N806

        if self.probe_batch is None:  # the author's preflight, on the first batch there is
            self.probe_batch = ((state, action), target_Q)
            self.nx.preflight(self.critic, self.probe_batch, critic_loss_fn, optimizer=self.critic_optimizer)
            self.mon_critic = self.nx.monitor(self.critic, self.critic_optimizer, every=10)
            self.mon_actor = self.nx.monitor(self.actor, self.actor_optimizer, every=10)

        current_Q1, current_Q2 = self.critic(state, action)  # noqa: N806
        critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        self.nx.timed(lambda: self.mon_critic.log(critic_loss))

        if self.total_it % self.policy_freq == 0:
            if self.variant == "actor_loss_on_buffer_actions":
                actor_loss = -self.critic.Q1(state, action).mean()
            else:
                actor_loss = -self.critic.Q1(state, self.actor(state)).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            self.nx.timed(lambda: self.mon_actor.log(actor_loss))
            for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
            for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)


# --------------------------------------------------------------------------- main.py


def eval_policy(policy: TD3, seed: int, eval_episodes: int = 10) -> float:
    eval_env = PointReach()
    eval_env.seed(seed + 100)
    avg_reward = 0.0
    for _ in range(eval_episodes):
        state, done = eval_env.reset(), False
        while not done:
            action = policy.select_action(np.array(state))
            state, reward, done, _ = eval_env.step(action)
            avg_reward += reward
    return avg_reward / eval_episodes


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    env = PointReach()
    env.seed(seed)
    env.action_space.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    state_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    max_action = float(env.action_space.high[0])
    policy = TD3(state_dim, action_dim, max_action, nx, variant, discount=DISCOUNT, tau=TAU,
                 policy_noise=POLICY_NOISE * max_action, noise_clip=NOISE_CLIP * max_action,
                 policy_freq=POLICY_FREQ)  # fmt: skip
    replay_buffer = ReplayBuffer(state_dim, action_dim, flat_reward=variant == "reward_not_reshaped")
    evaluations = [eval_policy(policy, seed)]

    state, done = env.reset(), False
    episode_reward, episode_timesteps, episode_num = 0.0, 0, 0
    episode_returns: list[float] = []
    for t in range(MAX_TIMESTEPS):
        episode_timesteps += 1
        if t < START_TIMESTEPS:
            action = env.action_space.sample()
        else:
            action = (policy.select_action(np.array(state))
                      + np.random.normal(0, max_action * EXPL_NOISE, size=action_dim)).clip(-max_action, max_action)
        next_state, reward, done, _ = env.step(action)
        done_bool = float(done) if episode_timesteps < env._max_episode_steps else 0
        replay_buffer.add(state, action, next_state, reward, done_bool)
        state = next_state
        episode_reward += reward
        if t >= START_TIMESTEPS:
            policy.train(replay_buffer, BATCH_SIZE)
        if done:
            episode_returns.append(episode_reward)
            state, done = env.reset(), False
            episode_reward, episode_timesteps, episode_num = 0.0, 0, episode_num + 1
        if (t + 1) % EVAL_FREQ == 0:
            evaluations.append(eval_policy(policy, seed))

    if policy.mon_critic is not None:
        nx.finish(policy.mon_critic, policy.critic, policy.probe_batch, critic_loss_fn,
                  optimizer=policy.critic_optimizer)  # fmt: skip
        nx.finish(policy.mon_actor)
    late = episode_returns[-10:]
    return {
        "final_eval": float(evaluations[-1]),
        "initial_eval": float(evaluations[0]),
        "late_return": float(sum(late) / max(1, len(late))),
        "episodes": float(episode_num),
    }
