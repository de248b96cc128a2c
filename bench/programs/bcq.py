"""Port of sfujim/BCQ (continuous): Batch-Constrained deep Q-learning, trained offline from a
fixed buffer. A conditional VAE models the buffer's actions; a perturbation actor nudges VAE
samples by at most ``phi * max_action``; twin critics learn from a soft clipped double-Q
target (``lmbda * min + (1 - lmbda) * max`` over the target critics, the max over 10 VAE
samples per next state); the target networks follow by Polyak averaging; the policy picks,
among 100 perturbed VAE samples, the one the first critic values most.

Source: github.com/sfujim/BCQ, ``continuous_BCQ/BCQ.py`` (``Actor``, ``Critic``, ``VAE``,
``BCQ``), ``continuous_BCQ/main.py`` (``interact_with_environment`` with
``--generate_buffer``, ``train_BCQ``, ``eval_policy``) and ``continuous_BCQ/utils.py``
(``ReplayBuffer``) at commit 4876f7e5afa9eb2981feec5daf67202514477518 (MIT, Copyright (c) 2020
Scott Fujimoto). Written anew from the facts of those files; no code copied.

Kept: the three networks (``Actor``: ``[s, a]`` -> ReLU -> ReLU -> ``phi * max_action *
tanh``, added to the action and clamped; ``Critic``: two ReLU MLPs on ``[s, a]``, ``q1``
alone for the actor; ``VAE``: encoder on ``[s, a]`` to a mean and a ``log_std`` clamped to
[-4, 15], ``z = mean + std * randn_like``, decoder on ``[s, z]`` to ``max_action * tanh``,
sampling with ``z ~ N(0, 1)`` clamped to [-0.5, 0.5]; ``latent_dim = 2 * action_dim``); the
optimizers (``Adam`` lr 1e-3 for actor and critic, ``Adam()`` default for the VAE); the
targets as ``copy.deepcopy``; ``BCQ.train`` line by line: VAE loss ``mse_loss(recon, action)
+ 0.5 * KL`` with ``KL = -0.5 * (1 + log(std^2) - mean^2 - std^2).mean()``, ``zero_grad``,
``backward``, ``step``; the critic target under ``no_grad`` from
``repeat_interleave(next_state, 10, 0)``, the soft clipped double Q (``lmbda`` 0.75), the max
over the 10 samples reshaped back to ``(batch_size, 1)``, ``reward + not_done * discount *
target_Q``; ``critic_loss = mse(Q1, target) + mse(Q2, target)``; the actor loss
``-critic.q1(state, actor(state, vae.decode(state))).mean()`` (its backward also reaches the
critic and the VAE decoder, as in the original); the soft updates ``target_param.data.copy_(tau
* param.data + (1 - tau) * target_param.data)`` (tau 0.005); ``select_action`` (100 copies of
the state, argmax of ``q1``); ``ReplayBuffer`` (numpy arrays, ``not_done = 1 - done``,
``sample`` by ``np.random.randint``, ``FloatTensor``s); the buffer generation of
``main.py`` (a trained behavioural policy acting with probability ``rand_action_p`` 0.3 a
uniformly random action, else its action plus ``N(0, max_action * gaussian_std)`` with
``gaussian_std`` 0.3, clipped; ``done_bool = 0`` at the time limit); ``train_BCQ``'s loop
(``policy.train(replay_buffer, iterations=eval_freq, batch_size)`` then ``eval_policy``, 10
episodes on an environment seeded ``seed + 100``); discount 0.99, batch size 100.
Shrunk / replaced: no gym: a 2-D point mass with inertia written here (state: position and
velocity, action: a force in [-1, 1]^2, ``v <- 0.9 v + 0.2 a``, ``p <- p + 0.2 v``, reward
``-|p|`` after the move minus ``0.05 |a|^2``, an episode ends after 60 steps or, with
``done``, when the mass leaves the disc of radius 4); the behavioural policy is a PD
controller written here instead of a DDPG trained by ``--train_behavioral``; 30,000
transitions (instead of 1e6); hidden widths 64 (instead of 400/300 and 750); 2,000 training
iterations (instead of 1e6), evaluated every 500 (instead of 5e3); CPU.
Measure only (not in the program): the average return of the last evaluation and of the
behavioural policy with its noise, the final VAE reconstruction loss and the mean Q of the
buffer's first 1,000 state-action pairs.

nndx, as the author would add it: three networks, three optimizers, so three Monitors:
``nndx.Monitor(vae, vae_optimizer)``, ``nndx.Monitor(critic, critic_optimizer)`` and
``nndx.Monitor(actor, actor_optimizer)``, attached at the first iteration, each logging its
own loss every iteration after its step; a preflight ``nndx.probe`` of the VAE on the first
sampled batch ``((state, action), action)`` with its loss, and of the critic on ``((state,
action), target_Q)`` (the first target computed) with its loss (the sum of the two critics'
MSEs), each with its optimizer; after training
``nndx.probe(..., monitor=mon)`` of the VAE and of the critic on the same batches, and the
actor's Monitor alone (its loss needs the critic); the author reads them all, ranked together.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bcq"
SOURCE = Source("sfujim/BCQ", "continuous_BCQ/BCQ.py", "4876f7e5afa9eb2981feec5daf67202514477518", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: a 2-D point mass, 30k transitions from a noisy PD "
                "controller, widths 64, 2,000 iterations)"),
        Variant(
            "target_q_not_reshaped",
            "the max over the 10 VAE samples is taken as target_Q.reshape(batch_size, -1).max(1)[0] without the "
            "final .reshape(-1, 1): reward (100, 1) + not_done (100, 1) * discount * target_Q (100,) broadcasts "
            "to (100, 100), and mse_loss against Q (100, 1) fits every Q to its reward plus the discounted mean "
            "of the whole batch's next values (torch only warns)",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/hungtuchen/pytorch-dqn/issues/3",
             "https://github.com/thu-ml/tianshou/issues/43",
             "https://github.com/thu-ml/tianshou/issues/945"),
            Measure("q_std_buffer", "the spread of Q over the buffer's state-action pairs at most 0.6x the healthy "
                    "run's (the Q no longer tells states apart beyond their reward): 0.62 against 4.37 on seed 0 "
                    "(last evaluation return -31.2 against -23.4; the noisy behaviour policy -36.4)",
                    lambda healthy, buggy: not buggy > 0.6 * healthy),
        ),
        Variant(
            "vae_zero_grad_missing",
            "self.vae_optimizer.zero_grad() is left out of the VAE step: the VAE's gradients (and those the actor "
            "loss sends into the decoder) accumulate over all iterations, so Adam steps along the running sum "
            "of every past gradient",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/IDEA-Research/DN-DETR/issues/19",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7"),
            Measure("vae_recon_loss", "the final VAE reconstruction loss on the buffer at least 1.5x the healthy "
                    "run's: 0.266 against 0.123 on seed 0 (the return is not worse: -16.9 against -23.4)", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

HIDDEN, BUFFER_SIZE, ITERATIONS, EVAL_FREQ, BATCH_SIZE = 64, 30_000, 2_000, 500, 100
ARGS = {"discount": 0.99, "tau": 0.005, "lmbda": 0.75, "phi": 0.05, "rand_action_p": 0.3, "gaussian_std": 0.3}


# --------------------------------------------------------------------------- the environment (replaces gym)


class PointMass:
    """2-D point mass with inertia; ``reset``/``step`` in gym's old API."""

    _max_episode_steps = 60
    state_dim, action_dim, max_action = 4, 2, 1.0

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(4)

    def reset(self) -> np.ndarray:
        self.state = np.concatenate([self.rng.uniform(-2.5, 2.5, 2), self.rng.uniform(-0.5, 0.5, 2)])
        self.t = 0
        return self.state.copy()

    def sample_action(self) -> np.ndarray:  # env.action_space.sample()
        return self.rng.uniform(-self.max_action, self.max_action, self.action_dim)

    def step(self, action: np.ndarray):
        action = np.clip(action, -self.max_action, self.max_action)
        p, v = self.state[:2], self.state[2:]
        v = 0.9 * v + 0.2 * action
        p = p + 0.2 * v
        self.state = np.concatenate([p, v])
        self.t += 1
        reward = -float(np.linalg.norm(p)) - 0.05 * float(action @ action)
        done = bool(np.linalg.norm(p) > 4.0) or self.t >= self._max_episode_steps
        return self.state.copy(), reward, done, {}


