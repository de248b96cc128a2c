"""Port of young-geng/CQL's SimpleSAC ``conservative_sac.py``: Conservative Q-Learning (CQL)
on top of SAC for offline RL: a tanh-Gaussian policy, twin Q functions and their soft-updated
targets, the CQL regulariser (a logsumexp over sampled actions' Q values minus the Q of the
dataset's action, weighted by ``cql_min_q_weight``) and automatic entropy tuning.

Source: github.com/young-geng/CQL, ``SimpleSAC/conservative_sac.py`` with
``SimpleSAC/model.py``, ``SimpleSAC/conservative_sac_main.py``, ``SimpleSAC/replay_buffer.py``
and ``SimpleSAC/sampler.py`` at commit 21efac46faadef7d24ecf03a8091ab9cc3a613fd (MIT,
Copyright (c) 2020 Xinyang Geng). Written anew from the facts of those files; no code
copied. Gym/D4RL are not installed: the environment (the data, not the program) is a small
continuous-control task written in numpy here, ``PointReach``: a point in [-1, 1]^2 (the
observation) moved by an action in [-1, 1]^2 scaled by 0.1, the reward minus the distance to
the origin after the move, terminal within 0.05 of it, 50 steps at most
(``max_traj_length``). The offline dataset (D4RL's role, ``qlearning_dataset``'s keys:
observations, actions, next_observations, rewards, terminals as ``dones``) is 60 episodes
of a noisy behaviour policy (a proportional controller towards the origin plus Gaussian
noise of std 0.6, clipped), collected once per seed before training.

Kept: ``ConservativeSAC.get_default_config`` (discount 0.99, alpha_multiplier 1,
automatic entropy tuning, no backup entropy, target_entropy ``-action_dim``, Adam,
soft_target_update_rate 5e-3 every step, cql_n_actions 10, importance sampling, no
Lagrange, cql_temp 1, cql_min_q_weight 5, no max-target backup, no diff clipping);
``FullyConnectedNetwork`` (ReLU hidden layers, the last layer xavier_uniform with gain
1e-2 and zero bias); ``TanhGaussianPolicy`` (mean and log-std from one network, the
``Scalar`` log-std multiplier 1 and offset -1, log-std clamped to [-20, 2], a
``TransformedDistribution(Normal, TanhTransform)`` with ``rsample``, ``repeat`` through
``extend_and_repeat``, deterministic = ``tanh(mean)``); ``FullyConnectedQFunction``
over ``cat([obs, act], -1)`` squeezed to (batch,), evaluated on (batch, n, act_dim)
actions by ``multiple_action_q_function``; ``soft_target_update`` on named parameters;
``train``: the alpha loss, the policy loss ``(alpha * log_pi - min(q1, q2)).mean()``, the
TD target ``rewards + (1 - dones) * discount * min(target_q1, target_q2)(next_obs,
pi(next_obs))``, the two MSEs against the detached target, the CQL terms (10 uniform
random actions, 10 policy actions at the observations and 10 at the next observations,
all detached, Q of them at the observations as in the source, importance-sampled with
``log(0.5 ** action_dim)`` and the log-probs, ``logsumexp`` over the 30, minus the
dataset-action Q, mean, times 5), ``qf_loss = qf1_loss + qf2_loss + cql_min_qf1_loss +
cql_min_qf2_loss``; the updates in the source's order (alpha, policy, Q: each
``zero_grad``, ``backward``, ``step``), then the target update; ``main``: rewards times
``reward_scale`` plus ``reward_bias`` (1, 0), actions clipped to +-0.999, the policy and
two Q functions with their ``deepcopy`` targets, per epoch ``n_train_step_per_epoch``
steps of ``subsample_batch`` + ``batch_to_torch`` + ``sac.train``, evaluation of the
deterministic policy (``SamplerPolicy``, ``TrajSampler``) at epoch 0 and every
``eval_period`` epochs, ``average_return`` the mean of the trajectories' summed rewards;
``set_random_seed``.
Shrunk: ``policy_arch``/``qf_arch`` '64-64' instead of '256-256', ``batch_size`` 64
instead of 256, 4 epochs of 250 steps instead of 2,000 of 1,000, ``eval_period`` 1 and
``eval_n_trajs`` 10 (instead of 10 and 5: the last evaluation is what is measured),
``policy_lr``/``qf_lr`` 1e-3 instead of 3e-4 (1,000 steps, not a million); no
WandB/viskit logging or model saving.
Measure only (not in the program): the last evaluation's ``average_return`` (the program's
own metric) and the behaviour policy's mean return on the dataset.

nndx, as the author would add it: as in the SAC and TD3 ports, the preflight
``nndx.probe`` runs at the first ``train`` call, on its batch: ``qf1`` with inputs
``(observations, actions)``, the detached ``td_target`` computed for them, the program's
``F.mse_loss`` and ``qf_optimizer``. Two ``nndx.Monitor``s around the loop: ``{"qf1",
"qf2"}`` with ``qf_optimizer`` (``qf1_loss``/``qf2_loss`` computed through
``mon_qf.loss_fn``; the whole ``qf_loss`` with the CQL terms logged) and the policy with
``policy_optimizer`` (``policy_loss`` logged); ``log_alpha`` is a ``Scalar`` module with
its own optimizer and is not watched. After training each Monitor's report is diagnosed
and the author reads them ranked together.
"""

