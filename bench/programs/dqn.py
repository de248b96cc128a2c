"""Port of the PyTorch tutorial "Reinforcement Learning (DQN) Tutorial" (CartPole: a policy
and a target MLP, replay memory, epsilon-greedy actions, Huber loss, AdamW with amsgrad,
gradient values clipped at 100, a soft target update).

Source: github.com/pytorch/tutorials, ``intermediate_source/reinforcement_q_learning.py``
(BSD-3-Clause, Copyright (c) 2017-2022 Pytorch contributors). The version stored here at
commit deef00a631add29563846f231d59f454b2f7f007 is the older one (a CNN on rendered screen
differences, RMSprop, a hard target copy every 10 episodes); this port follows the current
tutorial (the 4 state values into a 3-layer MLP, AdamW(amsgrad=True), a soft update with
TAU), whose text was read from verbatim copies because no newer commit of
pytorch/tutorials could be read here. Written anew from the facts of those files; no
code copied. Gym is not installed: the environment (the data, not the program) is
CartPole written out from the equations of ``gym/envs/classic_control/cartpole.py`` at
github.com/openai/gym commit 00698eddcc68dad31b1732b44a458c860629cf95 (MIT; gravity 9.8,
cart 1.0, pole 0.1, half-length 0.5, force 10, tau 0.02, Euler steps, done past 2.4 or
12 degrees, start uniform in +-0.05, reward 1 per step).

Kept: ``Transition(state, action, next_state, reward)`` and ``ReplayMemory(10000)`` (a
bounded deque, ``random.sample``); ``DQN`` = ``Linear(4, 128)`` -> ReLU -> ``Linear(128,
128)`` -> ReLU -> ``Linear(128, 2)``; ``target_net`` loaded from ``policy_net``'s state;
``BATCH_SIZE`` 128, ``GAMMA`` 0.99, ``EPS_START`` 0.9, ``EPS_END`` 0.05, ``EPS_DECAY`` 1000,
``TAU`` 0.005; ``select_action`` (the exponential epsilon schedule over ``steps_done``, the
policy's argmax under ``no_grad`` or a random action); ``optimize_model`` (nothing until the
memory holds a batch; a non-final mask; ``gather`` of the taken actions' Q values;
``target_net``'s max over next states under ``no_grad``, zero for final states;
``nn.SmoothL1Loss``; ``zero_grad``, ``backward``, ``clip_grad_value_(100)``, ``step``); the
episode loop (a step, ``next_state = None`` when terminated, push, one ``optimize_model``,
then the soft update ``target = TAU * policy + (1 - TAU) * target`` over the state dicts).
Shrunk: 100 episodes instead of 600 (the tutorial itself runs 50 on a CPU), each cut at 200
steps (CartPole-v0's limit) instead of CartPole-v1's 500, at ``LR`` 1e-3 instead of 1e-4 (at
1e-4 the shrunk run has not learnt to balance: last 20 episodes 11.6 steps on seed 0).
Measure only (not in the program): the mean duration of the last 20 training episodes
(the tutorial's plot), and 5 greedy episodes of the trained policy.

nndx, as the author would add it: the first sampled batch is the one thing with inputs and
targets, so the preflight ``nndx.probe`` runs on ``policy_net`` at the first
``optimize_model`` call (memory full enough): the state batch as inputs, ``(action_batch,
expected_state_action_values)`` as targets, and the tutorial's loss as a function of them
(``SmoothL1Loss`` of the gathered Q values), with the optimizer; ``nndx.Monitor(policy_net,
optimizer)`` around the loop with every TD loss logged; after training ``nndx.probe`` on
that first batch with ``monitor=mon`` and ``nndx.diagnose``. The tutorial has no
validation, so nothing is logged as ``split="val"``.
"""

from __future__ import annotations

import math
import random
from collections import deque, namedtuple

