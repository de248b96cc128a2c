"""Port of pytorch/examples' "REINFORCE" on CartPole: a one-hidden-layer policy with
dropout, Monte-Carlo returns normalised per episode, one Adam step per episode.

Source: github.com/pytorch/examples, ``reinforcement_learning/reinforce.py`` at commit
89c7d7588dd96a6007750983054aa2980d1fa01e (the file's last change, "Upgrade to Gymnasium
rather than Gym"; BSD-3-Clause, Copyright (c) 2017 Pytorch contributors). Written anew
from the facts of that file; no code copied. (The stored commit
19f8d5a5180aef5bd885a03d2a9b85380f7af73c is the 2017 version built on
``action.reinforce``, which PyTorch has since removed.) Gym is not installed: the
environment is the hand-written CartPole of :mod:`bench.programs.dqn` (the equations of
gym's ``cartpole.py``).

Kept: ``Policy`` = ``affine1`` ``Linear(4, 128)``, ``nn.Dropout(p=0.6)`` applied before
``F.relu``, ``affine2`` ``Linear(128, 2)``, ``F.softmax(action_scores, dim=1)``, with the
``saved_log_probs`` / ``rewards`` buffers on the model; ``optim.Adam(lr=1e-2)``; ``eps`` =
float32's machine epsilon; ``select_action`` (the state as a ``(1, 4)`` batch, a
``Categorical`` over the probabilities, ``m.sample()``, ``m.log_prob(action)`` saved);
``finish_episode`` (discounted returns with ``gamma`` 0.99 built backwards into a
``deque`` with ``appendleft``, normalised by their mean and ``std() + eps``; the loss
terms ``-log_prob * R``, ``optimizer.zero_grad()``, ``torch.cat(policy_loss).sum()``,
``backward``, ``step``, the buffers emptied); the episode loop (reset, at most 9999
steps, ``rewards.append``, stop on ``terminated or truncated``), ``running_reward = 0.05
* ep_reward + 0.95 * running_reward`` from 10, a print every ``log_interval`` 10 (kept
as a list), and the run stopping once ``running_reward`` exceeds the environment's
reward threshold. The policy stays in train mode throughout (the example never calls
``eval()``: actions are sampled with dropout on). ``torch.manual_seed`` and the
environment are seeded with the example's 543 (plus the runner's offset).
Shrunk: CartPole cut at 200 steps with CartPole-v0's threshold 195 instead of
CartPole-v1's 500 steps and 475; at most 300 episodes instead of unbounded
(``count(1)``). Measure only (not in the program): the mean reward of the last 20
episodes, the episodes run, and 5 greedy episodes of the trained policy (in eval mode).

nndx, as the author would add it: ``nndx.Monitor(policy, optimizer)`` around the episode
loop with each episode's ``policy_loss`` logged; the probes need a batch with inputs and
targets, and the first one there is is the first finished episode: its states as inputs
and ``(actions, normalised returns)`` as targets, scored by ``finish_episode``'s loss
written as a function of the policy's probabilities. A preflight ``nndx.probe`` on it
inside the first ``finish_episode`` (before the first update, so on the untrained
policy), with the optimizer; after training ``nndx.probe`` on the same batch with
``monitor=mon`` and ``nndx.diagnose``. The example has no validation, so nothing is
logged as ``split="val"``.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.distributions import Categorical

from bench.programs.dqn import CartPole
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "reinforce"
SOURCE = Source("pytorch/examples", "reinforcement_learning/reinforce.py",
                "89c7d7588dd96a6007750983054aa2980d1fa01e", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the example as published (Adam 1e-2, one update per episode)"),
        Variant(
            "returns_reversed",
            "returns.append(R) instead of returns.appendleft(R) while walking the rewards backwards: the "
            "returns come out in reverse time order, so each log-probability is weighted by another step's "
            "return (the last actions, those that dropped the pole, get the largest)",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/Farama-Foundation/Gymnasium/pull/1337",
             "https://github.com/huggingface/deep-rl-class/pull/70",
             "https://github.com/udacity/deep-reinforcement-learning/issues/42"),
            Measure("late_reward", "mean reward of the last 20 episodes at most half the healthy run's: "
                    "9.4/10.3/9.8 buggy against 172.1/191.6/200.0 healthy on seeds 0-2 (5 greedy episodes "
                    "9.2/9.2/9.2 against 200.0/200.0/200.0)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
        Variant(
            "lr_too_high",
            "optim.Adam(policy.parameters(), lr=1.0) instead of 1e-2 (100x): each episode's step throws the "
            "softmax policy to a deterministic, poor action choice",
            (C.LR_TOO_HIGH,),
            ("https://github.com/PacktPublishing/Tensorflow-2-Reinforcement-Learning-Cookbook/issues/12",
             "https://github.com/Unity-Technologies/ml-agents/issues/1237",
             "https://github.com/rlcode/reinforcement-learning/issues/58"),
            Measure("late_reward", "mean reward of the last 20 episodes at most half the healthy run's: "
                    "44.4/9.8/9.2 buggy against 172.1/191.6/200.0 healthy on seeds 0-2 (5 greedy episodes "
                    "29.6/9.2/9.2 against 200.0/200.0/200.0)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
    )
}

SEED = 543
gamma = 0.99
log_interval = 10
MAX_STEPS = 200  # CartPole-v0's time limit (the shrink)
REWARD_THRESHOLD = 195.0  # CartPole-v0's env.spec.reward_threshold
MAX_EPISODES = 300
eps = np.finfo(np.float32).eps.item()


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)
        self.saved_log_probs: list[torch.Tensor] = []
        self.rewards: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


def episode_loss(probs: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``finish_episode``'s loss for the probes: the episode's states in one batch,
    ``(actions, normalised returns)`` as targets."""
    actions, returns = targets
    return (-Categorical(probs).log_prob(actions) * returns).sum()