from __future__ import annotations

import random
from copy import deepcopy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal
from torch.distributions.transformed_distribution import TransformedDistribution
from torch.distributions.transforms import TanhTransform

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cql"
SOURCE = Source("young-geng/CQL", "SimpleSAC/conservative_sac.py", "21efac46faadef7d24ecf03a8091ab9cc3a613fd", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: '64-64', batch 64, 1,000 steps)"),
        Variant(
            "policy_actions_detached",
            "new_actions.detach() before q_new_actions = min(qf1, qf2)(observations, new_actions) (the 'fix' offered "
            "for the in-place autograd error CQL trainers hit): no gradient of Q reaches the policy, which only "
            "follows the entropy term alpha * log_pi",
            (C.DETACHED_GRAPH,),
            ("https://github.com/aviralkumar2907/CQL/issues/5",
             "https://github.com/TianhongDai/reinforcement-learning-algorithms/issues/8",
             "https://github.com/vwxyzjn/cleanrl/pull/270"),
            Measure("final_return", "last evaluation average_return at least 1 below the healthy run's (the "
                    "behaviour policy scores about -3.9, a policy that does not move about -37)",
                    lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
        Variant(
            "qf_zero_grad_missing",
            "self.qf_optimizer.zero_grad() left out of train: the Q functions' gradients (and the policy loss's "
            "gradients that reach them) accumulate over all steps",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/IDEA-Research/DN-DETR/issues/19", "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("final_return", "last evaluation average_return at least 1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
    )
}

ARCH, BATCH_SIZE, N_EPOCHS, N_TRAIN_STEP_PER_EPOCH, EVAL_PERIOD, EVAL_N_TRAJS = "64-64", 64, 4, 250, 1, 10
LR, MAX_TRAJ_LENGTH, N_DATASET_EPISODES, CLIP_ACTION = 1e-3, 50, 60, 0.999


# --------------------------------------------------------------------------- the environment and dataset (the data)


class PointReach:
    """Move a point to the origin (see the module docstring); gym's old reset/step API."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)
        self.pos = np.zeros(2)

    def reset(self) -> np.ndarray:
        self.pos = self.rng.uniform(-1.0, 1.0, size=2)
        return self.pos.astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        dist = float(np.linalg.norm(self.pos))
        return self.pos.astype(np.float32), -dist, dist < 0.05, {}


def collect_dataset(seed: int) -> tuple[dict[str, np.ndarray], float]:
    """The offline dataset of a noisy behaviour policy (qlearning_dataset's keys)."""
    env, rng = PointReach(seed + 1000), np.random.RandomState(seed + 2000)
    keys = ("observations", "actions", "next_observations", "rewards", "dones")
    data: dict[str, list] = {k: [] for k in keys}
    returns = []
    for _ in range(N_DATASET_EPISODES):
        obs, total = env.reset(), 0.0
        for _ in range(MAX_TRAJ_LENGTH):
            action = np.clip(-3.0 * obs + rng.normal(0.0, 0.6, size=2), -1.0, 1.0).astype(np.float32)
            next_obs, reward, done, _ = env.step(action)
            for k, v in zip(keys, (obs, action, next_obs, reward, float(done))):
                data[k].append(v)
            obs, total = next_obs, total + reward
            if done:
                break
        returns.append(total)
    dataset = {k: np.asarray(v, dtype=np.float32) for k, v in data.items()}
    return dataset, float(np.mean(returns))


# --------------------------------------------------------------------------- model.py


def extend_and_repeat(tensor: torch.Tensor, dim: int, repeat: int) -> torch.Tensor:
    shape = [1] * (tensor.ndim + 1)
    shape[dim] = repeat
    return torch.unsqueeze(tensor, dim) * tensor.new_ones(shape)


def soft_target_update(network: nn.Module, target_network: nn.Module, rate: float) -> None:
    target_params = dict(target_network.named_parameters())
    for k, v in network.named_parameters():
        target_params[k].data = (1 - rate) * target_params[k].data + rate * v.data


class FullyConnectedNetwork(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, arch: str = "256-256") -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = input_dim
        for h in (int(s) for s in arch.split("-")):
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        last_fc = nn.Linear(d, output_dim)
        nn.init.xavier_uniform_(last_fc.weight, gain=1e-2)
        nn.init.constant_(last_fc.bias, 0.0)
        layers.append(last_fc)
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


class Scalar(nn.Module):
    def __init__(self, init_value: float) -> None:
        super().__init__()
        self.constant = nn.Parameter(torch.tensor(init_value, dtype=torch.float32))

    def forward(self) -> torch.Tensor:
        return self.constant


class ReparameterizedTanhGaussian(nn.Module):
    def __init__(self, log_std_min: float = -20.0, log_std_max: float = 2.0) -> None:
        super().__init__()
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, mean: torch.Tensor, log_std: torch.Tensor, deterministic: bool = False):
        std = torch.exp(torch.clamp(log_std, self.log_std_min, self.log_std_max))
        dist = TransformedDistribution(Normal(mean, std), TanhTransform(cache_size=1))
        sample = torch.tanh(mean) if deterministic else dist.rsample()
        return sample, torch.sum(dist.log_prob(sample), dim=-1)


class TanhGaussianPolicy(nn.Module):
    def __init__(self, observation_dim: int, action_dim: int, arch: str = "256-256",
                 log_std_multiplier: float = 1.0, log_std_offset: float = -1.0) -> None:  # fmt: skip
        super().__init__()
        self.action_dim = action_dim
        self.base_network = FullyConnectedNetwork(observation_dim, 2 * action_dim, arch)
        self.log_std_multiplier = Scalar(log_std_multiplier)
        self.log_std_offset = Scalar(log_std_offset)
        self.tanh_gaussian = ReparameterizedTanhGaussian()

    def forward(self, observations: torch.Tensor, deterministic: bool = False, repeat: int | None = None):
        if repeat is not None:
            observations = extend_and_repeat(observations, 1, repeat)
        mean, log_std = torch.split(self.base_network(observations), self.action_dim, dim=-1)
        log_std = self.log_std_multiplier() * log_std + self.log_std_offset()
        return self.tanh_gaussian(mean, log_std, deterministic)


class FullyConnectedQFunction(nn.Module):
    def __init__(self, observation_dim: int, action_dim: int, arch: str = "256-256") -> None:
        super().__init__()
        self.network = FullyConnectedNetwork(observation_dim + action_dim, 1, arch)

    def forward(self, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        multiple = actions.ndim == 3 and observations.ndim == 2
        batch_size = observations.shape[0]
        if multiple:  # multiple_action_q_function
            observations = extend_and_repeat(observations, 1, actions.shape[1]).reshape(-1, observations.shape[-1])
            actions = actions.reshape(-1, actions.shape[-1])
        q = torch.squeeze(self.network(torch.cat([observations, actions], dim=-1)), dim=-1)
        return q.reshape(batch_size, -1) if multiple else q


# --------------------------------------------------------------------------- conservative_sac.py


class ConservativeSAC:
    def __init__(self, policy, qf1, qf2, target_qf1, target_qf2, target_entropy: float, nx: Nndx, variant: str):
        self.discount, self.alpha_multiplier, self.target_entropy = 0.99, 1.0, target_entropy
        self.soft_target_update_rate, self.target_update_period = 5e-3, 1
        self.cql_n_actions, self.cql_temp, self.cql_min_q_weight = 10, 1.0, 5.0
        self.policy, self.qf1, self.qf2, self.target_qf1, self.target_qf2 = policy, qf1, qf2, target_qf1, target_qf2
        self.policy_optimizer = torch.optim.Adam(self.policy.parameters(), LR)
        self.qf_optimizer = torch.optim.Adam(list(self.qf1.parameters()) + list(self.qf2.parameters()), LR)
        self.log_alpha = Scalar(0.0)
        self.alpha_optimizer = torch.optim.Adam(self.log_alpha.parameters(), lr=LR)
        self.update_target_network(1.0)
        self._total_steps = 0
        self.nx, self.variant = nx, variant

        self.mon_qf = self.mon_policy = None
        self.probe_batch = None

    def update_target_network(self, rate: float) -> None:
        soft_target_update(self.qf1, self.target_qf1, rate)
        soft_target_update(self.qf2, self.target_qf2, rate)

    def train(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        self._total_steps += 1
        observations, actions, rewards = batch["observations"], batch["actions"], batch["rewards"]
        next_observations, dones = batch["next_observations"], batch["dones"]

        new_actions, log_pi = self.policy(observations)
        alpha_loss = -(self.log_alpha() * (log_pi + self.target_entropy).detach()).mean()
        alpha = self.log_alpha().exp() * self.alpha_multiplier

        if self.variant == "policy_actions_detached":
            new_actions = new_actions.detach()
        q_new_actions = torch.min(self.qf1(observations, new_actions), self.qf2(observations, new_actions))
        policy_loss = (alpha * log_pi - q_new_actions).mean()

        q1_pred = self.qf1(observations, actions)
        q2_pred = self.qf2(observations, actions)
        new_next_actions, _ = self.policy(next_observations)
        target_q_values = torch.min(self.target_qf1(next_observations, new_next_actions),
                                    self.target_qf2(next_observations, new_next_actions))  # fmt: skip
        td_target = rewards + (1.0 - dones) * self.discount * target_q_values

        if self.probe_batch is None:  # the author's preflight, on the first batch there is
            self.probe_batch = ((observations, actions), td_target.detach())
            self.nx.preflight(self.qf1, self.probe_batch, F.mse_loss, optimizer=self.qf_optimizer)
            self.mon_qf = self.nx.monitor({"qf1": self.qf1, "qf2": self.qf2}, self.qf_optimizer, every=10,
                                          loss_fn=F.mse_loss)  # fmt: skip
            self.mon_policy = self.nx.monitor(self.policy, self.policy_optimizer, every=10)

        qf1_loss = self.mon_qf.loss_fn(q1_pred, td_target.detach())
        qf2_loss = self.mon_qf.loss_fn(q2_pred, td_target.detach())

        batch_size, action_dim = actions.shape[0], actions.shape[-1]
        cql_random_actions = actions.new_empty((batch_size, self.cql_n_actions, action_dim)).uniform_(-1, 1)
        cql_current_actions, cql_current_log_pis = self.policy(observations, repeat=self.cql_n_actions)
        cql_next_actions, cql_next_log_pis = self.policy(next_observations, repeat=self.cql_n_actions)
        cql_current_actions, cql_current_log_pis = cql_current_actions.detach(), cql_current_log_pis.detach()
        cql_next_actions, cql_next_log_pis = cql_next_actions.detach(), cql_next_log_pis.detach()

        cql_q1_rand, cql_q2_rand = self.qf1(observations, cql_random_actions), self.qf2(observations, cql_random_actions)
        cql_q1_current = self.qf1(observations, cql_current_actions)
        cql_q2_current = self.qf2(observations, cql_current_actions)
        cql_q1_next = self.qf1(observations, cql_next_actions)
        cql_q2_next = self.qf2(observations, cql_next_actions)

        random_density = np.log(0.5**action_dim)
        cql_cat_q1 = torch.cat([cql_q1_rand - random_density, cql_q1_next - cql_next_log_pis,
                                cql_q1_current - cql_current_log_pis], dim=1)  # fmt: skip
        cql_cat_q2 = torch.cat([cql_q2_rand - random_density, cql_q2_next - cql_next_log_pis,
                                cql_q2_current - cql_current_log_pis], dim=1)  # fmt: skip
        cql_qf1_ood = torch.logsumexp(cql_cat_q1 / self.cql_temp, dim=1) * self.cql_temp
        cql_qf2_ood = torch.logsumexp(cql_cat_q2 / self.cql_temp, dim=1) * self.cql_temp
        cql_qf1_diff = (cql_qf1_ood - q1_pred).mean()
        cql_qf2_diff = (cql_qf2_ood - q2_pred).mean()
        cql_min_qf1_loss = cql_qf1_diff * self.cql_min_q_weight
        cql_min_qf2_loss = cql_qf2_diff * self.cql_min_q_weight
        qf_loss = qf1_loss + qf2_loss + cql_min_qf1_loss + cql_min_qf2_loss

        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()

        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        self.policy_optimizer.step()
        self.nx.timed(lambda: self.mon_policy.log(policy_loss))

        if self.variant != "qf_zero_grad_missing":
            self.qf_optimizer.zero_grad()
        qf_loss.backward()
        self.qf_optimizer.step()
        self.nx.timed(lambda: self.mon_qf.log(qf_loss))

        if self._total_steps % self.target_update_period == 0:
            self.update_target_network(self.soft_target_update_rate)
        return {"policy_loss": policy_loss.item(), "qf1_loss": qf1_loss.item(), "alpha": alpha.item(),
                "average_qf1": q1_pred.mean().item(), "cql_qf1_diff": cql_qf1_diff.item()}  # fmt: skip


# --------------------------------------------------------------------------- conservative_sac_main.py


def evaluate(policy: TanhGaussianPolicy, env: PointReach, n_trajs: int) -> float:
    """TrajSampler.sample with SamplerPolicy(deterministic=True): the mean summed reward."""
    returns = []
    for _ in range(n_trajs):
        obs, total = env.reset(), 0.0
        for _ in range(MAX_TRAJ_LENGTH):
            with torch.no_grad():
                action, _ = policy(torch.tensor(obs[None], dtype=torch.float32), deterministic=True)
            obs, reward, done, _ = env.step(action.numpy()[0])
            total += reward
            if done:
                break
        returns.append(total)
    return float(np.mean(returns))


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(seed)
    torch.manual_seed(seed)
    random.seed(seed)
    eval_env = PointReach(seed + 100)
    dataset, behaviour_return = collect_dataset(seed)
    dataset["rewards"] = dataset["rewards"] * 1.0 + 0.0  # reward_scale, reward_bias
    dataset["actions"] = np.clip(dataset["actions"], -CLIP_ACTION, CLIP_ACTION)
    obs_dim, action_dim = dataset["observations"].shape[1], dataset["actions"].shape[1]

    policy = TanhGaussianPolicy(obs_dim, action_dim, arch=ARCH, log_std_multiplier=1.0, log_std_offset=-1.0)
    qf1 = FullyConnectedQFunction(obs_dim, action_dim, arch=ARCH)
    target_qf1 = deepcopy(qf1)
    qf2 = FullyConnectedQFunction(obs_dim, action_dim, arch=ARCH)
    target_qf2 = deepcopy(qf2)
    sac = ConservativeSAC(policy, qf1, qf2, target_qf1, target_qf2, -float(action_dim), nx, variant)

    returns: list[float] = []
    metrics: dict[str, float] = {}
    n = dataset["observations"].shape[0]
    for epoch in range(N_EPOCHS):
        for _ in range(N_TRAIN_STEP_PER_EPOCH):
            indices = np.random.randint(n, size=BATCH_SIZE)  # subsample_batch
            batch = {k: torch.from_numpy(v[indices, ...]) for k, v in dataset.items()}  # batch_to_torch
            metrics = sac.train(batch)
        if epoch == 0 or (epoch + 1) % EVAL_PERIOD == 0:
            returns.append(evaluate(policy, eval_env, EVAL_N_TRAJS))

    if sac.mon_qf is not None:
        nx.finish(sac.mon_qf)
        nx.finish(sac.mon_policy)
    return {"final_return": returns[-1], "first_return": returns[0], "behaviour_return": behaviour_return,
            "final_qf1_loss": metrics["qf1_loss"], "final_average_qf1": metrics["average_qf1"]}  # fmt: skip
