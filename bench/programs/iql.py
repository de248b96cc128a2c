"""Port of gwthomas/IQL-PyTorch: Implicit Q-Learning (Kostrikov et al.) for offline RL: a
state value V fitted by expectile regression to the twin-Q minimum of a Polyak-averaged target
Q, Q regressed to ``r + discount * (1 - done) * V(s')``, and an advantage-weighted policy
(behaviour cloning weighted by ``exp(beta * (Q - V))`` clipped at 100), each network with its
own Adam, the policy's learning rate on a cosine schedule.

Source: github.com/gwthomas/IQL-PyTorch, ``src/iql.py`` with ``src/value_functions.py``,
``src/policy.py``, ``src/util.py`` and ``main.py`` at commit
71ea1aa313bb9d4bc4526bbb1824c9d6f4a46b92 (MIT, Copyright (c) 2021 Garrett Thomas). Written
anew from the facts of those files; no code copied. Gym/D4RL are not installed: the
environment (the data, not the program) is a small continuous-control task written in numpy
here, ``PointGoal``: a point in [-1, 1]^2 (the observation) moved by an action in [-1, 1]^2
scaled by 0.1, the reward minus the distance to the goal (0.6, 0.6) after the move, terminal
within 0.1 of it, 50 steps at most (``max_episode_steps``). The offline dataset (what
``d4rl.qlearning_dataset`` returns: observations, actions, next_observations, rewards,
terminals) is 120 episodes of a mixed-quality behaviour policy, collected once per seed: a
third from a noisy controller towards the goal, a third from the same controller towards a
decoy point (-0.6, 0.6), a third uniformly random actions (the "medium-replay"/"mixed" kind
of D4RL dataset, where cloning the behaviour is not enough).

Kept: ``util.mlp`` (``Linear`` + ``ReLU`` hidden layers, a last ``Linear``, the ``Squeeze(-1)``
module when ``squeeze_output``); ``TwinQ`` (two such MLPs over ``cat([state, action], 1)``,
``both`` and ``forward`` = their minimum); ``ValueFunction`` (an MLP squeezed to (batch,));
``GaussianPolicy`` (mean from an MLP, a state-independent ``log_std`` parameter clamped to
[-5, 2], a ``MultivariateNormal`` with ``scale_tril=diag(std)``; ``act`` returns its mean when
deterministic); ``ImplicitQLearning``: the target Q a ``deepcopy`` with ``requires_grad_(False)``,
``Adam`` from ``optimizer_factory`` for each of V, Q and the policy, ``CosineAnnealingLR(policy
optimizer, max_steps)``, ``update``: target Q and ``next_v`` under ``no_grad``, the V step on
``asymmetric_l2_loss(target_q - v, tau)``, the Q step on the mean over the twins of
``F.mse_loss(q, targets)``, ``update_exponential_moving_average(q_target, qf, alpha)``, the
policy step on ``mean(exp(beta * adv.detach()).clamp(max=100) * -log_prob(actions))`` and the
schedule step, each ``zero_grad(set_to_none=True)`` / ``backward`` / ``step`` in that order;
``main``: ``torch.set_num_threads(1)``, ``set_seed``, ``sample_batch`` (uniform indices with
replacement), ``evaluate_policy`` (deterministic, summed reward) every ``eval_period`` steps
over ``n_eval_episodes``; the defaults discount 0.99, tau 0.7, beta 3.0, alpha 0.005, 2 hidden
layers; no reward rescaling (``main.py`` rescales only the locomotion and AntMaze tasks).
Shrunk: ``hidden_dim`` 64 instead of 256, ``batch_size`` 256 kept, ``n_steps`` 2,000 instead
of 10^6 (the cosine schedule over those 2,000), ``learning_rate`` 1e-3 instead of 3e-4 (2,000
steps, not a million), ``eval_period`` 500 instead of 5,000; no log directory, CSV or saved
state dict; D4RL's normalized score is not computed (the mean return is).
Measure only (not in the program): the last evaluation's mean return, and the behaviour data's
mean episode return.

nndx, as the author would add it: as in the CQL/SAC ports, at the first ``update`` (where
its batch exists) a preflight ``nndx.probe`` on the Q function: ``qf`` with inputs
``(observations, actions)``, the ``targets`` computed for them, ``F.mse_loss`` and
``q_optimizer``; three ``nndx.Monitor``s, one per network and its optimizer: V with
``v_optimizer`` (``v_loss`` logged), Q with ``q_optimizer`` (each twin's ``F.mse_loss`` called
through ``mon_q.loss_fn``, ``q_loss`` logged) and the policy with ``policy_optimizer``
(``policy_loss`` logged). After training each Monitor's report is diagnosed and the author reads them ranked
together.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import MultivariateNormal
from torch.optim.lr_scheduler import CosineAnnealingLR

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "iql"
SOURCE = Source("gwthomas/IQL-PyTorch", "src/iql.py", "71ea1aa313bb9d4bc4526bbb1824c9d6f4a46b92", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: hidden 64, 2,000 steps, lr 1e-3)"),
        Variant(
            "value_not_squeezed",
            "ValueFunction's mlp built without squeeze_output=True: v and next_v are (batch, 1) against the "
            "(batch,) target Q, rewards and terminals, so adv = target_q - v and the Q targets silently broadcast "
            "to (batch, batch): V fits one expectile of every Q in the batch, Q regresses to a batch average",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/vwxyzjn/cleanrl/issues/379",
             "https://github.com/PacktPublishing/Deep-Reinforcement-Learning-Hands-On/issues/33",
             "https://github.com/Kchu/DeepRL_PyTorch/issues/1"),
            Measure("final_return", "last evaluation's mean return at least 3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
        Variant(
            "target_never_updated",
            "update_exponential_moving_average(self.q_target, self.q_target, self.alpha): the target Q is "
            "averaged with itself, so it stays at its random initialisation; V regresses onto that frozen "
            "random net and the advantages that weight the policy are noise",
            (C.FROZEN_PARAMETERS,),
            ("https://github.com/thesouther/MARL/issues/8", "https://github.com/nissymori/JAX-CORL/issues/73"),
            Measure("final_return", "last evaluation's mean return at least 3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
    )
}

HIDDEN_DIM, N_HIDDEN, N_STEPS, BATCH_SIZE, LEARNING_RATE = 64, 2, 2000, 256, 1e-3
DISCOUNT, TAU, BETA, ALPHA, EVAL_PERIOD, N_EVAL_EPISODES = 0.99, 0.7, 3.0, 0.005, 500, 10
MAX_EPISODE_STEPS, N_DATASET_EPISODES = 50, 120
EXP_ADV_MAX = 100.0
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


# --------------------------------------------------------------------------- the environment and dataset (the data)

GOAL, DECOY = np.array([0.6, 0.6]), np.array([-0.6, 0.6])


class PointGoal:
    """Move a point to the goal (see the module docstring); gym's old reset/step API."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)
        self.pos = np.zeros(2)

    def reset(self) -> np.ndarray:
        self.pos = self.rng.uniform(-1.0, 1.0, size=2)
        return self.pos.astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        dist = float(np.linalg.norm(self.pos - GOAL))
        return self.pos.astype(np.float32), -dist, dist < 0.1, {}