def train(variant: str, nx: Nndx, seed: int = 0, max_episodes: int = MAX_EPISODES) -> dict[str, float]:
    torch.manual_seed(SEED + seed)
    env = CartPole(SEED + seed)
    policy = Policy()
    optimizer = optim.Adam(policy.parameters(), lr=1.0 if variant == "lr_too_high" else 1e-2)

    def select_action(state: np.ndarray) -> int:
        state = torch.from_numpy(state).float().unsqueeze(0)
        probs = policy(state)
        m = Categorical(probs)
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    first_batch = None
    episode_states: list[np.ndarray] = []  # kept for nndx's probes only
    episode_actions: list[int] = []
    losses: list[float] = []

    def finish_episode() -> None:
        nonlocal first_batch
        R = 0
        policy_loss = []
        returns: deque[float] = deque()
        for r in policy.rewards[::-1]:
            R = r + gamma * R
            if variant == "returns_reversed":
                returns.append(R)
            else:
                returns.appendleft(R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)

        if first_batch is None:  # the author's preflight, on the first episode there is
            inputs = torch.from_numpy(np.stack(episode_states)).float()
            first_batch = (inputs, (torch.tensor(episode_actions), returns.float()))
            nx.preflight(policy, first_batch, episode_loss, optimizer=optimizer)

        for log_prob, R in zip(policy.saved_log_probs, returns):
            policy_loss.append(-log_prob * R)
        optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()
        optimizer.step()
        mon.log(policy_loss)
        losses.append(policy_loss.item())
        del policy.rewards[:]
        del policy.saved_log_probs[:]

    mon = nx.monitor(policy, optimizer, every=10)
    running_reward = 10.0
    episode_rewards: list[float] = []
    printed: list[tuple[int, float, float]] = []
    for i_episode in range(1, max_episodes + 1):
        state, ep_reward = np.asarray(env.reset()), 0.0
        episode_states.clear()
        episode_actions.clear()
        for _t in range(1, 10000):  # Don't infinite loop while learning
            episode_states.append(state)
            action = select_action(state)
            episode_actions.append(action)
            observation, reward, terminated, truncated = env.step(action)
            state = np.asarray(observation)
            policy.rewards.append(reward)
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

    nx.finish(mon, policy, first_batch, episode_loss, optimizer=optimizer)

    # measure only: greedy episodes of the trained policy, dropout off
    greedy_env = CartPole(SEED + seed + 2000)
    greedy = []
    policy.eval()
    with torch.no_grad():
        for _ in range(5):
            obs, duration, done = greedy_env.reset(), 0, False
            while not done:
                probs = policy(torch.tensor(obs, dtype=torch.float32).unsqueeze(0))
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
