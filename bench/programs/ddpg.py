"""Port of sfujim/TD3's ``DDPG.py`` (the DDPG of Lillicrap et al. as that repository
re-implements it: a deterministic ``max_action * tanh`` actor, a critic Q(s, a) that takes
the action at its second layer, a replay buffer, target networks with soft updates,
Gaussian exploration noise), trained by the repository's ``main.py`` with ``--policy DDPG``.

Source: github.com/sfujim/TD3, ``DDPG.py``, ``main.py`` and ``utils.py`` at commit
34770ccdcb51df6f6c7d85c1ba7e40d71b940d16 (MIT, Copyright (c) 2020 Scott Fujimoto).
Written anew from the facts of those files; no code copied. Gym/MuJoCo are not installed:
the environment (the data, not the program) is a small continuous-control task written in
numpy here, ``PointGoal``: a point in the square [-1, 1]^2 and a goal drawn uniformly in
[-0.8, 0.8]^2 (the state: position and goal, 4 numbers), moved by an action in [-1, 1]^2
(``max_action`` 1.0) scaled by 0.1 each step and clipped to the square, the reward minus
the distance to the goal after the move, terminal when it comes within 0.1 of the goal,
50 steps at most (``_max_episode_steps``); ``reset``/``step``/``action_space.sample()`` in
gym's old API, as ``main.py`` uses it.

Kept: ``Actor`` (``l1``, ``l2``, ``l3``: ReLU, ReLU, ``max_action * tanh``); ``Critic``
(``l1`` on the state, ReLU, ``l2`` on ``cat([q, action], 1)``, ReLU, ``l3``); ``DDPG``
with ``actor_target``/``critic_target`` deep copies, ``Adam(lr=1e-4)`` for the actor and
``Adam(weight_decay=1e-2)`` (lr 1e-3) for the critic, discount 0.99 and tau 0.005 (as
``main.py`` passes them); ``train`` (a sampled batch; ``target_Q = reward + (not_done *
discount * critic_target(next_state, actor_target(next_state))).detach()``;
``mse_loss(current_Q, target_Q)``, ``zero_grad``, ``backward``, ``step``; ``actor_loss =
-critic(state, actor(state)).mean()``, its step; then the Polyak updates of both targets);
``ReplayBuffer`` (numpy arrays, ``ptr``/``size``, ``not_done = 1 - done``,
``np.random.randint`` sampling, ``FloatTensor``s of shape ``(batch, 1)`` for reward and
not_done); ``main.py``'s loop (random actions for ``start_timesteps``, then
``select_action + N(0, max_action * expl_noise)`` clipped, ``done_bool`` 0 at the time
limit, ``policy.train`` every step once past ``start_timesteps``, reset on done,
``eval_policy`` of 10 episodes on an eval env seeded ``seed + 100`` every ``eval_freq``
steps and once before training); the seeds (``torch.manual_seed``, ``np.random.seed``,
the env's and the action space's).
Shrunk: hidden widths 64 and 64 instead of 400 and 300, ``batch_size`` 100 instead of
256, ``start_timesteps`` 1,000 instead of 25e3, ``max_timesteps`` 3,000 instead of 1e6,
``eval_freq`` 1,000 instead of 5e3; no result files or model saving.
Measure only (not in the program): the last ``eval_policy`` return (the program's own
evaluation), and the mean of the last 10 training episodes' returns.

nndx, as the author would add it: two networks with two optimizers, as in the TD3 port:
the critic's batch is the first sampled batch, inputs ``(state, action)`` and targets the
``target_Q`` computed for it, scored by the program's MSE; the preflight ``nndx.probe`` of
the critic runs at the first ``policy.train`` call (with its optimizer).
``nndx.Monitor(critic, critic_optimizer)`` and ``nndx.Monitor(actor, actor_optimizer)``
around the loop, every critic loss logged to the first and every actor loss to the
second. After training ``nndx.probe`` of the critic on its first batch with
``monitor=mon_critic`` and the actor's Monitor report (its loss runs through the critic,
so there is no target to probe it with); the findings the author reads are the two merged.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ddpg"
SOURCE = Source("sfujim/TD3", "DDPG.py", "34770ccdcb51df6f6c7d85c1ba7e40d71b940d16", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: widths 64/64, batch 100, 3,000 steps)"),
        Variant(
            "q_squeezed",
            "Critic.forward returns torch.squeeze(q, -1), as Spinning Up's MLPQFunction does, while the replay "
            "buffer keeps (batch, 1) rewards and not_done: the target broadcasts to (batch, batch) and "
            "mse_loss(current_Q, target_Q) (only a UserWarning) regresses every Q to the batch's mean reward plus "
            "its own bootstrap",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/openai/spinningup/issues/339",
             "https://github.com/thu-ml/tianshou/pull/155",
             "https://github.com/PacktPublishing/Deep-Reinforcement-Learning-Hands-On/issues/33"),
            Measure("final_eval", "last eval_policy return at least 3 below the healthy run's: -69.1 buggy "
                    "against -6.8 healthy on seed 0 (the untrained actor's: -56.7)",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
        Variant(
            "actor_optimizer_on_critic",
            "actor_optimizer = Adam(self.critic.parameters(), lr=1e-4): the actor's parameters are in no "
            "optimizer and never move, and the actor loss -Q(s, mu(s)) steps the critic towards larger Q",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/juliusfrost/dreamer-pytorch/pull/79",
             "https://github.com/Replicable-MARL/MARLlib/pull/161"),
            Measure("final_eval", "last eval_policy return at least 3 below the healthy run's: -56.7 buggy "
                    "(the untrained actor's, unchanged) against -6.8 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
    )
}

HIDDEN1, HIDDEN2, BATCH_SIZE, START_TIMESTEPS, MAX_TIMESTEPS, EVAL_FREQ = 64, 64, 100, 1000, 3000, 1000
EXPL_NOISE, DISCOUNT, TAU = 0.1, 0.99, 0.005


# --------------------------------------------------------------------------- the environment (the data)


class _Box:
    def __init__(self, low: float, high: float, shape: tuple[int, ...]) -> None:
        self.low, self.high, self.shape = np.full(shape, low), np.full(shape, high), shape
        self.rng = np.random.RandomState(0)

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def sample(self) -> np.ndarray:
        return self.rng.uniform(self.low, self.high)


class PointGoal:
    """Move a point to a goal (see the module docstring); gym's old reset/step API."""

    _max_episode_steps = 50

    def __init__(self) -> None:
        self.rng = np.random.RandomState(0)
        self.observation_space = _Box(-1.0, 1.0, (4,))
        self.action_space = _Box(-1.0, 1.0, (2,))
        self.pos, self.goal, self.t = np.zeros(2), np.zeros(2), 0

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.goal])

    def reset(self) -> np.ndarray:
        self.pos, self.goal, self.t = self.rng.uniform(-1.0, 1.0, 2), self.rng.uniform(-0.8, 0.8, 2), 0
        return self._obs()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        self.t += 1
        dist = float(np.linalg.norm(self.pos - self.goal))
        done = dist < 0.1 or self.t >= self._max_episode_steps
        return self._obs(), -dist, done, {}


