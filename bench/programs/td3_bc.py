"""Port of sfujim/TD3_BC (A Minimalist Approach to Offline Reinforcement Learning, Fujimoto & Gu
2021): TD3 trained on a fixed dataset, its actor loss ``-lambda * Q + (pi - a)^2`` with
``lambda = alpha / mean|Q|``, the states normalised by the dataset's mean and std.

Source: github.com/sfujim/TD3_BC, ``TD3_BC.py``, ``main.py`` and ``utils.py`` at commit
8791ad7d7656cb8396f1b3ac8c37f170b2a2dd5f (the repository's HEAD; MIT, Copyright (c) 2021
Scott Fujimoto). Written anew from the facts of those files; no code copied.
Gym, MuJoCo and D4RL are not installed: the environment and its offline dataset (the data,
not the program) are written in numpy here. ``PointMass``: a point with a velocity on the
plane, the state ``(x, y, vx, vy)``, the action a force in [-1, 1]^2 (``max_action`` 1.0),
``v <- 0.9 v + 0.1 a``, ``p <- clip(p + 0.1 v, -1.5, 1.5)``, the reward minus the distance to
the origin after the move, terminal within 0.05 of it, 50 steps at most, the start uniform in
[-1, 1]^2 at rest; gym's old ``reset``/``step``/``seed`` API as ``main.py`` uses it. The dataset,
of mixed quality in the manner of D4RL's medium-replay sets: 300 episodes, each driven by one
behaviour picked at random: a noisy PD controller to the origin, the same controller to a wrong
goal drawn in the square, or uniform random actions; ``qlearning_dataset``'s fields
``observations``, ``actions``, ``next_observations``, ``rewards`` (shape ``(N,)``) and
``terminals`` (time-limit ends are not terminals). ``get_normalized_score`` is D4RL's
``100 * (R - R_random) / (R_expert - R_random)`` with the random policy's and the noiseless PD
controller's returns over 100 episodes of a fixed seed as the reference returns.

Kept: ``Actor`` (``l1``-``l3``: ReLU, ReLU, ``max_action * tanh``); ``Critic`` with two Q heads
over ``cat([state, action], 1)`` (``l1``-``l3``, ``l4``-``l6``), ``forward`` returning
``(q1, q2)`` and ``Q1``; ``TD3_BC``: ``actor_target``/``critic_target`` deep copies,
``Adam(lr=3e-4)`` each, discount 0.99, tau 0.005, ``policy_noise`` 0.2 and ``noise_clip`` 0.5
times ``max_action``, ``policy_freq`` 2, ``alpha`` 2.5; ``train``: ``total_it += 1``, a sampled
batch, under ``no_grad`` the smoothed target action, the min of the target twins and ``reward +
not_done * discount * target_Q``, the twin ``mse_loss`` critic loss, ``zero_grad``/``backward``/
``step``; every ``policy_freq`` iterations ``pi = actor(state)``, ``Q = critic.Q1(state, pi)``,
``lmbda = alpha / Q.abs().mean().detach()``, ``actor_loss = -lmbda * Q.mean() + mse_loss(pi,
action)``, its step, then the Polyak updates of both targets; ``ReplayBuffer`` (``sample`` by
``np.random.randint``, ``FloatTensor``s; ``convert_D4RL`` with ``rewards.reshape(-1, 1)`` and
``not_done = 1 - terminals.reshape(-1, 1)``; ``normalize_states`` with ``eps=1e-3`` on states and
next states); ``main.py``: the seeds (env, action space, torch, numpy), ``normalize`` on, a
``policy.train`` per time step, ``eval_policy`` (10 episodes of an eval env seeded ``seed + 100``,
each state normalised with the dataset's mean and std, the D4RL score) every ``eval_freq``.
Shrunk: hidden width 64 instead of 256; 3,000 time steps instead of 1e6, ``eval_freq`` 1,000
instead of 5e3; ``batch_size`` 256 as published; no result files, no model saving.
Measure only (not in the program): the last and the mean of the three evaluations' D4RL
scores. Seed 0 (without nndx): healthy last score 81.1 (the noiseless PD controller is 100).

nndx, as the author would add it: two networks with two optimizers, as in a GAN: at the first
``policy.train`` call, on its sampled batch, a preflight ``nndx.probe`` of the critic (inputs
``(state, action)``, targets the ``target_Q`` computed for them, the program's twin MSE as a
function of ``(q1, q2)``) and of the actor (input the states, targets the dataset's actions,
the program's actor loss as a function of ``pi``, through the critic); then
``nndx.Monitor(critic, critic_optimizer)`` and ``nndx.Monitor(actor, actor_optimizer)``, every
critic loss logged to the first and every actor loss to the second. After training ``nndx.probe(..., monitor=...)``
of each on its first batch and ``nndx.diagnose``; the findings the author reads are the two
merged.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "td3_bc"
SOURCE = Source("sfujim/TD3_BC", "TD3_BC.py", "8791ad7d7656cb8396f1b3ac8c37f170b2a2dd5f", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: width 64, 3,000 steps, a generated dataset)"),
        Variant(
            "lambda_not_detached",
            "lmbda = alpha / Q.abs().mean() without .detach(): the Q term becomes alpha * Q.mean() / |Q|.mean(), "
            "which is the constant -alpha whenever every Q has one sign (here all rewards are negative), so its "
            "gradient is zero and the actor is trained by the behaviour-cloning term alone",
            (C.WRONG_LOSS,),
            ("https://github.com/sfujim/TD3_BC/issues/5",
             "https://github.com/google-deepmind/acme/issues/219"),
            Measure("final_score", "last D4RL score at least 10 below the healthy run's: 39.6/59.9/79.4 buggy "
                    "against 81.1/92.8/103.4 healthy on seeds 0-2",
                    lambda healthy, buggy: buggy < healthy - 10.0),
        ),
        Variant(
            "reward_not_reshaped",
            "convert_D4RL stores the rewards as the dataset gives them, shape (N,), without .reshape(-1, 1): the "
            "sampled reward (batch,) plus not_done * discount * target_Q (batch, 1) broadcasts to (batch, batch), "
            "and mse_loss broadcasts each Q against every reward of the batch",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/RLinf/RLinf/issues/1568",
             "https://github.com/RLinf/RLinf/pull/76",
             "https://github.com/kengz/SLM-Lab/pull/372"),
            Measure("final_score", "last D4RL score at least 10 below the healthy run's: 36.5/53.2/69.5 buggy "
                    "against 81.1/92.8/103.4 healthy on seeds 0-2",
                    lambda healthy, buggy: buggy < healthy - 10.0),
        ),
    )
}

HIDDEN, BATCH_SIZE, MAX_TIMESTEPS, EVAL_FREQ = 64, 256, 3000, 1000
DISCOUNT, TAU, POLICY_NOISE, NOISE_CLIP, POLICY_FREQ, ALPHA = 0.99, 0.005, 0.2, 0.5, 2, 2.5
DATASET_EPISODES = 300


# --------------------------------------------------------------------------- the environment and its dataset


class _Box:
    def __init__(self, low: float, high: float, shape: tuple[int, ...]) -> None:
        self.low, self.high, self.shape = np.full(shape, low), np.full(shape, high), shape
        self.rng = np.random.RandomState(0)

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def sample(self) -> np.ndarray:
        return self.rng.uniform(self.low, self.high)


class PointMass:
    """A point with a velocity pushed to the origin (see the module docstring)."""

    _max_episode_steps = 50

    def __init__(self) -> None:
        self.rng = np.random.RandomState(0)
        self.observation_space = _Box(-np.inf, np.inf, (4,))
        self.action_space = _Box(-1.0, 1.0, (2,))
        self.pos, self.vel, self.t = np.zeros(2), np.zeros(2), 0

    def seed(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.vel])

    def reset(self) -> np.ndarray:
        self.pos, self.vel, self.t = self.rng.uniform(-1.0, 1.0, size=2), np.zeros(2), 0
        return self._obs()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -1.0, 1.0)
        self.vel = 0.9 * self.vel + 0.1 * a
        self.pos = np.clip(self.pos + 0.1 * self.vel, -1.5, 1.5)
        self.t += 1
        dist = float(np.linalg.norm(self.pos))
        terminal = dist < 0.05
        return self._obs(), -dist, terminal or self.t >= self._max_episode_steps, {"terminal": terminal}


def _pd(obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    return np.clip(-2.0 * (obs[:2] - goal) - 4.0 * obs[2:], -1.0, 1.0)


def _episode_return(env: PointMass, act) -> float:
    obs, done, total = env.reset(), False, 0.0
    while not done:
        obs, reward, done, _ = env.step(act(obs))
        total += reward
    return total


_REF: dict[str, float] = {}


def get_normalized_score(avg_return: float) -> float:
    """D4RL's normalised score against this environment's random and expert reference returns."""
    if not _REF:
        env = PointMass()
        env.seed(12345)
        rng = np.random.RandomState(12345)
        _REF["random"] = float(np.mean([_episode_return(env, lambda o: rng.uniform(-1, 1, 2)) for _ in range(100)]))
        _REF["expert"] = float(np.mean([_episode_return(env, lambda o: _pd(o, np.zeros(2))) for _ in range(100)]))
    return (avg_return - _REF["random"]) / (_REF["expert"] - _REF["random"])


def qlearning_dataset(seed: int) -> dict[str, np.ndarray]:
    """The offline dataset: mixed-quality behaviour (see the module docstring)."""
    env, rng = PointMass(), np.random.RandomState(1000 + seed)
    env.seed(2000 + seed)
    fields: dict[str, list] = {k: [] for k in ("observations", "actions", "next_observations", "rewards", "terminals")}
    for _ in range(DATASET_EPISODES):
        kind = rng.randint(3)
        goal = np.zeros(2) if kind == 0 else rng.uniform(-1.0, 1.0, size=2)
        obs, done = env.reset(), False
        while not done:
            if kind == 2:
                action = rng.uniform(-1.0, 1.0, size=2)
            else:
                action = np.clip(_pd(obs, goal) + rng.normal(0.0, 0.3, size=2), -1.0, 1.0)
            next_obs, reward, done, info = env.step(action)
            for key, value in zip(fields, (obs, action, next_obs, reward, float(info["terminal"]))):
                fields[key].append(value)
            obs = next_obs
    return {k: np.asarray(v, dtype=np.float64) for k, v in fields.items()}


# --------------------------------------------------------------------------- the program (TD3_BC.py, utils.py)


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
        q1 = F.relu(self.l1(sa))
        q1 = F.relu(self.l2(q1))
        q1 = self.l3(q1)
        q2 = F.relu(self.l4(sa))
        q2 = F.relu(self.l5(q2))
        q2 = self.l6(q2)
        return q1, q2

    def Q1(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # noqa: N802 - the source's name
        sa = torch.cat([state, action], 1)
        q1 = F.relu(self.l1(sa))
        q1 = F.relu(self.l2(q1))
        return self.l3(q1)


def critic_loss_fn(output: tuple[torch.Tensor, torch.Tensor], target_Q: torch.Tensor) -> torch.Tensor:  # noqa: N803
    """The program's critic loss as a function of the critic's (q1, q2) and the TD target."""
    current_Q1, current_Q2 = output  # noqa: N806
    return F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)


class ReplayBuffer:
    def __init__(self, state_dim: int, action_dim: int, max_size: int = int(1e6)) -> None:
        self.max_size, self.ptr, self.size = max_size, 0, 0
        self.state = np.zeros((0, state_dim))
        self.action = np.zeros((0, action_dim))
        self.next_state = np.zeros((0, state_dim))
        self.reward = np.zeros((0, 1))
        self.not_done = np.zeros((0, 1))

    def sample(self, batch_size: int):
        ind = np.random.randint(0, self.size, size=batch_size)
        return (torch.FloatTensor(self.state[ind]), torch.FloatTensor(self.action[ind]),
                torch.FloatTensor(self.next_state[ind]), torch.FloatTensor(self.reward[ind]),
                torch.FloatTensor(self.not_done[ind]))  # fmt: skip

    def convert_D4RL(self, dataset: dict[str, np.ndarray], reshape_reward: bool = True) -> None:  # noqa: N802
        self.state = dataset["observations"]
        self.action = dataset["actions"]
        self.next_state = dataset["next_observations"]
        self.reward = dataset["rewards"].reshape(-1, 1) if reshape_reward else dataset["rewards"]
        self.not_done = 1.0 - dataset["terminals"].reshape(-1, 1)
        self.size = self.state.shape[0]

    def normalize_states(self, eps: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
        mean = self.state.mean(0, keepdims=True)
        std = self.state.std(0, keepdims=True) + eps
        self.state = (self.state - mean) / std
        self.next_state = (self.next_state - mean) / std
        return mean, std


class TD3_BC:  # noqa: N801 - the source's name
    def __init__(self, state_dim: int, action_dim: int, max_action: float, nx: Nndx, variant: str,
                 discount: float = 0.99, tau: float = 0.005, policy_noise: float = 0.2, noise_clip: float = 0.5,
                 policy_freq: int = 2, alpha: float = 2.5) -> None:  # fmt: skip
        self.actor = Actor(state_dim, action_dim, max_action)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=3e-4)
        self.critic = Critic(state_dim, action_dim)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=3e-4)
        self.max_action, self.discount, self.tau = max_action, discount, tau
        self.policy_noise, self.noise_clip, self.policy_freq, self.alpha = policy_noise, noise_clip, policy_freq, alpha
        self.total_it = 0
        self.nx, self.variant = nx, variant
        self.mon_critic = self.mon_actor = None
        self.critic_batch = self.actor_batch = None

    def select_action(self, state: np.ndarray) -> np.ndarray:
        state_t = torch.FloatTensor(state.reshape(1, -1))
        return self.actor(state_t).cpu().data.numpy().flatten()

    def actor_loss(self, pi: torch.Tensor, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        Q = self.critic.Q1(state, pi)  # noqa: N806
        if self.variant == "lambda_not_detached":
            lmbda = self.alpha / Q.abs().mean()
        else:
            lmbda = self.alpha / Q.abs().mean().detach()
        return -lmbda * Q.mean() + F.mse_loss(pi, action)

    def actor_loss_fn(self, pi: torch.Tensor, target: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The program's actor loss as a function of the actor's output, for nndx: the batch's
        (states, dataset actions) as its target."""
        state, action = target
        return self.actor_loss(pi, state, action)

    def train(self, replay_buffer: ReplayBuffer, batch_size: int = 256) -> None:
        self.total_it += 1
        state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)
        with torch.no_grad():
            noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
            next_action = (self.actor_target(next_state) + noise).clamp(-self.max_action, self.max_action)
            target_Q1, target_Q2 = self.critic_target(next_state, next_action)  # noqa: N806
            target_Q = torch.min(target_Q1, target_Q2)  # noqa: N806
            target_Q = reward + not_done * self.discount * target_Q  # noqa: N806

        if self.critic_batch is None:  # the author's preflight, on the first batch there is
            self.critic_batch = ((state, action), target_Q)
            self.actor_batch = (state, (state, action))
            self.nx.preflight(self.critic, self.critic_batch, critic_loss_fn, optimizer=self.critic_optimizer)
            self.nx.preflight(self.actor, self.actor_batch, self.actor_loss_fn, optimizer=self.actor_optimizer)
            self.mon_critic = self.nx.monitor(self.critic, self.critic_optimizer, every=10)
            self.mon_actor = self.nx.monitor(self.actor, self.actor_optimizer, every=10)

        current_Q1, current_Q2 = self.critic(state, action)  # noqa: N806
        critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        self.nx.timed(lambda: self.mon_critic.log(critic_loss))

        if self.total_it % self.policy_freq == 0:
            pi = self.actor(state)
            actor_loss = self.actor_loss(pi, state, action)
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            self.nx.timed(lambda: self.mon_actor.log(actor_loss))
            for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
            for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)