def behavioural_action(state: np.ndarray) -> np.ndarray:
    """The behavioural policy (a PD controller, in place of the trained DDPG)."""
    return np.clip(-0.6 * state[:2] - 1.2 * state[2:], -1.0, 1.0)


# --------------------------------------------------------------------------- continuous_BCQ/utils.py


class ReplayBuffer:
    def __init__(self, state_dim, action_dim, max_size=int(1e6)):
        self.max_size, self.ptr, self.size = max_size, 0, 0
        self.state = np.zeros((max_size, state_dim))
        self.action = np.zeros((max_size, action_dim))
        self.next_state = np.zeros((max_size, state_dim))
        self.reward = np.zeros((max_size, 1))
        self.not_done = np.zeros((max_size, 1))

    def add(self, state, action, next_state, reward, done):
        self.state[self.ptr] = state
        self.action[self.ptr] = action
        self.next_state[self.ptr] = next_state
        self.reward[self.ptr] = reward
        self.not_done[self.ptr] = 1.0 - done
        self.ptr = (self.ptr + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def sample(self, batch_size):
        ind = np.random.randint(0, self.size, size=batch_size)
        return (torch.FloatTensor(self.state[ind]), torch.FloatTensor(self.action[ind]),
                torch.FloatTensor(self.next_state[ind]), torch.FloatTensor(self.reward[ind]),
                torch.FloatTensor(self.not_done[ind]))  # fmt: skip


# --------------------------------------------------------------------------- continuous_BCQ/BCQ.py


class Actor(nn.Module):
    def __init__(self, state_dim, action_dim, max_action, phi=0.05):
        super().__init__()
        self.l1 = nn.Linear(state_dim + action_dim, HIDDEN)
        self.l2 = nn.Linear(HIDDEN, HIDDEN)
        self.l3 = nn.Linear(HIDDEN, action_dim)
        self.max_action = max_action
        self.phi = phi

    def forward(self, state, action):
        a = F.relu(self.l1(torch.cat([state, action], 1)))
        a = F.relu(self.l2(a))
        a = self.phi * self.max_action * torch.tanh(self.l3(a))
        return (a + action).clamp(-self.max_action, self.max_action)


class Critic(nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.l1 = nn.Linear(state_dim + action_dim, HIDDEN)
        self.l2 = nn.Linear(HIDDEN, HIDDEN)
        self.l3 = nn.Linear(HIDDEN, 1)
        self.l4 = nn.Linear(state_dim + action_dim, HIDDEN)
        self.l5 = nn.Linear(HIDDEN, HIDDEN)
        self.l6 = nn.Linear(HIDDEN, 1)

    def forward(self, state, action):
        q1 = F.relu(self.l1(torch.cat([state, action], 1)))
        q1 = F.relu(self.l2(q1))
        q1 = self.l3(q1)
        q2 = F.relu(self.l4(torch.cat([state, action], 1)))
        q2 = F.relu(self.l5(q2))
        q2 = self.l6(q2)
        return q1, q2

    def q1(self, state, action):
        q1 = F.relu(self.l1(torch.cat([state, action], 1)))
        q1 = F.relu(self.l2(q1))
        return self.l3(q1)


class VAE(nn.Module):
    def __init__(self, state_dim, action_dim, latent_dim, max_action):
        super().__init__()
        self.e1 = nn.Linear(state_dim + action_dim, HIDDEN)
        self.e2 = nn.Linear(HIDDEN, HIDDEN)
        self.mean = nn.Linear(HIDDEN, latent_dim)
        self.log_std = nn.Linear(HIDDEN, latent_dim)
        self.d1 = nn.Linear(state_dim + latent_dim, HIDDEN)
        self.d2 = nn.Linear(HIDDEN, HIDDEN)
        self.d3 = nn.Linear(HIDDEN, action_dim)
        self.max_action = max_action
        self.latent_dim = latent_dim

    def forward(self, state, action):
        z = F.relu(self.e1(torch.cat([state, action], 1)))
        z = F.relu(self.e2(z))
        mean = self.mean(z)
        log_std = self.log_std(z).clamp(-4, 15)  # clamped for numerical stability
        std = torch.exp(log_std)
        z = mean + std * torch.randn_like(std)
        u = self.decode(state, z)
        return u, mean, std

    def decode(self, state, z=None):
        if z is None:  # sampling: the latent clipped to [-0.5, 0.5]
            z = torch.randn((state.shape[0], self.latent_dim)).clamp(-0.5, 0.5)
        a = F.relu(self.d1(torch.cat([state, z], 1)))
        a = F.relu(self.d2(a))
        return self.max_action * torch.tanh(self.d3(a))


def vae_loss_fn(out, action):
    recon, mean, std = out
    recon_loss = F.mse_loss(recon, action)
    KL_loss = -0.5 * (1 + torch.log(std.pow(2)) - mean.pow(2) - std.pow(2)).mean()  # noqa: N806
    return recon_loss + 0.5 * KL_loss


def critic_loss_fn(out, target_Q):  # noqa: N803
    current_Q1, current_Q2 = out  # noqa: N806
    return F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)


class BCQ:
    def __init__(self, state_dim, action_dim, max_action, nx: Nndx, variant: str, discount=0.99, tau=0.005,
                 lmbda=0.75, phi=0.05):  # fmt: skip
        latent_dim = action_dim * 2
        self.actor = Actor(state_dim, action_dim, max_action, phi)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=1e-3)
        self.critic = Critic(state_dim, action_dim)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=1e-3)
        self.vae = VAE(state_dim, action_dim, latent_dim, max_action)
        self.vae_optimizer = torch.optim.Adam(self.vae.parameters())
        self.max_action, self.action_dim = max_action, action_dim
        self.discount, self.tau, self.lmbda = discount, tau, lmbda
        self.nx, self.variant = nx, variant
        self.mons = None
        self.critic_batch = self.vae_batch = None

    def select_action(self, state):
        with torch.no_grad():
            state = torch.FloatTensor(state.reshape(1, -1)).repeat(100, 1)
            action = self.actor(state, self.vae.decode(state))
            q1 = self.critic.q1(state, action)
            ind = q1.argmax(0)
        return action[ind].cpu().data.numpy().flatten()

    def train(self, replay_buffer, iterations, batch_size=100):
        nx = self.nx
        for _ in range(iterations):
            state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)

            first = self.mons is None
            if first:  # the author's preflight of the VAE on the first batch there is, and the three Monitors
                self.vae_batch = ((state, action), action)
                nx.preflight(self.vae, self.vae_batch, vae_loss_fn, optimizer=self.vae_optimizer)
                self.mons = (nx.monitor(self.vae, self.vae_optimizer, every=10),
                             nx.monitor(self.critic, self.critic_optimizer, every=10),
                             nx.monitor(self.actor, self.actor_optimizer, every=10))  # fmt: skip
            mon_vae, mon_critic, mon_actor = self.mons

            # Variational Auto-Encoder Training
            recon, mean, std = self.vae(state, action)
            recon_loss = F.mse_loss(recon, action)
            KL_loss = -0.5 * (1 + torch.log(std.pow(2)) - mean.pow(2) - std.pow(2)).mean()  # noqa: N806
            vae_loss = recon_loss + 0.5 * KL_loss
            if self.variant != "vae_zero_grad_missing":
                self.vae_optimizer.zero_grad()
            vae_loss.backward()
            self.vae_optimizer.step()
            nx.timed(lambda: mon_vae.log(vae_loss))  # noqa: B023

            # Critic Training
            with torch.no_grad():
                next_state = torch.repeat_interleave(next_state, 10, 0)
                target_Q1, target_Q2 = self.critic_target(  # noqa: N806
                    next_state, self.actor_target(next_state, self.vae.decode(next_state)))
                target_Q = self.lmbda * torch.min(target_Q1, target_Q2) + (1.0 - self.lmbda) * torch.max(  # noqa: N806
                    target_Q1, target_Q2)
                if self.variant == "target_q_not_reshaped":
                    target_Q = target_Q.reshape(batch_size, -1).max(1)[0]  # noqa: N806
                else:
                    target_Q = target_Q.reshape(batch_size, -1).max(1)[0].reshape(-1, 1)  # noqa: N806
                target_Q = reward + not_done * self.discount * target_Q  # noqa: N806

            if first:  # the critic's preflight, on the first target there is
                self.critic_batch = ((state, action), target_Q)
                nx.preflight(self.critic, self.critic_batch, critic_loss_fn, optimizer=self.critic_optimizer)

            current_Q1, current_Q2 = self.critic(state, action)  # noqa: N806
            critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)
            self.critic_optimizer.zero_grad()
            critic_loss.backward()
            self.critic_optimizer.step()
            nx.timed(lambda: mon_critic.log(critic_loss))  # noqa: B023

            # Pertubation Model / Action Training
            sampled_actions = self.vae.decode(state)
            perturbed_actions = self.actor(state, sampled_actions)
            actor_loss = -self.critic.q1(state, perturbed_actions).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            nx.timed(lambda: mon_actor.log(actor_loss))  # noqa: B023

            # Update Target Networks
            for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
            for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)