# --------------------------------------------------------------------------- the program (DDPG.py, utils.py)


class Actor(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, max_action: float) -> None:
        super().__init__()
        self.l1 = nn.Linear(state_dim, HIDDEN1)
        self.l2 = nn.Linear(HIDDEN1, HIDDEN2)
        self.l3 = nn.Linear(HIDDEN2, action_dim)
        self.max_action = max_action

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.l1(state))
        a = F.relu(self.l2(a))
        return self.max_action * torch.tanh(self.l3(a))


class Critic(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, squeeze: bool = False) -> None:
        super().__init__()
        self.squeeze = squeeze
        self.l1 = nn.Linear(state_dim, HIDDEN1)
        self.l2 = nn.Linear(HIDDEN1 + action_dim, HIDDEN2)
        self.l3 = nn.Linear(HIDDEN2, 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        q = F.relu(self.l1(state))
        q = F.relu(self.l2(torch.cat([q, action], 1)))
        return torch.squeeze(self.l3(q), -1) if self.squeeze else self.l3(q)


class ReplayBuffer:
    def __init__(self, state_dim: int, action_dim: int, max_size: int = int(1e6)) -> None:
        self.max_size, self.ptr, self.size = max_size, 0, 0
        self.state = np.zeros((max_size, state_dim))
        self.action = np.zeros((max_size, action_dim))
        self.next_state = np.zeros((max_size, state_dim))
        self.reward = np.zeros((max_size, 1))
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


class DDPG:
    def __init__(self, state_dim: int, action_dim: int, max_action: float, nx: Nndx, variant: str,
                 discount: float = 0.99, tau: float = 0.001) -> None:  # fmt: skip
        self.actor = Actor(state_dim, action_dim, max_action)
        self.actor_target = copy.deepcopy(self.actor)
        self.critic = Critic(state_dim, action_dim, squeeze=variant == "q_squeezed")
        self.critic_target = copy.deepcopy(self.critic)
        if variant == "actor_optimizer_on_critic":
            self.actor_optimizer = torch.optim.Adam(self.critic.parameters(), lr=1e-4)
        else:
            self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=1e-4)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), weight_decay=1e-2)
        self.discount, self.tau = discount, tau
        self.nx = nx
        self.mon_critic = self.mon_actor = None
        self.probe_batch = None

    def select_action(self, state: np.ndarray) -> np.ndarray:
        state_t = torch.FloatTensor(state.reshape(1, -1))
        return self.actor(state_t).cpu().data.numpy().flatten()

    def train(self, replay_buffer: ReplayBuffer, batch_size: int = 64) -> None:
        state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)

        target_Q = self.critic_target(next_state, self.actor_target(next_state))  # noqa: N806
        target_Q = reward + (not_done * self.discount * target_Q).detach()  # noqa: N806

        if self.probe_batch is None:  # the author's preflight, on the first batch there is
            self.probe_batch = ((state, action), target_Q)
            self.nx.preflight(self.critic, self.probe_batch, F.mse_loss, optimizer=self.critic_optimizer)
            self.mon_critic = self.nx.monitor(self.critic, self.critic_optimizer, every=10)
            self.mon_actor = self.nx.monitor(self.actor, self.actor_optimizer, every=10)

        current_Q = self.critic(state, action)  # noqa: N806
        critic_loss = F.mse_loss(current_Q, target_Q)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        self.nx.timed(lambda: self.mon_critic.log(critic_loss))

        actor_loss = -self.critic(state, self.actor(state)).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        self.nx.timed(lambda: self.mon_actor.log(actor_loss))

        for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
            target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
        for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
            target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)


# --------------------------------------------------------------------------- main.py


def eval_policy(policy: DDPG, seed: int, eval_episodes: int = 10) -> float:
    eval_env = PointGoal()
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
    env = PointGoal()
    env.seed(seed)
    env.action_space.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    state_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    max_action = float(env.action_space.high[0])
    policy = DDPG(state_dim, action_dim, max_action, nx, variant, discount=DISCOUNT, tau=TAU)
    replay_buffer = ReplayBuffer(state_dim, action_dim)
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
        nx.finish(policy.mon_critic, policy.critic, policy.probe_batch, F.mse_loss, optimizer=policy.critic_optimizer)
        nx.finish(policy.mon_actor)
    late = episode_returns[-10:]
    return {
        "final_eval": float(evaluations[-1]),
        "initial_eval": float(evaluations[0]),
        "late_return": float(sum(late) / max(1, len(late))),
        "episodes": float(episode_num),
    }