def collect_dataset(seed: int) -> tuple[dict[str, np.ndarray], float]:
    """qlearning_dataset's keys from the mixed behaviour policy, and its mean episode return."""
    env, rng = PointGoal(seed + 1000), np.random.RandomState(seed + 2000)
    keys = ("observations", "actions", "next_observations", "rewards", "terminals")
    data: dict[str, list] = {k: [] for k in keys}
    returns = []
    for episode in range(N_DATASET_EPISODES):
        kind = episode % 3  # 0: towards the goal, 1: towards the decoy, 2: random
        obs, total = env.reset(), 0.0
        for _ in range(MAX_EPISODE_STEPS):
            if kind == 2:
                action = rng.uniform(-1.0, 1.0, size=2)
            else:
                aim = GOAL if kind == 0 else DECOY
                action = np.clip(5.0 * (aim - obs) + rng.normal(0.0, 0.3, size=2), -1.0, 1.0)
            next_obs, reward, done, _ = env.step(action)
            for k, v in zip(keys, (obs, action, next_obs, reward, float(done))):
                data[k].append(v)
            obs, total = next_obs, total + reward
            if done:
                break
        returns.append(total)
    return {k: np.asarray(v, dtype=np.float32) for k, v in data.items()}, float(np.mean(returns))


# --------------------------------------------------------------------------- src/util.py


class Squeeze(nn.Module):
    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(dim=self.dim)


