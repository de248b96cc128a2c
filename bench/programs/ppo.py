"""Port of nikhilbarhate99/PPO-PyTorch (discrete actions, CartPole): separate actor and
critic MLPs, a rollout buffer, K epochs of the clipped surrogate + 0.5 * MSE value loss
- 0.01 * entropy on Monte-Carlo returns, the old policy copied after each update.

Source: github.com/nikhilbarhate99/PPO-PyTorch, ``PPO.py`` at commit
d5e73e5f1c764a3a892f2a1106c5035cb2f4deb0 and ``train.py`` at commit
d5c883783ac6406c4d58a1e1e9eb6f08a6462d89 (MIT). The CartPole-v1 settings (discrete
actions, ``max_ep_len`` 400, ``K_epochs`` 80, ``eps_clip`` 0.2, ``gamma`` 0.99,
``lr_actor`` 3e-4, ``lr_critic`` 1e-3) are those of the repository's ``PPO_colab.ipynb``
at commit 25dedb9e3599391f2e5fa7025565ee9f3d68ad07; ``update_timestep = max_ep_len * 4``
is ``train.py``'s. Written anew from the facts of those files; no code copied. Gym is not
installed: the environment is the hand-written CartPole of :mod:`bench.programs.dqn` (the
equations of gym's ``cartpole.py``), with CartPole-v1's 500-step limit.

Kept: ``RolloutBuffer`` (actions, states, logprobs, rewards, is_terminals; ``clear``);
``ActorCritic`` with ``forward`` raising ``NotImplementedError``, the discrete ``actor``
``nn.Sequential(Linear(4, 64), Tanh, Linear(64, 64), Tanh, Linear(64, 2),
Softmax(dim=-1))`` and the ``critic`` ``nn.Sequential(Linear(4, 64), Tanh, Linear(64,
64), Tanh, Linear(64, 1))``, ``act`` (a ``Categorical`` sample and its log-prob, both
detached) and ``evaluate`` (log-probs, state values, entropy); ``PPO`` with one
``torch.optim.Adam`` over two parameter groups (actor 3e-4, critic 1e-3), ``policy_old``
loaded from ``policy``, ``nn.MSELoss``; ``select_action`` (``policy_old.act`` under
``no_grad``, the state, action and log-prob pushed to the buffer); ``update`` (Monte-Carlo
returns walked backwards and reset at each ``is_terminal``, normalised with ``std() +
1e-7``; the buffer stacked, squeezed and detached; ``K_epochs`` of ``evaluate``,
``torch.squeeze(state_values)``, ``ratios = exp(logprobs - old_logprobs)``, ``advantages
= rewards - state_values.detach()``, the clipped surrogate, ``loss = -min(surr1, surr2)
+ 0.5 * MseLoss(state_values, rewards) - 0.01 * dist_entropy``, ``zero_grad``,
``loss.mean().backward()``, ``step``; then ``policy_old.load_state_dict`` and
``buffer.clear``); ``train.py``'s loop (``while time_step <= max_training_timesteps``,
episodes of at most ``max_ep_len`` steps, reward and ``done`` pushed, an update every
``update_timestep`` steps, the running averages logged every ``log_freq`` and printed
every ``print_freq`` steps, kept as lists). ``random_seed`` is set (the script's
``if random_seed:`` branch) to 1 plus the runner's offset.
Shrunk: 16,000 training timesteps instead of ``train.py``'s 3e6 (40 updates);
``max_ep_len`` 100 (so ``update_timestep`` 400) instead of 400, the print and log
intervals scaled with it; ``K_epochs`` 40 instead of 80; no checkpoint saving, log file or
timing prints. The healthy run reaches the 100-step cap within the budget. Measure only
(not in the program): the mean reward of the last 20 episodes, 5 greedy episodes of the
trained actor, and ``value_mse``: the critic's error against the normalised returns at
the last epoch of each update, computed with matching shapes, averaged over the updates
(it stays high even when healthy: episodes cut at ``max_ep_len`` are not terminal, so the
returns depend on a time the state does not show).

nndx, as the author would add it: ``nndx.Monitor(ppo.policy, ppo.optimizer,
loss_fn=ppo.MseLoss)`` around the training loop, the value term computed through
``mon.loss_fn`` (the README's wrapped criterion) and each epoch's ``loss.mean()``
logged; the probes need a batch with inputs and targets, and the first one there is is
the first rollout: its states as inputs and ``(actions, old log-probs, normalised
returns)`` as targets, scored by ``update``'s loss written as a function of the
``(action_probs, state_values)`` that ``evaluate`` computes. The model given to nndx is
``ppo.policy``, the ``ActorCritic`` the optimizer trains, as the author wrote it: its
``forward(self)`` takes no input and raises ``NotImplementedError`` (the program calls
``act``/``evaluate``), so every probe that calls the model fails, and that is recorded,
not worked around. A preflight ``nndx.probe`` at the first ``update`` (before the first
step), with the optimizer; after training ``nndx.probe`` on the same batch with
``monitor=mon`` and ``nndx.diagnose``. The program has no validation, so nothing is
logged as ``split="val"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from bench.programs.dqn import CartPole
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ppo"
SOURCE = Source("nikhilbarhate99/PPO-PyTorch", "PPO.py", "d5e73e5f1c764a3a892f2a1106c5035cb2f4deb0", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (CartPole-v1 settings, discrete actions)"),
        Variant(
            "values_not_squeezed",
            "state_values = torch.squeeze(state_values) left out of update: the critic's (N, 1) values meet the "
            "(N,) returns in MseLoss and in the advantages, both broadcast to (N, N); the critic learns the "
            "batch mean only",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/RLinf/RLinf/issues/1568",
             "https://github.com/thu-ml/tianshou/pull/155",
             "https://github.com/PacktPublishing/Deep-Reinforcement-Learning-Hands-On/issues/33"),
            Measure("value_mse", "the critic's error against the normalised returns (matching shapes, mean over "
                    "the updates) at least 0.1 above the healthy run's: 0.998/0.998/0.998 buggy (the returns' "
                    "variance: a constant critic) against 0.81/0.81/0.84 healthy on seeds 0-2 (late reward "
                    "100.0/96.7/98.6 against 97.4/96.0/100.0: the actor still learns)",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
        Variant(
            "no_terminal_reset",
            "the `if is_terminal: discounted_reward = 0` reset dropped from update (as in the repository's "
            "first version): returns run on across episode ends, so the steps that dropped the pole are "
            "credited with the next episode's rewards",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/philtabor/Youtube-Code-Repository/pull/58",
             "https://github.com/nikhilbarhate99/PPO-PyTorch/issues/38",
             "https://github.com/openai/spinningup/issues/50"),
            Measure("late_reward", "mean reward of the last 20 episodes at most half the healthy run's: "
                    "18.4/13.9/38.0 buggy against 97.4/96.0/100.0 healthy on seeds 0-2 (5 greedy episodes "
                    "9.2/9.4/35.2 against 100.0/100.0/100.0)",
                    lambda healthy, buggy: not buggy > healthy / 2),
        ),
    )
}

state_dim, action_dim = 4, 2
max_ep_len = 100  # 400 in the CartPole-v1 settings (the shrink)
max_training_timesteps = 16_000  # int(3e6) in train.py
print_freq = max_ep_len * 10
log_freq = max_ep_len * 2
update_timestep = max_ep_len * 4
K_epochs = 40  # 80 in the CartPole-v1 settings (the shrink)
eps_clip = 0.2
gamma = 0.99
lr_actor = 0.0003
lr_critic = 0.001
ENV_LIMIT = 500  # CartPole-v1's TimeLimit


class CartPoleV1(CartPole):
    """:class:`bench.programs.dqn.CartPole` with CartPole-v1's 500-step limit."""

    def step(self, action: int) -> tuple[list[float], float, bool, bool]:
        observation, reward, terminated, _ = super().step(action)
        return observation, reward, terminated, self.steps >= ENV_LIMIT


