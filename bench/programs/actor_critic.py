"""Port of pytorch/examples' "actor-critic" on CartPole: one shared hidden layer, an actor
head (action probabilities) and a critic head (state value), one update per episode.

Source: github.com/pytorch/examples, ``reinforcement_learning/actor_critic.py`` at commit
02d5761dfd12e36d9df6a2054820831e3d558712 (BSD-3-Clause, Copyright (c) 2017 PyTorch
contributors). Written anew from the facts of that file; no code copied. (The stored
commit 1c16b6c4b4e30902b4fcdbd4d77ed19c60e4b36d is the 2017 version built on
``action.reinforce``, which PyTorch has since removed; this port follows 02d5761d, the
``Categorical`` version with normalised returns and a ``smooth_l1_loss`` critic.) Gym is
not installed: the environment is the hand-written CartPole of :mod:`bench.programs.dqn`
(the equations of gym's ``cartpole.py``), cut at 200 steps as CartPole-v0 is, and the
example's stopping rule uses CartPole-v0's ``reward_threshold`` of 195.

Kept: ``SavedAction(log_prob, value)``; ``Policy`` = ``affine1`` ``Linear(4, 128)`` then
``F.relu``, an ``action_head`` ``Linear(128, 2)`` through ``F.softmax(dim=-1)`` and a
``value_head`` ``Linear(128, 1)``, returned as the tuple ``(action_prob, state_values)``,
with the ``saved_actions`` / ``rewards`` buffers on the model; ``optim.Adam(lr=3e-2)``;
``eps`` = float32's machine epsilon; ``select_action`` (one state at a time, a
``Categorical`` over the probabilities, ``m.sample()``, ``m.log_prob(action)`` and the
value saved); ``finish_episode`` (discounted returns with ``gamma`` 0.99 built backwards,
normalised by their mean and ``std() + eps``; the advantage ``R - value.item()``; policy
losses ``-log_prob * advantage`` and value losses ``F.smooth_l1_loss(value,
torch.tensor([R]))``; ``optimizer.zero_grad()``, the two stacked lists summed into one
loss, ``backward``, ``step``, then the buffers emptied); the episode loop (reset, act,
``rewards.append``, stop when done), ``running_reward = 0.05 * ep_reward + 0.95 *
running_reward`` from 10, and the run stopping once ``running_reward`` exceeds the
threshold. ``torch.manual_seed`` and the environment are seeded with the example's 543
(plus the runner's offset).
Shrunk: at most 250 episodes instead of unbounded (``count(1)``); nothing else (the model
is already small). Measure only (not in the program): the mean reward of the last 20
episodes, the episodes run, and 5 greedy episodes of the trained actor.

nndx, as the author would add it: ``nndx.Monitor(model, optimizer)`` around the episode
loop with each episode's loss logged; the probes need a batch with inputs and targets,
and the first one there is is the first finished episode: its states as inputs and
``(actions, normalised returns)`` as targets, scored by ``finish_episode``'s loss
written as a function of the model's ``(action_prob, state_values)`` output. A preflight
``nndx.probe`` on it inside the first ``finish_episode`` (before the first update, so
on the untrained model), with the optimizer; after training ``nndx.probe`` on the same
batch with ``monitor=mon`` and ``nndx.diagnose``. The example has no validation, so
nothing is logged as ``split="val"``.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.distributions import Categorical

from bench.programs.dqn import CartPole
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "actor_critic"
SOURCE = Source("pytorch/examples", "reinforcement_learning/actor_critic.py",
                "02d5761dfd12e36d9df6a2054820831e3d558712", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (Adam 3e-2, one update per episode)"),
        Variant(
            "log_probs_detached",
            "the saved log-probabilities gathered into a new tensor (torch.tensor([...])) before the policy loss: "
            "the actor's loss is cut from the graph, only the critic learns and the policy stays as initialised",
            (C.DETACHED_GRAPH,),
            ("https://github.com/kengz/SLM-Lab/pull/133",
             "https://github.com/Quantum-Cheese/DeepReinforcementLearning_Pytorch/issues/1",
             "https://github.com/alexhernandezgarcia/gflownet/pull/251"),
            Measure("late_reward", "mean reward of the last 20 episodes at most half the healthy run's: "
                    "20.7/21.9/20.0 buggy against 200.0/177.7/73.4 healthy on seeds 0-2 (5 greedy episodes "
                    "10.0/10.8/9.2 against 198.4/200.0/200.0)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() dropped from finish_episode: each update applies the sum of every episode's "
            "gradient so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            Measure("late_reward", "mean reward of the last 20 episodes at most half the healthy run's: "
                    "9.1/9.4/9.2 buggy against 200.0/177.7/73.4 healthy on seeds 0-2 (5 greedy episodes "
                    "9.2/9.2/9.2 against 198.4/200.0/200.0)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
    )
}

SEED = 543
gamma = 0.99
log_interval = 10
REWARD_THRESHOLD = 195.0  # CartPole-v0's env.spec.reward_threshold
MAX_EPISODES = 250
eps = np.finfo(np.float32).eps.item()

SavedAction = namedtuple("SavedAction", ["log_prob", "value"])


class Policy(nn.Module):
    """Actor and critic in one model: a shared layer, then one head each."""

    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)  # the actor
        self.value_head = nn.Linear(128, 1)  # the critic
        self.saved_actions: list[SavedAction] = []
        self.rewards: list[float] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.affine1(x))
        action_prob = F.softmax(self.action_head(x), dim=-1)
        state_values = self.value_head(x)
        return action_prob, state_values


def episode_loss(output: tuple[torch.Tensor, torch.Tensor], targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``finish_episode``'s loss for the probes: the episode's states in one batch,
    ``(actions, normalised returns)`` as targets."""
    probs, values = output
    actions, returns = targets
    log_probs = Categorical(probs).log_prob(actions)
    values = values.squeeze(-1)
    advantage = returns - values.detach()
    return (-log_probs * advantage).sum() + F.smooth_l1_loss(values, returns, reduction="sum")