def mlp(dims: list[int], activation=nn.ReLU, output_activation=None, squeeze_output: bool = False) -> nn.Sequential:
    assert len(dims) >= 2, "MLP requires at least two dims (input and output)"
    layers: list[nn.Module] = []
    for i in range(len(dims) - 2):
        layers += [nn.Linear(dims[i], dims[i + 1]), activation()]
    layers.append(nn.Linear(dims[-2], dims[-1]))
    if output_activation is not None:
        layers.append(output_activation())
    if squeeze_output:
        assert dims[-1] == 1
        layers.append(Squeeze(-1))
    return nn.Sequential(*layers).to(dtype=torch.float32)


def update_exponential_moving_average(target: nn.Module, source: nn.Module, alpha: float) -> None:
    for target_param, source_param in zip(target.parameters(), source.parameters()):
        target_param.data.mul_(1.0 - alpha).add_(source_param.data, alpha=alpha)


def sample_batch(dataset: dict[str, torch.Tensor], batch_size: int) -> dict[str, torch.Tensor]:
    n = len(next(iter(dataset.values())))
    indices = torch.randint(low=0, high=n, size=(batch_size,))
    return {k: v[indices] for k, v in dataset.items()}


def evaluate_policy(env: PointGoal, policy: GaussianPolicy, max_episode_steps: int, deterministic: bool = True) -> float:
    obs = env.reset()
    total_reward = 0.0
    for _ in range(max_episode_steps):
        with torch.no_grad():
            action = policy.act(torch.from_numpy(obs), deterministic=deterministic).numpy()
        next_obs, reward, done, _ = env.step(action)
        total_reward += reward
        if done:
            break
        obs = next_obs
    return total_reward


# --------------------------------------------------------------------------- src/value_functions.py, src/policy.py