class RolloutBuffer:
    def __init__(self) -> None:
        self.actions: list[torch.Tensor] = []
        self.states: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []
        self.rewards: list[float] = []
        self.is_terminals: list[bool] = []

    def clear(self) -> None:
        del self.actions[:]
        del self.states[:]
        del self.logprobs[:]
        del self.rewards[:]
        del self.is_terminals[:]


class ActorCritic(nn.Module):
    def __init__(self, state_dim: int, action_dim: int) -> None:
        super().__init__()
        self.actor = nn.Sequential(
            nn.Linear(state_dim, 64), nn.Tanh(),
            nn.Linear(64, 64), nn.Tanh(),
            nn.Linear(64, action_dim), nn.Softmax(dim=-1),
        )  # fmt: skip
        self.critic = nn.Sequential(
            nn.Linear(state_dim, 64), nn.Tanh(),
            nn.Linear(64, 64), nn.Tanh(),
            nn.Linear(64, 1),
        )  # fmt: skip

    def forward(self):
        raise NotImplementedError

    def act(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action_probs = self.actor(state)
        dist = Categorical(action_probs)
        action = dist.sample()
        action_logprob = dist.log_prob(action)
        return action.detach(), action_logprob.detach()

    def evaluate(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        action_probs = self.actor(state)
        dist = Categorical(action_probs)
        action_logprobs = dist.log_prob(action)
        dist_entropy = dist.entropy()
        state_values = self.critic(state)
        return action_logprobs, state_values, dist_entropy


def ppo_loss(output: tuple[torch.Tensor, torch.Tensor], targets: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``update``'s loss for the probes, from ``(action_probs, state_values)`` as
    ``evaluate`` computes them; targets ``(actions, old log-probs, normalised returns)``."""
    action_probs, state_values = output
    old_actions, old_logprobs, rewards = targets
    dist = Categorical(action_probs)
    state_values = torch.squeeze(state_values)
    ratios = torch.exp(dist.log_prob(old_actions) - old_logprobs)
    advantages = rewards - state_values.detach()
    surr1 = ratios * advantages
    surr2 = torch.clamp(ratios, 1 - eps_clip, 1 + eps_clip) * advantages
    loss = -torch.min(surr1, surr2) + 0.5 * F.mse_loss(state_values, rewards) - 0.01 * dist.entropy()
    return loss.mean()


class PPO:
    def __init__(self, state_dim: int, action_dim: int, lr_actor: float, lr_critic: float, gamma: float,
                 K_epochs: int, eps_clip: float, variant: str, nx: Nndx) -> None:  # fmt: skip
        self.gamma, self.eps_clip, self.K_epochs = gamma, eps_clip, K_epochs
        self.buffer = RolloutBuffer()
        self.policy = ActorCritic(state_dim, action_dim)
        self.optimizer = torch.optim.Adam([
            {"params": self.policy.actor.parameters(), "lr": lr_actor},
            {"params": self.policy.critic.parameters(), "lr": lr_critic},
        ])  # fmt: skip
        self.policy_old = ActorCritic(state_dim, action_dim)
        self.policy_old.load_state_dict(self.policy.state_dict())
        self.MseLoss = nn.MSELoss()
        self.variant, self.nx = variant, nx
        self.mon = None
        self.first_batch = None
        self.losses: list[float] = []
        self.value_mses: list[float] = []  # measure only

    def select_action(self, state: list[float]) -> int:
        with torch.no_grad():
            state = torch.FloatTensor(state)
            action, action_logprob = self.policy_old.act(state)
        self.buffer.states.append(state)
        self.buffer.actions.append(action)
        self.buffer.logprobs.append(action_logprob)
        return action.item()

    def update(self) -> None:
        # Monte Carlo estimate of returns
        rewards = []
        discounted_reward = 0
        for reward, is_terminal in zip(reversed(self.buffer.rewards), reversed(self.buffer.is_terminals)):
            if is_terminal and self.variant != "no_terminal_reset":
                discounted_reward = 0
            discounted_reward = reward + (self.gamma * discounted_reward)
            rewards.insert(0, discounted_reward)
        rewards = torch.tensor(rewards, dtype=torch.float32)
        rewards = (rewards - rewards.mean()) / (rewards.std() + 1e-7)

        old_states = torch.squeeze(torch.stack(self.buffer.states, dim=0)).detach()
        old_actions = torch.squeeze(torch.stack(self.buffer.actions, dim=0)).detach()
        old_logprobs = torch.squeeze(torch.stack(self.buffer.logprobs, dim=0)).detach()

        if self.first_batch is None:  # the author's preflight, on the first rollout there is
            self.first_batch = (old_states, (old_actions, old_logprobs, rewards))
            self.nx.preflight(self.policy, self.first_batch, ppo_loss, optimizer=self.optimizer)
            self.mon = self.nx.monitor(self.policy, self.optimizer, every=10, loss_fn=self.MseLoss)

        for _ in range(self.K_epochs):
            logprobs, state_values, dist_entropy = self.policy.evaluate(old_states, old_actions)
            if self.variant != "values_not_squeezed":
                state_values = torch.squeeze(state_values)
            ratios = torch.exp(logprobs - old_logprobs.detach())
            advantages = rewards - state_values.detach()
            surr1 = ratios * advantages
            surr2 = torch.clamp(ratios, 1 - self.eps_clip, 1 + self.eps_clip) * advantages
            loss = -torch.min(surr1, surr2) + 0.5 * self.mon.loss_fn(state_values, rewards) - 0.01 * dist_entropy
            self.optimizer.zero_grad()
            loss.mean().backward()
            self.optimizer.step()
            self.mon.log(loss.mean())
            self.losses.append(loss.mean().item())
        with torch.no_grad():  # measure only: the last epoch's critic error, shapes matched
            self.value_mses.append(F.mse_loss(state_values.reshape(-1), rewards).item())

        self.policy_old.load_state_dict(self.policy.state_dict())
        self.buffer.clear()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random_seed = 1 + seed
    torch.manual_seed(random_seed)
    env = CartPoleV1(random_seed)
    ppo_agent = PPO(state_dim, action_dim, lr_actor, lr_critic, gamma, K_epochs, eps_clip, variant, nx)

    print_running_reward, print_running_episodes = 0.0, 0
    log_running_reward, log_running_episodes = 0.0, 0
    printed: list[tuple[int, int, float]] = []  # the script's prints and log file, kept
    logged: list[tuple[int, int, float]] = []
    episode_rewards: list[float] = []
    time_step, i_episode = 0, 0
    while time_step <= max_training_timesteps:
        state = env.reset()
        current_ep_reward = 0.0
        for _t in range(1, max_ep_len + 1):
            action = ppo_agent.select_action(state)
            state, reward, terminated, truncated = env.step(action)
            done = terminated or truncated
            ppo_agent.buffer.rewards.append(reward)
            ppo_agent.buffer.is_terminals.append(done)
            time_step += 1
            current_ep_reward += reward
            if time_step % update_timestep == 0:
                ppo_agent.update()
            if time_step % log_freq == 0 and log_running_episodes:
                logged.append((i_episode, time_step, round(log_running_reward / log_running_episodes, 4)))
                log_running_reward, log_running_episodes = 0.0, 0
            if time_step % print_freq == 0 and print_running_episodes:
                printed.append((i_episode, time_step, round(print_running_reward / print_running_episodes, 2)))
                print_running_reward, print_running_episodes = 0.0, 0
            if done:
                break
        print_running_reward += current_ep_reward
        print_running_episodes += 1
        log_running_reward += current_ep_reward
        log_running_episodes += 1
        episode_rewards.append(current_ep_reward)
        i_episode += 1

    if ppo_agent.mon is not None:
        nx.finish(ppo_agent.mon, ppo_agent.policy, ppo_agent.first_batch, ppo_loss, optimizer=ppo_agent.optimizer)

    # measure only: greedy episodes of the trained actor (cut at max_ep_len, as training is)
    greedy_env = CartPoleV1(random_seed + 2000)
    greedy = []
    with torch.no_grad():
        for _ in range(5):
            obs, duration = greedy_env.reset(), 0
            for _t in range(max_ep_len):
                probs = ppo_agent.policy.actor(torch.tensor(obs, dtype=torch.float32))
                obs, _, terminated, truncated = greedy_env.step(int(probs.argmax()))
                duration += 1
                if terminated or truncated:
                    break
            greedy.append(duration)
    late = episode_rewards[-20:]
    return {
        "late_reward": sum(late) / len(late),
        "greedy_reward": sum(greedy) / len(greedy),
        "value_mse": sum(ppo_agent.value_mses) / len(ppo_agent.value_mses),
        "episodes": float(len(episode_rewards)),
        "late_loss": sum(ppo_agent.losses[-80:]) / len(ppo_agent.losses[-80:]),
    }