# --------------------------------------------------------------------------- continuous_BCQ/main.py


def eval_policy(select_action, seed: int, eval_episodes: int = 10) -> float:
    eval_env = PointMass(seed + 100)
    avg_reward = 0.0
    for _ in range(eval_episodes):
        state, done = eval_env.reset(), False
        while not done:
            state, reward, done, _ = eval_env.step(select_action(np.array(state)))
            avg_reward += reward
    return avg_reward / eval_episodes


def generate_buffer(env: PointMass, args: dict) -> ReplayBuffer:
    """interact_with_environment with --generate_buffer (the behavioural policy loaded)."""
    replay_buffer = ReplayBuffer(env.state_dim, env.action_dim)
    state, done = env.reset(), False
    episode_timesteps = 0
    for _ in range(BUFFER_SIZE):
        episode_timesteps += 1
        if np.random.uniform(0, 1) < args["rand_action_p"]:
            action = env.sample_action()
        else:
            action = (behavioural_action(np.array(state))
                      + np.random.normal(0, env.max_action * args["gaussian_std"], size=env.action_dim)
                      ).clip(-env.max_action, env.max_action)  # fmt: skip
        next_state, reward, done, _ = env.step(action)
        done_bool = float(done) if episode_timesteps < env._max_episode_steps else 0
        replay_buffer.add(state, action, next_state, reward, done_bool)
        state = next_state
        if done:
            state, done = env.reset(), False
            episode_timesteps = 0
    return replay_buffer


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    env = PointMass(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    replay_buffer = generate_buffer(env, ARGS)

    noisy_behaviour = eval_policy(lambda s: (
        env.sample_action() if np.random.uniform(0, 1) < ARGS["rand_action_p"]
        else (behavioural_action(s) + np.random.normal(0, ARGS["gaussian_std"], size=2)).clip(-1, 1)), seed)

    policy = BCQ(env.state_dim, env.action_dim, env.max_action, nx, variant, ARGS["discount"], ARGS["tau"],
                 ARGS["lmbda"], ARGS["phi"])  # fmt: skip
    evaluations = []
    training_iters = 0
    while training_iters < ITERATIONS:
        policy.train(replay_buffer, iterations=EVAL_FREQ, batch_size=BATCH_SIZE)
        evaluations.append(eval_policy(policy.select_action, seed))
        training_iters += EVAL_FREQ

    mon_vae, mon_critic, mon_actor = policy.mons
    nx.finish(mon_vae, policy.vae, policy.vae_batch, vae_loss_fn, optimizer=policy.vae_optimizer)
    nx.finish(mon_critic, policy.critic, policy.critic_batch, critic_loss_fn, optimizer=policy.critic_optimizer)
    nx.finish(mon_actor)

    # measure only
    with torch.no_grad():
        s = torch.FloatTensor(replay_buffer.state[:1000])
        a = torch.FloatTensor(replay_buffer.action[:1000])
        gen = torch.Generator().manual_seed(1)
        z_mean, z_std = policy.vae(s, a)[1:]
        z = z_mean + z_std * torch.randn(z_std.shape, generator=gen)
        recon = policy.vae.decode(s, z)
        q = policy.critic.q1(s, a)
    return {"final_return": evaluations[-1], "best_return": max(evaluations), "first_return": evaluations[0],
            "behaviour_return": noisy_behaviour, "vae_recon_loss": float(F.mse_loss(recon, a)),
            "q_mean_buffer": float(q.mean()), "q_std_buffer": float(q.std())}  # fmt: skip