class TwinQ(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, hidden_dim: int = 256, n_hidden: int = 2) -> None:
        super().__init__()
        dims = [state_dim + action_dim, *([hidden_dim] * n_hidden), 1]
        self.q1 = mlp(dims, squeeze_output=True)
        self.q2 = mlp(dims, squeeze_output=True)

    def both(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sa = torch.cat([state, action], 1)
        return self.q1(sa), self.q2(sa)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.min(*self.both(state, action))


class ValueFunction(nn.Module):
    def __init__(self, state_dim: int, hidden_dim: int = 256, n_hidden: int = 2, squeeze_output: bool = True) -> None:
        super().__init__()
        dims = [state_dim, *([hidden_dim] * n_hidden), 1]
        self.v = mlp(dims, squeeze_output=squeeze_output)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.v(state)


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden_dim: int = 256, n_hidden: int = 2) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *([hidden_dim] * n_hidden), act_dim])
        self.log_std = nn.Parameter(torch.zeros(act_dim, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> MultivariateNormal:
        mean = self.net(obs)
        std = torch.exp(self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))
        return MultivariateNormal(mean, scale_tril=torch.diag(std))

    def act(self, obs: torch.Tensor, deterministic: bool = False, enable_grad: bool = False) -> torch.Tensor:
        with torch.set_grad_enabled(enable_grad):
            dist = self(obs)
            return dist.mean if deterministic else dist.sample()


# --------------------------------------------------------------------------- src/iql.py


def asymmetric_l2_loss(u: torch.Tensor, tau: float) -> torch.Tensor:
    return torch.mean(torch.abs(tau - (u < 0).float()) * u**2)


class ImplicitQLearning(nn.Module):
    def __init__(self, qf: TwinQ, vf: ValueFunction, policy: GaussianPolicy, optimizer_factory, max_steps: int,
                 tau: float, beta: float, discount: float = 0.99, alpha: float = 0.005, nx: Nndx | None = None,
                 variant: str = "healthy") -> None:  # fmt: skip
        super().__init__()
        self.qf = qf
        self.q_target = copy.deepcopy(qf).requires_grad_(False)
        self.vf = vf
        self.policy = policy
        self.v_optimizer = optimizer_factory(self.vf.parameters())
        self.q_optimizer = optimizer_factory(self.qf.parameters())
        self.policy_optimizer = optimizer_factory(self.policy.parameters())
        self.policy_lr_schedule = CosineAnnealingLR(self.policy_optimizer, max_steps)
        self.tau, self.beta, self.discount, self.alpha = tau, beta, discount, alpha
        self.nx, self.variant = nx, variant
        self.mon_v = self.mon_q = self.mon_policy = None

    def update(self, observations, actions, next_observations, rewards, terminals) -> dict[str, float]:
        with torch.no_grad():
            target_q = self.q_target(observations, actions)
            next_v = self.vf(next_observations)

        if self.mon_q is None:  # the author's preflight, at the first batch there is
            probe_targets = rewards + (1.0 - terminals.float()) * self.discount * next_v.detach()
            self.nx.preflight(self.qf, ((observations, actions), probe_targets), F.mse_loss, optimizer=self.q_optimizer)
            self.mon_v = self.nx.monitor(self.vf, self.v_optimizer, every=10)
            self.mon_q = self.nx.monitor(self.qf, self.q_optimizer, every=10, loss_fn=F.mse_loss)
            self.mon_policy = self.nx.monitor(self.policy, self.policy_optimizer, every=10)

        # Update value function
        v = self.vf(observations)
        adv = target_q - v
        v_loss = asymmetric_l2_loss(adv, self.tau)
        self.v_optimizer.zero_grad(set_to_none=True)
        v_loss.backward()
        self.v_optimizer.step()
        self.nx.timed(lambda: self.mon_v.log(v_loss))

        # Update Q function
        targets = rewards + (1.0 - terminals.float()) * self.discount * next_v.detach()
        qs = self.qf.both(observations, actions)
        q_loss = sum(self.mon_q.loss_fn(q, targets) for q in qs) / len(qs)
        self.q_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_optimizer.step()
        self.nx.timed(lambda: self.mon_q.log(q_loss))

        # Update target Q network
        if self.variant == "target_never_updated":
            update_exponential_moving_average(self.q_target, self.q_target, self.alpha)
        else:
            update_exponential_moving_average(self.q_target, self.qf, self.alpha)

        # Update policy
        exp_adv = torch.exp(self.beta * adv.detach()).clamp(max=EXP_ADV_MAX)
        policy_out = self.policy(observations)
        bc_losses = -policy_out.log_prob(actions)
        policy_loss = torch.mean(exp_adv * bc_losses)
        self.policy_optimizer.zero_grad(set_to_none=True)
        policy_loss.backward()
        self.policy_optimizer.step()
        self.policy_lr_schedule.step()
        self.nx.timed(lambda: self.mon_policy.log(policy_loss))
        return {"v_loss": v_loss.item(), "q_loss": q_loss.item(), "policy_loss": policy_loss.item()}


# --------------------------------------------------------------------------- main.py


def set_seed(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.set_num_threads(1)
    raw, behaviour_return = collect_dataset(seed)
    dataset = {k: torch.from_numpy(v) for k, v in raw.items()}  # torchify
    env = PointGoal(seed + 100)
    obs_dim = dataset["observations"].shape[1]
    act_dim = dataset["actions"].shape[1]
    set_seed(seed)

    policy = GaussianPolicy(obs_dim, act_dim, hidden_dim=HIDDEN_DIM, n_hidden=N_HIDDEN)
    iql = ImplicitQLearning(
        qf=TwinQ(obs_dim, act_dim, hidden_dim=HIDDEN_DIM, n_hidden=N_HIDDEN),
        vf=ValueFunction(obs_dim, hidden_dim=HIDDEN_DIM, n_hidden=N_HIDDEN,
                         squeeze_output=variant != "value_not_squeezed"),
        policy=policy,
        optimizer_factory=lambda params: torch.optim.Adam(params, lr=LEARNING_RATE),
        max_steps=N_STEPS, tau=TAU, beta=BETA, alpha=ALPHA, discount=DISCOUNT, nx=nx, variant=variant,
    )  # fmt: skip

    returns: list[float] = []
    losses: dict[str, float] = {}
    for step in range(N_STEPS):
        losses = iql.update(**sample_batch(dataset, BATCH_SIZE))
        if (step + 1) % EVAL_PERIOD == 0:
            eval_returns = np.array([evaluate_policy(env, policy, MAX_EPISODE_STEPS) for _ in range(N_EVAL_EPISODES)])
            returns.append(float(eval_returns.mean()))

    if iql.mon_q is not None:
        nx.finish(iql.mon_v)
        nx.finish(iql.mon_q)
        nx.finish(iql.mon_policy)
    return {"final_return": returns[-1], "first_return": returns[0], "behaviour_return": behaviour_return,
            "final_q_loss": losses["q_loss"], "final_v_loss": losses["v_loss"]}  # fmt: skip
