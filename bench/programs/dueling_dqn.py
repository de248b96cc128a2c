"""Port of higgsfield/RL-Adventure's dueling DQN with the double-DQN target (CartPole: a shared
trunk, value and advantage streams, a hard target copy every 100 frames, replay, Adam).

Source: github.com/higgsfield/RL-Adventure, ``3.dueling dqn.ipynb`` (the ``DuelingDQN``
module, its CartPole training cells) and ``2.double dqn.ipynb`` (``compute_td_loss`` with the
online network choosing the next action and the target network evaluating it) at commit
0f82b6922e8a1a8515fc4c84c28702e7caa226f1 (no licence stated: the repository has no LICENSE
file). Written anew from the facts of those notebooks; no code copied. Gym is not installed:
the environment (the data, not the program) is CartPole-v0 written out in numpy from the
equations of gym's ``cartpole.py`` (gravity 9.8, cart 1.0, pole 0.1, half-length 0.5,
force 10, tau 0.02, Euler steps, done past 2.4 or 12 degrees, start uniform in +-0.05,
reward 1 per step, 200 steps at most), with gym's old ``reset``/``step`` API.

Kept: ``ReplayBuffer(1000)`` (a bounded deque of ``(state, action, reward, next_state,
done)`` with the states expanded to a leading axis, ``random.sample``, states
concatenated); ``epsilon_by_frame`` (1.0 to 0.01, ``exp(-frame / 500)``); ``DuelingDQN``:
``feature`` = ``Linear(4, 128)`` + ReLU, ``advantage`` = ``Linear(128, 128)`` + ReLU +
``Linear(128, 2)``, ``value`` = ``Linear(128, 128)`` + ReLU + ``Linear(128, 1)``, output
``value + advantage - mean(advantage)``, ``act`` (greedy argmax when ``random.random() >
epsilon``, else a random action); ``current_model`` and ``target_model``, ``update_target``
by ``load_state_dict`` at the start and every 100 frames; ``optim.Adam`` with its default
lr (1e-3); ``compute_td_loss`` (a sampled batch of 32; ``q_values = current_model(state)``,
the taken actions' values by ``gather(1, action.unsqueeze(1)).squeeze(1)``, the next action
by ``current_model(next_state)``'s argmax and its value from ``target_model(next_state)``
(double DQN), ``expected = reward + gamma * next_q * (1 - done)``, the loss
``(q_value - expected.detach()).pow(2).mean()``, ``zero_grad``/``backward``/``step``);
the frame loop (``gamma`` 0.99, a step, push, reset on done, one
update once the buffer holds more than a batch). One change from the notebook: its
``advantage.mean()`` averages over the whole batch as well as the actions; the port uses the
dueling paper's per-state mean over the actions (``mean(1, keepdim=True)``), identical for
the single states ``act`` sees.
Shrunk: 4,000 frames instead of the notebook's 10,000 (the network, batch, buffer, epsilon
schedule and target period unchanged; at 4,000 the healthy run's greedy return is 189 of
200 on seed 0); no plotting.
Measure only (not in the program): the mean return of 10 greedy episodes (epsilon 0) of the
trained ``current_model`` on an evaluation CartPole seeded apart from the training one,
and the mean of the last 10 training episodes' returns (the notebook's plot title).

nndx, as the author would add it: the first sampled batch is the one thing with inputs and
targets, so the preflight ``nndx.probe`` runs on ``current_model`` at the first
``compute_td_loss`` call: the state batch as inputs, ``(action, expected_q_value)`` as
targets, and the notebook's squared TD error as a function of the Q values and them, with
the optimizer; ``nndx.Monitor(current_model, optimizer)`` around the frame loop with every
loss logged; after training ``nndx.probe`` on that first batch with ``monitor=mon`` and
``nndx.diagnose``. The notebook has no validation, so nothing is logged as ``split="val"``.
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np
import torch
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dueling_dqn"
SOURCE = Source("higgsfield/RL-Adventure", "3.dueling dqn.ipynb", "0f82b6922e8a1a8515fc4c84c28702e7caa226f1",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebooks' dueling double DQN on CartPole-v0 (4,000 frames instead of 10,000)"),
        Variant(
            "q_value_not_squeezed",
            "q_value = q_values.gather(1, action.unsqueeze(1)) without .squeeze(1): (32, 1) minus the (32,) "
            "expected values broadcasts to (32, 32), so every Q value regresses to the batch's mean target",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/PacktPublishing/Deep-Reinforcement-Learning-Hands-On/issues/33",
             "https://github.com/simoninithomas/Deep_reinforcement_learning_Course/issues/51",
             "https://github.com/BY571/QR-DQN/issues/1"),
            Measure("greedy_return", "mean greedy return over 10 evaluation episodes at most half the healthy run's",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
        Variant(
            "optimizer_on_target_model",
            "optimizer = optim.Adam(target_model.parameters()): the loss's gradients land on current_model, which "
            "the optimizer does not hold; the Adam steps on target_model are overwritten by update_target every "
            "100 frames, so neither network learns",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/juliusfrost/dreamer-pytorch/pull/79",
             "https://github.com/siddancha/streaming-flow-policy/pull/15",
             "https://github.com/pytorch/tutorials/issues/466"),
            Measure("greedy_return", "mean greedy return over 10 evaluation episodes at most half the healthy run's",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
    )
}

NUM_FRAMES, BATCH_SIZE, GAMMA, TARGET_EVERY = 4000, 32, 0.99, 100
EPSILON_START, EPSILON_FINAL, EPSILON_DECAY = 1.0, 0.01, 500


# --------------------------------------------------------------------------- the environment (the data)


class CartPole:
    """CartPole-v0 in numpy (see the module docstring); gym's old reset/step API."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold, x_threshold, max_steps = 12 * 2 * math.pi / 360, 2.4, 200
    n_actions, obs_dim = 2, 4

    def __init__(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)
        self.state = np.zeros(4)
        self.t = 0

    def reset(self) -> np.ndarray:
        self.state, self.t = self.rng.uniform(-0.05, 0.05, size=4), 0
        return self.state.astype(np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, dict]:
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        total_mass, polemass_length = self.masspole + self.masscart, self.masspole * self.length
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        thetaacc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass))
        xacc = temp - polemass_length * thetaacc * cos / total_mass
        self.state = np.array([x + self.tau * x_dot, x_dot + self.tau * xacc,
                               theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc])  # fmt: skip
        self.t += 1
        fell = abs(self.state[0]) > self.x_threshold or abs(self.state[2]) > self.theta_threshold
        return self.state.astype(np.float32), 1.0, bool(fell or self.t >= self.max_steps), {}


