"""Port of Kaixhin/Rainbow: Rainbow DQN (double Q-learning, prioritised replay, a dueling
head, n-step returns, a distributional C51 head, noisy nets), from pixels.

Source: github.com/Kaixhin/Rainbow, ``main.py``, ``agent.py``, ``model.py``, ``memory.py``
and ``test.py`` at commit 1745b184c3dfc03d4ffa3ce2342ced9996b39a60 (the repository's HEAD;
MIT, Copyright (c) 2017 Kai Arulkumaran). Written anew from the facts of those files; no
code copied. atari-py and OpenCV are not used: the environment (the data, not the program)
is a small pixel game written here, ``Catch`` (a 5-wide, 10-high grid drawn 5 x 5 pixels a
cell as a 50 x 25 grey frame in [0, 1]: a ball falls one row a step from a random column
of the top row, the paddle on the bottom row moves left / stays / moves right; +1 when the
ball lands on the paddle, -1 when it misses, the episode then ends), with ``env.py``'s
interface: ``reset()`` fills the ``history_length`` frame deque with blank frames then the
first frame, ``step()`` returns the stacked frames, the reward and ``done``; ``train()`` /
``eval()``; ``action_space()``.

Kept: ``NoisyLinear`` (factorised Gaussian noise: ``weight_mu``/``weight_sigma``/
``bias_mu``/``bias_sigma`` parameters, ``weight_epsilon``/``bias_epsilon`` buffers,
``mu_range = 1/sqrt(in)``, sigma filled with ``std_init / sqrt(in)`` (``/ sqrt(out)`` for
the bias), ``sign(x) * sqrt(|x|)`` noise, the noisy weights in training mode and the means
alone in eval mode); ``DQN`` with the ``data-efficient`` architecture (``Conv2d(history, 32,
5, stride=5)``, ReLU, ``Conv2d(32, 64, 5, stride=5)``, ReLU), the value and advantage
streams ``fc_h_v``/``fc_h_a`` -> ReLU -> ``fc_z_v``/``fc_z_a`` (all noisy), ``q = v + a -
a.mean(1, keepdim=True)``, ``log_softmax`` / ``softmax`` over the atoms (dim 2);
``reset_noise`` of the ``fc`` children. ``Agent``: the support ``linspace(V_min, V_max,
atoms)``, the online net in training mode, the target net loaded from it with
``requires_grad`` off, ``Adam(lr, eps=adam_eps)``; ``act`` (the argmax of the expected
values with the current noise), ``act_e_greedy`` (epsilon 0.001); ``learn``: the
prioritised sample, ``log_ps`` of the taken actions, under ``no_grad`` the online net's
argmax on the n-th next states, the target net's fresh noise and its probabilities for that
action, ``Tz = R + nonterminal * discount^n * support`` clamped, the projection (``b``,
``l``/``u`` with the disappearing-mass fix, the two ``index_add_`` on the flattened ``m``),
``loss = -sum(m * log_ps_a, 1)``, ``online_net.zero_grad()``, ``(weights * loss).mean()
.backward()``, ``clip_grad_norm_(norm_clip)``, ``step``, the priorities updated with the
per-sample loss; ``update_target_net``. ``memory.py``: the ``SegmentTree`` (sum tree over a
structured array of ``(timestep, state, action, reward, nonterminal)``, the max priority for
new transitions, the batched retrieve/propagate), ``ReplayMemory`` (only the last frame of
each state stored, ``mul(255)`` to ``uint8``; the sample drawn one per priority segment,
resampled until valid; frames blanked across episode starts; the history and the n-th next
states rebuilt and ``div_(255)``; the n-step return ``R`` from the discount vector; the
importance weights ``(capacity * p) ** -beta`` over their max; ``update_priorities`` with
``priority_exponent``; the iterator over the validation memory). ``main.py``: ``np.random
.seed(seed)``, ``torch.manual_seed(np.random.randint(1, 10000))``; the validation memory of
``evaluation_size`` transitions from random actions; the loop (``reset_noise`` every
``replay_frequency`` steps, ``act``, ``step``, the reward clipped to ``reward_clip``, the
append; from ``learn_start``: beta annealed to 1, ``learn`` every ``replay_frequency``
steps, every ``evaluation_interval`` steps ``dqn.eval()``, ``test``, ``dqn.train()``, the
target net updated every ``target_update`` steps). ``test.py``: ``evaluation_episodes``
episodes of a fresh environment in eval mode with ``act_e_greedy``, the average reward, and
the average max Q over the validation memory.
Arguments: the README's data-efficient Rainbow set where it applies (``--architecture
data-efficient``, ``--hidden-size 256``, ``--learning-rate 0.0001``, ``--memory-capacity``
equal to ``--T-max``), the defaults otherwise (``history_length`` 4, ``noisy_std`` 0.1,
``atoms`` 51, ``V_min``/``V_max`` -10/10, ``replay_frequency`` 4, ``priority_exponent`` 0.5,
``priority_weight`` 0.4, ``multi_step`` 3, ``discount`` 0.99, ``reward_clip`` 1, ``adam_eps``
1.5e-4, ``batch_size`` 32, ``norm_clip`` 10, ``evaluation_episodes`` 10).
Shrunk: ``T_max`` (and ``memory_capacity``) 4,000 steps instead of 100,000 (data-efficient) /
50M; ``learn_start`` 500 instead of 1,600; ``target_update`` 500 instead of 2,000;
``evaluation_interval`` 2,000 instead of 10,000; ``evaluation_size`` 200 instead of 500;
``learning_rate`` 1e-3 instead of 1e-4 (876 updates: at 5e-4 the healthy run's last 100
episodes averaged 0.46 on seed 0 after 4,000 steps); 50 x 25 frames instead of 84 x 84; no
checkpoints, memory dumps, plots or tqdm; CPU.
Measure only (not in the program): the mean return of the last 100 training episodes (of
444) and the average reward of the last ``test`` (at ``T_max``). Seeds 0/1/2 without nndx:
healthy 1.00/0.94/1.00 (test 1.0/1.0/1.0; a random paddle scores about -0.5);
replay_states_not_scaled -0.60/-0.48/-0.58; no_zero_grad -0.32/-0.34/-0.50.

nndx, as the author would add it: ``learn`` draws its own batch from the memory, so the
preflight ``nndx.probe`` runs inside the first ``learn`` call, on that batch: the states as
inputs, ``(actions, m, weights)`` as targets, and the agent's loss written as a function of
the online net's output (``online_net(states)``, the probabilities: the loss takes their
log, ``-(weights * sum(m * log p_a)).mean()``), with the optimiser; ``nndx.Monitor
(online_net, optimiser)`` is opened right after it and every importance-weighted loss is
logged; after training ``nndx.probe`` on that first batch with ``monitor=mon`` and
``nndx.diagnose``. ``test`` reports rewards and Q values, not a loss, so nothing is logged as
``split="val"``.
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np
import torch
from torch import nn, optim
from torch.nn import functional as F
from torch.nn.utils import clip_grad_norm_

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "rainbow"
SOURCE = Source("Kaixhin/Rainbow", "agent.py", "1745b184c3dfc03d4ffa3ce2342ced9996b39a60", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (data-efficient settings, shrunk: 4,000 steps of Catch, lr 1e-3)"),
        Variant(
            "replay_states_not_scaled",
            "ReplayMemory rebuilds the sampled states and n-th next states from the uint8 frames without the "
            "div_(255): the network learns on 0-255 pixels while it acts (and is tested) on the environment's "
            "0-1 frames",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/DLR-RM/stable-baselines3/issues/743",
             "https://github.com/hill-a/stable-baselines/issues/328",
             "https://github.com/ray-project/ray/issues/9624"),
            Measure("late_return", "mean return of the last 100 training episodes at least 0.4 below the healthy "
                    "run's (returns are in [-1, 1]): -0.60/-0.48/-0.58 buggy against 1.00/0.94/1.00 healthy on "
                    "seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.4),
        ),
        Variant(
            "no_zero_grad",
            "self.online_net.zero_grad() dropped from Agent.learn: every update's gradient is the sum of all the "
            "losses so far (clip_grad_norm_ then rescales that sum to norm 10)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/jcjohnson/pytorch-examples/issues/31"),
            Measure("late_return", "mean return of the last 100 training episodes at least 0.4 below the healthy "
                    "run's (returns are in [-1, 1]): -0.32/-0.34/-0.50 buggy against 1.00/0.94/1.00 healthy on "
                    "seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.4),
        ),
    )
}

ARGS = {
    "seed": 123, "T_max": 4000, "history_length": 4, "architecture": "data-efficient", "hidden_size": 256,
    "noisy_std": 0.1, "atoms": 51, "V_min": -10.0, "V_max": 10.0, "memory_capacity": 4000, "replay_frequency": 4,
    "priority_exponent": 0.5, "priority_weight": 0.4, "multi_step": 3, "discount": 0.99, "target_update": 500,
    "reward_clip": 1, "learning_rate": 1e-3, "adam_eps": 1.5e-4, "batch_size": 32, "norm_clip": 10.0,
    "learn_start": 500, "evaluation_interval": 2000, "evaluation_episodes": 10, "evaluation_size": 200,
}  # fmt: skip
ROWS, COLS, CELL = 10, 5, 5
FRAME = (ROWS * CELL, COLS * CELL)


# --------------------------------------------------------------------------- the environment (the data)


class Env:
    """Catch drawn as grey frames, behind env.py's interface (see the module docstring)."""

    def __init__(self, args: dict, seed: int) -> None:
        self.rng = random.Random(seed)
        self.window = args["history_length"]
        self.state_buffer: deque[torch.Tensor] = deque([], maxlen=self.window)
        self.training = True
        self.ball = (0, 0)
        self.paddle = 0

    def _get_state(self) -> torch.Tensor:
        frame = torch.zeros(FRAME)
        r, c = self.ball
        frame[r * CELL : (r + 1) * CELL, c * CELL : (c + 1) * CELL] = 1.0
        p = self.paddle
        frame[(ROWS - 1) * CELL : ROWS * CELL, p * CELL : (p + 1) * CELL] = torch.maximum(
            frame[(ROWS - 1) * CELL : ROWS * CELL, p * CELL : (p + 1) * CELL], torch.tensor(0.6))
        return frame

    def _reset_buffer(self) -> None:
        for _ in range(self.window):
            self.state_buffer.append(torch.zeros(FRAME))

    def reset(self) -> torch.Tensor:
        self._reset_buffer()
        self.ball = (0, self.rng.randrange(COLS))
        self.paddle = self.rng.randrange(COLS)
        self.state_buffer.append(self._get_state())
        return torch.stack(list(self.state_buffer), 0)

    def step(self, action: int) -> tuple[torch.Tensor, float, bool]:
        self.paddle = min(max(self.paddle + (0, -1, 1)[action], 0), COLS - 1)
        r, c = self.ball
        self.ball = (r + 1, c)
        reward, done = 0.0, False
        if r + 1 == ROWS - 1:
            reward, done = (1.0 if c == self.paddle else -1.0), True
        self.state_buffer.append(self._get_state())
        return torch.stack(list(self.state_buffer), 0), reward, done

    def train(self) -> None:
        self.training = True

    def eval(self) -> None:
        self.training = False

    def action_space(self) -> int:
        return 3