# --------------------------------------------------------------------------- main.py


def eval_policy(policy: TD3_BC, seed: int, mean: np.ndarray, std: np.ndarray, seed_offset: int = 100,
                eval_episodes: int = 10) -> float:  # fmt: skip
    eval_env = PointMass()
    eval_env.seed(seed + seed_offset)
    avg_reward = 0.0
    for _ in range(eval_episodes):
        state, done = eval_env.reset(), False
        while not done:
            state = (np.array(state).reshape(1, -1) - mean) / std
            action = policy.select_action(state)
            state, reward, done, _ = eval_env.step(action)
            avg_reward += reward
    avg_reward /= eval_episodes
    return get_normalized_score(avg_reward) * 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    env = PointMass()
    env.seed(seed)
    env.action_space.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    state_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    max_action = float(env.action_space.high[0])
    policy = TD3_BC(state_dim, action_dim, max_action, nx, variant, discount=DISCOUNT, tau=TAU,
                    policy_noise=POLICY_NOISE * max_action, noise_clip=NOISE_CLIP * max_action,
                    policy_freq=POLICY_FREQ, alpha=ALPHA)  # fmt: skip

    replay_buffer = ReplayBuffer(state_dim, action_dim)
    replay_buffer.convert_D4RL(qlearning_dataset(seed), reshape_reward=variant != "reward_not_reshaped")
    mean, std = replay_buffer.normalize_states()

    evaluations: list[float] = []
    for t in range(MAX_TIMESTEPS):
        policy.train(replay_buffer, BATCH_SIZE)
        if (t + 1) % EVAL_FREQ == 0:
            evaluations.append(eval_policy(policy, seed, mean, std))

    if policy.mon_critic is not None:
        nx.finish(policy.mon_critic, policy.critic, policy.critic_batch, critic_loss_fn,
                  optimizer=policy.critic_optimizer)  # fmt: skip
        nx.finish(policy.mon_actor, policy.actor, policy.actor_batch, policy.actor_loss_fn,
                  optimizer=policy.actor_optimizer)  # fmt: skip
    return {
        "final_score": float(evaluations[-1]),
        "mean_score": float(np.mean(evaluations)),
        "dataset_size": float(replay_buffer.size),
    }