# --------------------------------------------------------------------------- the program


class ReplayBuffer:
    def __init__(self, capacity: int, rng: random.Random) -> None:
        self.buffer: deque = deque(maxlen=capacity)
        self.rng = rng

    def push(self, state, action, reward, next_state, done) -> None:
        self.buffer.append((np.expand_dims(state, 0), action, reward, np.expand_dims(next_state, 0), done))

    def sample(self, batch_size: int):
        state, action, reward, next_state, done = zip(*self.rng.sample(self.buffer, batch_size))
        return np.concatenate(state), action, reward, np.concatenate(next_state), done

    def __len__(self) -> int:
        return len(self.buffer)


def epsilon_by_frame(frame_idx: int) -> float:
    return EPSILON_FINAL + (EPSILON_START - EPSILON_FINAL) * math.exp(-1.0 * frame_idx / EPSILON_DECAY)


class DuelingDQN(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int) -> None:
        super().__init__()
        self.num_outputs = num_outputs
        self.feature = nn.Sequential(nn.Linear(num_inputs, 128), nn.ReLU())
        self.advantage = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, num_outputs))
        self.value = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.feature(x)
        advantage = self.advantage(x)
        value = self.value(x)
        return value + advantage - advantage.mean(1, keepdim=True)

    def act(self, state: np.ndarray, epsilon: float, rng: random.Random) -> int:
        if rng.random() > epsilon:
            with torch.no_grad():
                q_value = self.forward(torch.FloatTensor(state).unsqueeze(0))
            return int(q_value.max(1)[1].item())
        return rng.randrange(self.num_outputs)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    env = CartPole(seed)
    current_model = DuelingDQN(CartPole.obs_dim, CartPole.n_actions)
    target_model = DuelingDQN(CartPole.obs_dim, CartPole.n_actions)
    trained = target_model if variant == "optimizer_on_target_model" else current_model
    optimizer = optim.Adam(trained.parameters())
    replay_buffer = ReplayBuffer(1000, rng)

    def update_target(current: nn.Module, target: nn.Module) -> None:
        target.load_state_dict(current.state_dict())

    update_target(current_model, target_model)

    def td_loss(q_values: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The notebook's loss, as a function of the Q values and (action, expected_q_value)."""
        action, expected_q_value = targets
        q_value = q_values.gather(1, action.unsqueeze(1))
        if variant != "q_value_not_squeezed":
            q_value = q_value.squeeze(1)
        return (q_value - expected_q_value.detach()).pow(2).mean()

    first_batch = None
    mon = None

    def compute_td_loss(batch_size: int) -> torch.Tensor:
        nonlocal first_batch, mon
        state, action, reward, next_state, done = replay_buffer.sample(batch_size)
        state = torch.FloatTensor(np.float32(state))
        next_state = torch.FloatTensor(np.float32(next_state))
        action = torch.LongTensor(action)
        reward = torch.FloatTensor(reward)
        done = torch.FloatTensor(done)

        q_values = current_model(state)
        next_q_values = current_model(next_state)
        next_q_state_values = target_model(next_state)
        next_q_value = next_q_state_values.gather(1, torch.max(next_q_values, 1)[1].unsqueeze(1)).squeeze(1)
        expected_q_value = (reward + GAMMA * next_q_value * (1 - done)).detach()
        if first_batch is None:  # the author's preflight, on the first batch there is
            first_batch = (state, (action, expected_q_value))
            nx.preflight(current_model, first_batch, td_loss, optimizer=optimizer)
            mon = nx.monitor(current_model, optimizer, every=10)
        loss = td_loss(q_values, (action, expected_q_value))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))
        return loss

    losses: list[float] = []
    all_rewards: list[float] = []
    episode_reward = 0.0
    state = env.reset()
    for frame_idx in range(1, NUM_FRAMES + 1):
        epsilon = epsilon_by_frame(frame_idx)
        action = current_model.act(state, epsilon, rng)
        next_state, reward, done, _ = env.step(action)
        replay_buffer.push(state, action, reward, next_state, done)
        state = next_state
        episode_reward += reward
        if done:
            state = env.reset()
            all_rewards.append(episode_reward)
            episode_reward = 0.0
        if len(replay_buffer) > BATCH_SIZE:
            losses.append(compute_td_loss(BATCH_SIZE).item())
        if frame_idx % TARGET_EVERY == 0:
            update_target(current_model, target_model)

    if mon is not None:
        nx.finish(mon, current_model, first_batch, td_loss, optimizer=optimizer)

    # measure only: greedy episodes of the trained current_model
    eval_env = CartPole(seed + 1000)
    returns = []
    for _ in range(10):
        obs, done, total = eval_env.reset(), False, 0.0
        while not done:
            obs, r, done, _ = eval_env.step(current_model.act(obs, 0.0, rng))
            total += r
        returns.append(total)
    late = all_rewards[-10:]
    return {
        "greedy_return": float(np.mean(returns)),
        "late_return": float(np.mean(late)) if late else 0.0,
        "episodes": float(len(all_rewards)),
        "late_loss": float(np.mean(losses[-200:])),
    }