# --------------------------------------------------------------------------- model.py


class NoisyLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, std_init: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features, self.std_init = in_features, out_features, std_init
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.register_buffer("weight_epsilon", torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        self.register_buffer("bias_epsilon", torch.empty(out_features))
        self.reset_parameters()
        self.reset_noise()

    def reset_parameters(self) -> None:
        mu_range = 1 / math.sqrt(self.in_features)
        self.weight_mu.data.uniform_(-mu_range, mu_range)
        self.weight_sigma.data.fill_(self.std_init / math.sqrt(self.in_features))
        self.bias_mu.data.uniform_(-mu_range, mu_range)
        self.bias_sigma.data.fill_(self.std_init / math.sqrt(self.out_features))

    def _scale_noise(self, size: int) -> torch.Tensor:
        x = torch.randn(size, device=self.weight_mu.device)
        return x.sign().mul_(x.abs().sqrt_())

    def reset_noise(self) -> None:
        epsilon_in = self._scale_noise(self.in_features)
        epsilon_out = self._scale_noise(self.out_features)
        self.weight_epsilon.copy_(epsilon_out.ger(epsilon_in))
        self.bias_epsilon.copy_(epsilon_out)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.training:
            return F.linear(input, self.weight_mu + self.weight_sigma * self.weight_epsilon,
                            self.bias_mu + self.bias_sigma * self.bias_epsilon)  # fmt: skip
        return F.linear(input, self.weight_mu, self.bias_mu)


class DQN(nn.Module):
    def __init__(self, args: dict, action_space: int) -> None:
        super().__init__()
        self.atoms, self.action_space = args["atoms"], action_space
        # architecture "data-efficient"
        self.convs = nn.Sequential(nn.Conv2d(args["history_length"], 32, 5, stride=5, padding=0), nn.ReLU(),
                                   nn.Conv2d(32, 64, 5, stride=5, padding=0), nn.ReLU())  # fmt: skip
        self.conv_output_size = 64 * (FRAME[0] // 25) * (FRAME[1] // 25)  # 576 on 84 x 84; 128 on 50 x 25
        self.fc_h_v = NoisyLinear(self.conv_output_size, args["hidden_size"], std_init=args["noisy_std"])
        self.fc_h_a = NoisyLinear(self.conv_output_size, args["hidden_size"], std_init=args["noisy_std"])
        self.fc_z_v = NoisyLinear(args["hidden_size"], self.atoms, std_init=args["noisy_std"])
        self.fc_z_a = NoisyLinear(args["hidden_size"], action_space * self.atoms, std_init=args["noisy_std"])

    def forward(self, x: torch.Tensor, log: bool = False) -> torch.Tensor:
        x = self.convs(x)
        x = x.view(-1, self.conv_output_size)
        v = self.fc_z_v(F.relu(self.fc_h_v(x)))  # value stream
        a = self.fc_z_a(F.relu(self.fc_h_a(x)))  # advantage stream
        v, a = v.view(-1, 1, self.atoms), a.view(-1, self.action_space, self.atoms)
        q = v + a - a.mean(1, keepdim=True)
        if log:
            return F.log_softmax(q, dim=2)
        return F.softmax(q, dim=2)

    def reset_noise(self) -> None:
        for name, module in self.named_children():
            if "fc" in name:
                module.reset_noise()


# --------------------------------------------------------------------------- memory.py


def transition_dtype():
    return np.dtype([("timestep", np.int32), ("state", np.uint8, FRAME), ("action", np.int32),
                     ("reward", np.float32), ("nonterminal", np.bool_)])  # fmt: skip


def blank_trans():
    return (0, np.zeros(FRAME, dtype=np.uint8), 0, 0.0, False)


class SegmentTree:
    def __init__(self, size: int) -> None:
        self.index, self.size, self.full = 0, size, False
        self.tree_start = 2 ** (size - 1).bit_length() - 1
        self.sum_tree = np.zeros((self.tree_start + self.size,), dtype=np.float32)
        self.data = np.array([blank_trans()] * size, dtype=transition_dtype())
        self.max = 1

    def _update_nodes(self, indices):
        children_indices = indices * 2 + np.expand_dims([1, 2], axis=1)
        self.sum_tree[indices] = np.sum(self.sum_tree[children_indices], axis=0)

    def _propagate(self, indices):
        parents = (indices - 1) // 2
        unique_parents = np.unique(parents)
        self._update_nodes(unique_parents)
        if parents[0] != 0:
            self._propagate(parents)

    def _propagate_index(self, index):
        parent = (index - 1) // 2
        left, right = 2 * parent + 1, 2 * parent + 2
        self.sum_tree[parent] = self.sum_tree[left] + self.sum_tree[right]
        if parent != 0:
            self._propagate_index(parent)

    def update(self, indices, values):
        self.sum_tree[indices] = values
        self._propagate(indices)
        self.max = max(np.max(values), self.max)

    def _update_index(self, index, value):
        self.sum_tree[index] = value
        self._propagate_index(index)
        self.max = max(value, self.max)

    def append(self, data, value):
        self.data[self.index] = data
        self._update_index(self.index + self.tree_start, value)
        self.index = (self.index + 1) % self.size
        self.full = self.full or self.index == 0
        self.max = max(value, self.max)

    def _retrieve(self, indices, values):
        children_indices = indices * 2 + np.expand_dims([1, 2], axis=1)
        if children_indices[0, 0] >= self.sum_tree.shape[0]:
            return indices
        elif children_indices[0, 0] >= self.tree_start:
            children_indices = np.minimum(children_indices, self.sum_tree.shape[0] - 1)
        left_children_values = self.sum_tree[children_indices[0]]
        successor_choices = np.greater(values, left_children_values).astype(np.int32)
        successor_indices = children_indices[successor_choices, np.arange(indices.size)]
        successor_values = values - successor_choices * left_children_values
        return self._retrieve(successor_indices, successor_values)

    def find(self, values):
        indices = self._retrieve(np.zeros(values.shape, dtype=np.int32), values)
        data_index = indices - self.tree_start
        return (self.sum_tree[indices], data_index, indices)

    def get(self, data_index):
        return self.data[data_index % self.size]

    def total(self):
        return self.sum_tree[0]


class ReplayMemory:
    def __init__(self, args: dict, capacity: int, scale_states: bool = True) -> None:
        self.capacity = capacity
        self.history = args["history_length"]
        self.discount = args["discount"]
        self.n = args["multi_step"]
        self.priority_weight = args["priority_weight"]
        self.priority_exponent = args["priority_exponent"]
        self.t = 0
        self.n_step_scaling = torch.tensor([self.discount**i for i in range(self.n)], dtype=torch.float32)
        self.transitions = SegmentTree(capacity)
        self.scale_states = scale_states  # the bug: False leaves the sampled states in 0-255

    def append(self, state, action, reward, terminal):
        state = state[-1].mul(255).to(dtype=torch.uint8)
        self.transitions.append((self.t, state, action, reward, not terminal), self.transitions.max)
        self.t = 0 if terminal else self.t + 1

    def _get_transitions(self, idxs):
        transition_idxs = np.arange(-self.history + 1, self.n + 1) + np.expand_dims(idxs, axis=1)
        transitions = self.transitions.get(transition_idxs)
        transitions_firsts = transitions["timestep"] == 0
        blank_mask = np.zeros_like(transitions_firsts, dtype=np.bool_)
        for t in range(self.history - 2, -1, -1):
            blank_mask[:, t] = np.logical_or(blank_mask[:, t + 1], transitions_firsts[:, t + 1])
        for t in range(self.history, self.history + self.n):
            blank_mask[:, t] = np.logical_or(blank_mask[:, t - 1], transitions_firsts[:, t])
        transitions[blank_mask] = blank_trans()
        return transitions

    def _get_samples_from_segments(self, batch_size, p_total):
        segment_length = p_total / batch_size
        segment_starts = np.arange(batch_size) * segment_length
        valid = False
        while not valid:
            samples = np.random.uniform(0.0, segment_length, [batch_size]) + segment_starts
            probs, idxs, tree_idxs = self.transitions.find(samples)
            if (np.all((self.transitions.index - idxs) % self.capacity > self.n)
                    and np.all((idxs - self.transitions.index) % self.capacity >= self.history)
                    and np.all(probs != 0)):  # fmt: skip
                valid = True
        transitions = self._get_transitions(idxs)
        all_states = transitions["state"]
        states = torch.tensor(all_states[:, : self.history], dtype=torch.float32)
        next_states = torch.tensor(all_states[:, self.n : self.n + self.history], dtype=torch.float32)
        if self.scale_states:
            states, next_states = states.div_(255), next_states.div_(255)
        actions = torch.tensor(np.copy(transitions["action"][:, self.history - 1]), dtype=torch.int64)
        rewards = torch.tensor(np.copy(transitions["reward"][:, self.history - 1 : -1]), dtype=torch.float32)
        R = torch.matmul(rewards, self.n_step_scaling)
        nonterminals = torch.tensor(np.expand_dims(transitions["nonterminal"][:, self.history + self.n - 1], axis=1),
                                    dtype=torch.float32)  # fmt: skip
        return probs, idxs, tree_idxs, states, actions, R, next_states, nonterminals

    def sample(self, batch_size):
        p_total = self.transitions.total()
        probs, idxs, tree_idxs, states, actions, returns, next_states, nonterminals = \
            self._get_samples_from_segments(batch_size, p_total)  # fmt: skip
        probs = probs / p_total
        capacity = self.capacity if self.transitions.full else self.transitions.index
        weights = (capacity * probs) ** -self.priority_weight
        weights = torch.tensor(weights / weights.max(), dtype=torch.float32)
        return tree_idxs, states, actions, returns, next_states, nonterminals, weights

    def update_priorities(self, idxs, priorities):
        priorities = np.power(priorities, self.priority_exponent)
        self.transitions.update(idxs, priorities)

    def __iter__(self):
        self.current_idx = 0
        return self

    def __next__(self):
        if self.current_idx == self.capacity:
            raise StopIteration
        transitions = self.transitions.data[np.arange(self.current_idx - self.history + 1, self.current_idx + 1)]
        transitions_firsts = transitions["timestep"] == 0
        blank_mask = np.zeros_like(transitions_firsts, dtype=np.bool_)
        for t in reversed(range(self.history - 1)):
            blank_mask[t] = np.logical_or(blank_mask[t + 1], transitions_firsts[t + 1])
        transitions[blank_mask] = blank_trans()
        state = torch.tensor(transitions["state"], dtype=torch.float32).div_(255)
        self.current_idx += 1
        return state


# --------------------------------------------------------------------------- agent.py


class Agent:
    def __init__(self, args: dict, env: Env, nx: Nndx, zero_grad: bool = True) -> None:
        self.action_space = env.action_space()
        self.atoms, self.Vmin, self.Vmax = args["atoms"], args["V_min"], args["V_max"]
        self.support = torch.linspace(args["V_min"], args["V_max"], self.atoms)
        self.delta_z = (args["V_max"] - args["V_min"]) / (self.atoms - 1)
        self.batch_size, self.n = args["batch_size"], args["multi_step"]
        self.discount, self.norm_clip = args["discount"], args["norm_clip"]

        self.online_net = DQN(args, self.action_space)
        self.online_net.train()
        self.target_net = DQN(args, self.action_space)
        self.update_target_net()
        self.target_net.train()
        for param in self.target_net.parameters():
            param.requires_grad = False
        self.optimiser = optim.Adam(self.online_net.parameters(), lr=args["learning_rate"], eps=args["adam_eps"])

        self.zero_grad = zero_grad  # the bug: False drops online_net.zero_grad()
        self.nx, self.mon, self.probe_batch = nx, None, None
        self.losses: list[float] = []

    def reset_noise(self):
        self.online_net.reset_noise()

    def act(self, state):
        with torch.no_grad():
            return (self.online_net(state.unsqueeze(0)) * self.support).sum(2).argmax(1).item()

    def act_e_greedy(self, state, epsilon=0.001):
        return np.random.randint(0, self.action_space) if np.random.random() < epsilon else self.act(state)

    def loss_fn(self, ps: torch.Tensor, targets) -> torch.Tensor:
        """The agent's loss as a function of the online net's output (the probabilities)."""
        actions, m, weights = targets
        log_ps_a = ps[range(len(ps)), actions].log()
        return (weights * -torch.sum(m * log_ps_a, 1)).mean()

    def learn(self, mem: ReplayMemory):
        idxs, states, actions, returns, next_states, nonterminals, weights = mem.sample(self.batch_size)

        log_ps = self.online_net(states, log=True)
        log_ps_a = log_ps[range(self.batch_size), actions]

        with torch.no_grad():
            pns = self.online_net(next_states)
            dns = self.support.expand_as(pns) * pns
            argmax_indices_ns = dns.sum(2).argmax(1)
            self.target_net.reset_noise()
            pns = self.target_net(next_states)
            pns_a = pns[range(self.batch_size), argmax_indices_ns]

            Tz = returns.unsqueeze(1) + nonterminals * (self.discount**self.n) * self.support.unsqueeze(0)
            Tz = Tz.clamp(min=self.Vmin, max=self.Vmax)
            b = (Tz - self.Vmin) / self.delta_z
            l, u = b.floor().to(torch.int64), b.ceil().to(torch.int64)
            l[(u > 0) * (l == u)] -= 1
            u[(l < (self.atoms - 1)) * (l == u)] += 1

            m = states.new_zeros(self.batch_size, self.atoms)
            offset = torch.linspace(0, ((self.batch_size - 1) * self.atoms), self.batch_size).unsqueeze(1).expand(
                self.batch_size, self.atoms).to(actions)  # fmt: skip
            m.view(-1).index_add_(0, (l + offset).view(-1), (pns_a * (u.float() - b)).view(-1))
            m.view(-1).index_add_(0, (u + offset).view(-1), (pns_a * (b - l.float())).view(-1))

        if self.probe_batch is None:  # the author's preflight, on the first batch learn draws
            self.probe_batch = (states, (actions, m, weights))
            self.nx.preflight(self.online_net, self.probe_batch, self.loss_fn, optimizer=self.optimiser)
            self.mon = self.nx.monitor(self.online_net, self.optimiser, every=10)

        loss = -torch.sum(m * log_ps_a, 1)
        if self.zero_grad:
            self.online_net.zero_grad()
        weighted = (weights * loss).mean()
        weighted.backward()
        clip_grad_norm_(self.online_net.parameters(), self.norm_clip)
        self.optimiser.step()
        self.nx.timed(lambda: self.mon.log(weighted))
        self.losses.append(weighted.item())

        mem.update_priorities(idxs, loss.detach().numpy())

    def update_target_net(self):
        self.target_net.load_state_dict(self.online_net.state_dict())

    def evaluate_q(self, state):
        with torch.no_grad():
            return (self.online_net(state.unsqueeze(0)) * self.support).sum(2).max(1)[0].item()

    def train(self):
        self.online_net.train()

    def eval(self):
        self.online_net.eval()


# --------------------------------------------------------------------------- test.py


def test(args: dict, dqn: Agent, val_mem: ReplayMemory, env_seed: int) -> tuple[float, float]:
    env = Env(args, env_seed)
    env.eval()
    rewards, qs = [], []
    done = True
    for _ in range(args["evaluation_episodes"]):
        while True:
            if done:
                state, reward_sum, done = env.reset(), 0.0, False
            action = dqn.act_e_greedy(state)
            state, reward, done = env.step(action)
            reward_sum += reward
            if done:
                rewards.append(reward_sum)
                break
    for state in val_mem:
        qs.append(dqn.evaluate_q(state))
    return sum(rewards) / len(rewards), sum(qs) / len(qs)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS, seed=ARGS["seed"] + seed)  # the runner's seed is an offset on --seed 123
    np.random.seed(args["seed"])
    torch.manual_seed(np.random.randint(1, 10000))

    env = Env(args, args["seed"])
    env.train()
    action_space = env.action_space()
    dqn = Agent(args, env, nx, zero_grad=variant != "no_zero_grad")
    mem = ReplayMemory(args, args["memory_capacity"], scale_states=variant != "replay_states_not_scaled")
    priority_weight_increase = (1 - args["priority_weight"]) / (args["T_max"] - args["learn_start"])

    val_mem = ReplayMemory(args, args["evaluation_size"])
    T, done = 0, True
    while T < args["evaluation_size"]:
        if done:
            state = env.reset()
        next_state, _, done = env.step(np.random.randint(0, action_space))
        val_mem.append(state, -1, 0.0, done)
        state = next_state
        T += 1

    dqn.train()
    done = True
    episode_returns: list[float] = []
    episode_return = 0.0
    avg_reward, avg_q, evaluations = 0.0, 0.0, []
    for T in range(1, args["T_max"] + 1):
        if done:
            state = env.reset()
        if T % args["replay_frequency"] == 0:
            dqn.reset_noise()
        action = dqn.act(state)
        next_state, reward, done = env.step(action)
        if args["reward_clip"] > 0:
            reward = max(min(reward, args["reward_clip"]), -args["reward_clip"])
        mem.append(state, action, reward, done)
        episode_return += reward
        if done:
            episode_returns.append(episode_return)
            episode_return = 0.0

        if T >= args["learn_start"]:
            mem.priority_weight = min(mem.priority_weight + priority_weight_increase, 1)
            if T % args["replay_frequency"] == 0:
                dqn.learn(mem)
            if T % args["evaluation_interval"] == 0:
                dqn.eval()
                avg_reward, avg_q = test(args, dqn, val_mem, args["seed"] + T)
                evaluations.append(avg_reward)
                dqn.train()
            if T % args["target_update"] == 0:
                dqn.update_target_net()
        state = next_state

    if dqn.mon is not None:
        nx.finish(dqn.mon, dqn.online_net, dqn.probe_batch, dqn.loss_fn, optimizer=dqn.optimiser)
    late = episode_returns[-100:]
    return {"late_return": float(np.mean(late)), "eval_reward": avg_reward, "eval_q": avg_q,
            "episodes": float(len(episode_returns)), "late_loss": float(np.mean(dqn.losses[-100:]))}  # fmt: skip
