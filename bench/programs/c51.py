"""Port of vwxyzjn/cleanrl ``cleanrl/c51.py`` (categorical DQN on CartPole: a return
distribution over 101 fixed atoms per action, the distributional Bellman target projected
onto the atoms, cross-entropy against the predicted distribution of the taken action).

Source: github.com/vwxyzjn/cleanrl, ``cleanrl/c51.py`` at commit
fe8d8a03c41a7ef5b523e2e354bd01c363e786bb (MIT, Copyright (c) 2019 CleanRL developers);
the replay buffer is the one it imports (``cleanrl_utils.buffers.ReplayBuffer``:
stable-baselines3's, uniform sampling with replacement, ``handle_timeout_termination=
False``). Written anew from the facts of that file; no code copied. Gymnasium is not
installed: the environment (the data, not the program) is the hand-written CartPole of
:mod:`bench.programs.dqn` (the equations of gym's ``cartpole.py``), whose episodes are
truncated at 200 steps; gymnasium's vector-env autoreset is written out (on termination
the next observation is the reset one, on truncation the final observation is stored),
and ``RecordEpisodeStatistics``' episodic return is kept as a list.

Kept: ``Args``' values except those shrunk below (n_atoms 101, v_min -100, v_max 100,
buffer_size 10000, gamma 0.99, target_network_frequency 500, batch_size 128, start_e 1,
end_e 0.05, exploration_fraction 0.5, num_envs 1); ``QNetwork`` (``atoms`` buffer
``linspace(v_min, v_max, n_atoms)``; ``network`` = ``Linear(4, 120)``, ReLU,
``Linear(120, 84)``, ReLU, ``Linear(84, n * n_atoms)``; ``get_action``: the logits viewed
``(len(x), n, n_atoms)``, softmax over the atoms, ``q_values = (pmfs * atoms).sum(2)``,
argmax when no action is given, the chosen action's pmf); ``linear_schedule``; seeding
(``random``, ``np.random``, ``torch``); ``Adam(lr, eps=0.01 / batch_size)``; the target
network loaded from the Q network; the loop (epsilon-greedy with ``random.random()`` and
the action space's sample, the step, the buffer add, ``obs = next_obs``; past
``learning_starts`` every ``train_frequency`` steps: under ``no_grad`` the target's next
pmfs, ``next_atoms = rewards + gamma * atoms * (1 - dones)``, the projection (``tz``
clamped, ``b``, ``l = floor``, ``u = ceil`` both clamped, ``d_m_l = (u + (l == u) - b) *
next_pmfs``, ``d_m_u = (b - l) * next_pmfs``, a per-sample ``index_add_`` loop), then
``old_pmfs`` of the taken actions, ``loss = mean(-(target_pmfs * log(old_pmfs.clamp(1e-5,
1 - 1e-5))).sum(-1))``, ``zero_grad``, ``backward``, ``step``; the hard target copy every
``target_network_frequency`` steps).
Shrunk: total_timesteps 8,000 instead of 500,000, learning_starts 500 instead of
10,000, train_frequency 4 instead of 10, batch_size 64 instead of 128, learning_rate
1e-3 instead of 2.5e-4 (a shrunk run at the source's rate and frequency had not learnt
to balance; at these settings the last 20 episodes average 177-198 of 200 on seeds
0-2, about 10 CPU seconds a run), no TensorBoard writer, wandb or model saving. Measure only (not in the program): the mean episodic return of
the last 20 training episodes, and 10 evaluation episodes at epsilon ``end_e`` (what
``cleanrl_utils.evals.c51_eval`` does after a saved run).

nndx, as the author would add it: ``QNetwork`` has no ``forward`` (the program calls
``get_action``), so the module given to nndx is ``q_network.network``, the part that
maps observations to logits (it holds every parameter the optimizer trains; the atoms
are a buffer); the loss is the program's, written as a function of those logits and
``(actions, target_pmfs)`` through the same pmf computation ``get_action`` uses. The
preflight ``nndx.probe`` runs at the first training step, on its sampled batch, with the
optimizer; ``nndx.Monitor(q_network.network, optimizer)`` around the loop, every loss
logged; after training ``nndx.probe`` on that first batch with ``monitor=mon`` and
``nndx.diagnose``. There is no validation, so nothing is logged as ``split="val"``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn, optim

from bench.programs.dqn import CartPole
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "c51"
SOURCE = Source("vwxyzjn/cleanrl", "cleanrl/c51.py", "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8,000 steps, batch 64, LR 1e-3)"),
        Variant(
            "softmax_over_actions",
            "torch.softmax(logits.view(len(x), n, n_atoms), dim=1): the softmax runs over the actions instead "
            "of the atoms, so each action's 'distribution' does not sum to 1 over the atoms",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/ray-project/ray/issues/15137",
             "https://github.com/BindsNET/bindsnet/issues/577",
             "https://github.com/facebookresearch/ReAgent/pull/256"),
            Measure("late_return", "mean return of the last 20 episodes at most half the healthy run's: "
                    "21.2/9.8/9.6 buggy on seeds 0-2 against 177.5/194.8/197.6 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
        Variant(
            "lr_too_high",
            "learning_rate 1.0 instead of 1e-3 (1000x; Adam with eps = 0.01 / batch_size): the updates overshoot",
            (C.LR_TOO_HIGH,),
            ("https://github.com/muupan/dqn-in-the-caffe/issues/6",
             "https://github.com/facebookresearch/ReAgent/issues/189",
             "https://github.com/PacktPublishing/Tensorflow-2-Reinforcement-Learning-Cookbook/issues/12"),
            Measure("late_return", "mean return of the last 20 episodes at most half the healthy run's: "
                    "9.8/9.6/9.7 buggy on seeds 0-2 against 177.5/194.8/197.6 healthy (at 1e-1, 100x, only "
                    "112.8/70.3 on seeds 0/1: not reliably half)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
    )
}

TOTAL_TIMESTEPS, LEARNING_RATE, N_ATOMS, V_MIN, V_MAX = 8000, 1e-3, 101, -100.0, 100.0
BUFFER_SIZE, GAMMA, TARGET_NETWORK_FREQUENCY, BATCH_SIZE = 10000, 0.99, 500, 64
START_E, END_E, EXPLORATION_FRACTION, LEARNING_STARTS, TRAIN_FREQUENCY = 1.0, 0.05, 0.5, 500, 4


class QNetwork(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, n_atoms: int = 101, v_min: float = -100, v_max: float = 100,
                 softmax_dim: int = 2) -> None:  # fmt: skip
        super().__init__()
        self.n_atoms = n_atoms
        self.register_buffer("atoms", torch.linspace(v_min, v_max, steps=n_atoms))
        self.n = n_actions
        self.network = nn.Sequential(
            nn.Linear(n_obs, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, self.n * n_atoms),
        )
        self.softmax_dim = softmax_dim

    def pmfs_of(self, logits: torch.Tensor) -> torch.Tensor:
        """The probability mass function of each action over the atoms (get_action's first lines)."""
        return torch.softmax(logits.view(len(logits), self.n, self.n_atoms), dim=self.softmax_dim)

    def get_action(self, x: torch.Tensor, action: torch.Tensor | None = None):
        pmfs = self.pmfs_of(self.network(x))
        q_values = (pmfs * self.atoms).sum(2)
        if action is None:
            action = torch.argmax(q_values, 1)
        return action, pmfs[torch.arange(len(x)), action]


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


class ReplayBuffer:
    """stable-baselines3's ReplayBuffer as c51.py uses it (one env, no timeout handling)."""

    def __init__(self, buffer_size: int, obs_dim: int) -> None:
        self.buffer_size, self.pos, self.full = buffer_size, 0, False
        self.observations = np.zeros((buffer_size, obs_dim), dtype=np.float32)
        self.next_observations = np.zeros((buffer_size, obs_dim), dtype=np.float32)
        self.actions = np.zeros((buffer_size, 1), dtype=np.int64)
        self.rewards = np.zeros((buffer_size, 1), dtype=np.float32)
        self.dones = np.zeros((buffer_size, 1), dtype=np.float32)

    def add(self, obs, next_obs, action, reward, done) -> None:
        self.observations[self.pos] = obs
        self.next_observations[self.pos] = next_obs
        self.actions[self.pos] = action
        self.rewards[self.pos] = reward
        self.dones[self.pos] = done
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full, self.pos = True, 0

    def sample(self, batch_size: int):
        upper = self.buffer_size if self.full else self.pos
        ind = np.random.randint(0, upper, size=batch_size)
        return (torch.as_tensor(self.observations[ind]), torch.as_tensor(self.actions[ind]),
                torch.as_tensor(self.next_observations[ind]), torch.as_tensor(self.dones[ind]),
                torch.as_tensor(self.rewards[ind]))  # fmt: skip


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    seed = seed + 1  # Args.seed is 1; the runner's seed is an offset
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env = CartPole(seed)
    action_rng = np.random.RandomState(seed)  # envs.single_action_space.seed(seed)
    n_obs, n_actions = 4, 2
    softmax_dim = 1 if variant == "softmax_over_actions" else 2
    learning_rate = 1.0 if variant == "lr_too_high" else LEARNING_RATE

    q_network = QNetwork(n_obs, n_actions, N_ATOMS, V_MIN, V_MAX, softmax_dim)
    optimizer = optim.Adam(q_network.parameters(), lr=learning_rate, eps=0.01 / BATCH_SIZE)
    target_network = QNetwork(n_obs, n_actions, N_ATOMS, V_MIN, V_MAX, softmax_dim)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(BUFFER_SIZE, n_obs)

    def c51_loss(logits: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The program's loss as a function of the network's logits and (actions, target_pmfs)."""
        actions, target_pmfs = targets
        old_pmfs = q_network.pmfs_of(logits)[torch.arange(len(logits)), actions]
        return (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()

    probe_batch = None
    mon = None
    losses: list[float] = []
    episodic_returns: list[float] = []
    episode_return = 0.0

    obs = np.array(env.reset(), dtype=np.float32)
    for global_step in range(TOTAL_TIMESTEPS):
        epsilon = linear_schedule(START_E, END_E, EXPLORATION_FRACTION * TOTAL_TIMESTEPS, global_step)
        if random.random() < epsilon:
            action = int(action_rng.randint(n_actions))
        else:
            with torch.no_grad():  # (the source builds a graph here and drops it)
                action = int(q_network.get_action(torch.Tensor(obs).unsqueeze(0))[0])

        observation, reward, termination, truncation = env.step(action)
        episode_return += reward
        next_obs = np.array(observation, dtype=np.float32)
        real_next_obs = next_obs.copy()
        if termination or truncation:  # the vector env's autoreset; the final observation kept on truncation
            episodic_returns.append(episode_return)
            episode_return = 0.0
            next_obs = np.array(env.reset(), dtype=np.float32)
            if termination:
                real_next_obs = next_obs.copy()
        rb.add(obs, real_next_obs, action, reward, float(termination))
        obs = next_obs

        if global_step > LEARNING_STARTS:
            if global_step % TRAIN_FREQUENCY == 0:
                observations, actions, next_observations, dones, rewards = rb.sample(BATCH_SIZE)
                with torch.no_grad():
                    _, next_pmfs = target_network.get_action(next_observations)
                    next_atoms = rewards + GAMMA * target_network.atoms * (1 - dones)
                    delta_z = target_network.atoms[1] - target_network.atoms[0]
                    tz = next_atoms.clamp(V_MIN, V_MAX)
                    b = (tz - V_MIN) / delta_z
                    lower = b.floor().clamp(0, N_ATOMS - 1)
                    upper = b.ceil().clamp(0, N_ATOMS - 1)
                    d_m_l = (upper + (lower == upper).float() - b) * next_pmfs
                    d_m_u = (b - lower) * next_pmfs
                    target_pmfs = torch.zeros_like(next_pmfs)
                    for i in range(target_pmfs.size(0)):
                        target_pmfs[i].index_add_(0, lower[i].long(), d_m_l[i])
                        target_pmfs[i].index_add_(0, upper[i].long(), d_m_u[i])

                if probe_batch is None:  # the author's preflight, on the first batch there is
                    probe_batch = (observations, (actions.flatten(), target_pmfs))
                    nx.preflight(q_network.network, probe_batch, c51_loss, optimizer=optimizer)
                    mon = nx.monitor(q_network.network, optimizer, every=10)

                _, old_pmfs = q_network.get_action(observations, actions.flatten())
                loss = (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()
                losses.append(loss.item())

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                nx.timed(lambda: mon.log(loss))

            if global_step % TARGET_NETWORK_FREQUENCY == 0:
                target_network.load_state_dict(q_network.state_dict())

    if mon is not None:
        nx.finish(mon, q_network.network, probe_batch, c51_loss, optimizer=optimizer)

    # measure only: c51_eval's episodes at epsilon end_e
    eval_env, eval_rng = CartPole(seed + 2000), random.Random(seed + 2000)
    eval_returns = []
    with torch.no_grad():
        for _ in range(10):
            o, ret, done = eval_env.reset(), 0.0, False
            while not done:
                if eval_rng.random() < END_E:
                    a = eval_rng.randrange(n_actions)
                else:
                    a = int(q_network.get_action(torch.tensor([o], dtype=torch.float32))[0])
                o, r, term, trunc = eval_env.step(a)
                ret, done = ret + r, term or trunc
            eval_returns.append(ret)
    late = episodic_returns[-20:]
    return {
        "late_return": float(sum(late) / max(1, len(late))),
        "eval_return": float(sum(eval_returns) / len(eval_returns)),
        "late_loss": float(sum(losses[-100:]) / max(1, len(losses[-100:]))),
        "episodes": float(len(episodic_returns)),
    }