def train(variant: str, nx: Nndx, seed: int = 0, max_episodes: int = MAX_EPISODES) -> dict[str, float]:
    torch.manual_seed(SEED + seed)
    env = CartPole(SEED + seed)
    model = Policy()
    optimizer = optim.Adam(model.parameters(), lr=3e-2)

    def select_action(state: np.ndarray) -> int:
        state = torch.from_numpy(state).float()
        probs, state_value = model(state)
        m = Categorical(probs)
        action = m.sample()
        model.saved_actions.append(SavedAction(m.log_prob(action), state_value))
        return action.item()

    first_batch = None
    episode_states: list[np.ndarray] = []  # kept for nndx's probes only
    episode_actions: list[int] = []
    losses: list[float] = []

    def finish_episode() -> None:
        nonlocal first_batch
        R = 0
        saved_actions = model.saved_actions
        policy_losses, value_losses, returns = [], [], []
        for r in model.rewards[::-1]:
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)

        if first_batch is None:  # the author's preflight, on the first episode there is
            inputs = torch.from_numpy(np.stack(episode_states)).float()
            first_batch = (inputs, (torch.tensor(episode_actions), returns.float()))
            nx.preflight(model, first_batch, episode_loss, optimizer=optimizer)

        if variant == "log_probs_detached":  # the saved log-probs re-made as a plain tensor
            log_probs = torch.tensor([sa.log_prob for sa in saved_actions])
        else:
            log_probs = [sa.log_prob for sa in saved_actions]
        for log_prob, (_, value), R in zip(log_probs, saved_actions, returns):
            advantage = R - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))

        if variant != "no_zero_grad":
            optimizer.zero_grad()
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        loss.backward()
        optimizer.step()
        mon.log(loss)
        losses.append(loss.item())
        del model.rewards[:]
        del model.saved_actions[:]

    mon = nx.monitor(model, optimizer, every=10)
    running_reward = 10.0
    episode_rewards: list[float] = []
    printed: list[tuple[int, float, float]] = []
    for i_episode in range(1, max_episodes + 1):
        state, ep_reward = np.asarray(env.reset()), 0.0
        episode_states.clear()
        episode_actions.clear()
        for _t in range(1, 10000):
            episode_states.append(state)
            action = select_action(state)
            episode_actions.append(action)
            observation, reward, terminated, truncated = env.step(action)
            state = np.asarray(observation)
            model.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        episode_rewards.append(ep_reward)
        finish_episode()
        if i_episode % log_interval == 0:
            printed.append((i_episode, ep_reward, running_reward))  # the example's print
        if running_reward > REWARD_THRESHOLD:
            break

    nx.finish(mon, model, first_batch, episode_loss, optimizer=optimizer)

    # measure only: greedy episodes of the trained actor
    greedy_env = CartPole(SEED + seed + 2000)
    greedy = []
    with torch.no_grad():
        for _ in range(5):
            obs, duration, done = greedy_env.reset(), 0, False
            while not done:
                probs, _ = model(torch.tensor(obs, dtype=torch.float32))
                obs, _, terminated, truncated = greedy_env.step(int(probs.argmax()))
                duration, done = duration + 1, terminated or truncated
            greedy.append(duration)
    late = episode_rewards[-20:]
    return {
        "late_reward": sum(late) / len(late),
        "running_reward": running_reward,
        "episodes": float(len(episode_rewards)),
        "greedy_reward": sum(greedy) / len(greedy),
        "late_loss": sum(losses[-20:]) / len(losses[-20:]),
    }