import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dqn"
SOURCE = Source("pytorch/tutorials", "intermediate_source/reinforcement_q_learning.py",
                "deef00a631add29563846f231d59f454b2f7f007", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (AdamW amsgrad, LR 1e-3 for the shrunk run)"),
        Variant(
            "lr_too_high",
            "LR = 1e-1 instead of 1e-3 (100x): the Q network's updates overshoot the bootstrapped targets",
            (C.LR_TOO_HIGH,),
            ("https://github.com/muupan/dqn-in-the-caffe/issues/6",
             "https://github.com/PacktPublishing/Tensorflow-2-Reinforcement-Learning-Cookbook/issues/12",
             "https://github.com/facebookresearch/ReAgent/issues/189"),
            Measure("late_duration", "mean duration of the last 20 episodes at most half the healthy run's: "
                    "33.9/24.4/54.4 buggy against 145.2/149.2/171.4 healthy on seeds 0-2 (5 greedy episodes "
                    "16.4/21.6/15.4 against 152.0/169.4/165.8)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() dropped from optimize_model: every step's gradient is the sum of all the "
            "TD-loss gradients so far (clip_grad_value_ then caps each entry at 100)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/IDEA-Research/DAB-DETR/issues/58",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            Measure("late_duration", "mean duration of the last 20 episodes at most half the healthy run's: "
                    "13.0/11.7/13.0 buggy against 145.2/149.2/171.4 healthy on seeds 0-2 (5 greedy episodes "
                    "9.0/9.2/10.2 against 152.0/169.4/165.8)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
    )
}

BATCH_SIZE, GAMMA, EPS_START, EPS_END, EPS_DECAY, TAU, LR = 128, 0.99, 0.9, 0.05, 1000, 0.005, 1e-3
NUM_EPISODES, MAX_STEPS = 100, 200

Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


# --------------------------------------------------------------------------- the environment (the data)


class CartPole:
    """CartPole-v1's dynamics, observation and reward (see the module docstring)."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold, x_threshold = 12 * 2 * math.pi / 360, 2.4

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state = (0.0, 0.0, 0.0, 0.0)
        self.steps = 0

    def reset(self) -> list[float]:
        self.state = tuple(self.rng.uniform(-0.05, 0.05) for _ in range(4))
        self.steps = 0
        return list(self.state)

    def step(self, action: int) -> tuple[list[float], float, bool, bool]:
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        total_mass, polemass_length = self.masspole + self.masscart, self.masspole * self.length
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        thetaacc = (self.gravity * sin - cos * temp) / (self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass))
        xacc = temp - polemass_length * thetaacc * cos / total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        self.state = (x, x_dot, theta, theta_dot)
        self.steps += 1
        terminated = abs(x) > self.x_threshold or abs(theta) > self.theta_threshold
        return list(self.state), 1.0, terminated, self.steps >= MAX_STEPS


# --------------------------------------------------------------------------- the program


class ReplayMemory:
    def __init__(self, capacity: int, rng: random.Random) -> None:
        self.memory: deque[Transition] = deque([], maxlen=capacity)
        self.rng = rng

    def push(self, *args) -> None:
        self.memory.append(Transition(*args))

    def sample(self, batch_size: int) -> list[Transition]:
        return self.rng.sample(self.memory, batch_size)

    def __len__(self) -> int:
        return len(self.memory)


class DQN(nn.Module):
    def __init__(self, n_observations: int, n_actions: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(n_observations, 128)
        self.layer2 = nn.Linear(128, 128)
        self.layer3 = nn.Linear(128, n_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.layer1(x))
        x = F.relu(self.layer2(x))
        return self.layer3(x)


def train(variant: str, nx: Nndx, seed: int = 0, num_episodes: int = NUM_EPISODES) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    env = CartPole(seed + 1000)
    n_actions, n_observations = 2, 4
    policy_net = DQN(n_observations, n_actions)
    target_net = DQN(n_observations, n_actions)
    target_net.load_state_dict(policy_net.state_dict())
    lr = 1e-1 if variant == "lr_too_high" else LR
    optimizer = optim.AdamW(policy_net.parameters(), lr=lr, amsgrad=True)
    memory = ReplayMemory(10000, rng)
    criterion = nn.SmoothL1Loss()
    steps_done = 0

    def select_action(state: torch.Tensor) -> torch.Tensor:
        nonlocal steps_done
        sample = rng.random()
        eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * steps_done / EPS_DECAY)
        steps_done += 1
        if sample > eps_threshold:
            with torch.no_grad():
                return policy_net(state).max(1).indices.view(1, 1)
        return torch.tensor([[rng.randrange(n_actions)]], dtype=torch.long)

    def td_loss(q_values: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The tutorial's loss, as a function of the Q values and (actions, expected values)."""
        action_batch, expected = targets
        return criterion(q_values.gather(1, action_batch), expected.unsqueeze(1))

    def td_batch() -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch = Transition(*zip(*memory.sample(BATCH_SIZE)))
        non_final_mask = torch.tensor(tuple(s is not None for s in batch.next_state), dtype=torch.bool)
        non_final_next_states = torch.cat([s for s in batch.next_state if s is not None])
        state_batch, action_batch = torch.cat(batch.state), torch.cat(batch.action)
        reward_batch = torch.cat(batch.reward)
        next_state_values = torch.zeros(BATCH_SIZE)
        with torch.no_grad():
            next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
        expected_state_action_values = (next_state_values * GAMMA) + reward_batch
        return state_batch, (action_batch, expected_state_action_values)

    first_batch = None
    mon = None
    losses: list[float] = []

    def optimize_model() -> None:
        nonlocal first_batch, mon
        if len(memory) < BATCH_SIZE:
            return
        state_batch, targets = td_batch()
        if first_batch is None:  # the author's preflight, on the first batch there is
            first_batch = (state_batch, targets)
            nx.preflight(policy_net, first_batch, td_loss, optimizer=optimizer)
            mon = nx.monitor(policy_net, optimizer, every=10)
        state_action_values = policy_net(state_batch).gather(1, targets[0])
        loss = criterion(state_action_values, targets[1].unsqueeze(1))
        if variant != "no_zero_grad":
            optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
        optimizer.step()
        mon.log(loss)
        losses.append(loss.item())

    episode_durations: list[int] = []
    for _episode in range(num_episodes):
        state = torch.tensor(env.reset(), dtype=torch.float32).unsqueeze(0)
        for t in range(MAX_STEPS + 1):
            action = select_action(state)
            observation, reward, terminated, truncated = env.step(action.item())
            reward_t = torch.tensor([reward])
            next_state = None if terminated else torch.tensor(observation, dtype=torch.float32).unsqueeze(0)
            memory.push(state, action, next_state, reward_t)
            state = next_state
            optimize_model()
            target_net_state_dict = target_net.state_dict()
            policy_net_state_dict = policy_net.state_dict()
            for key in policy_net_state_dict:
                target_net_state_dict[key] = policy_net_state_dict[key] * TAU + target_net_state_dict[key] * (1 - TAU)
            target_net.load_state_dict(target_net_state_dict)
            if terminated or truncated:
                episode_durations.append(t + 1)
                break

    if mon is not None:
        nx.finish(mon, policy_net, first_batch, td_loss, optimizer=optimizer)

    # measure only: greedy episodes of the trained policy
    greedy_env = CartPole(seed + 2000)
    greedy = []
    with torch.no_grad():
        for _ in range(5):
            obs, duration, done = greedy_env.reset(), 0, False
            while not done:
                q = policy_net(torch.tensor(obs, dtype=torch.float32).unsqueeze(0))
                obs, _, terminated, truncated = greedy_env.step(int(q.argmax(1)))
                duration, done = duration + 1, terminated or truncated
            greedy.append(duration)
    late = episode_durations[-20:]
    return {
        "late_duration": sum(late) / len(late),
        "greedy_duration": sum(greedy) / len(greedy),
        "total_steps": float(steps_done),
        "late_loss": sum(losses[-200:]) / max(1, len(losses[-200:])),
    }
