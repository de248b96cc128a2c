"""Port of loudinthecloud/pytorch-ntm: a Neural Turing Machine (LSTM controller, NxM memory,
one read and one write head) trained on the copy task with RMSprop.

Source: github.com/loudinthecloud/pytorch-ntm, ``ntm/ntm.py``, ``ntm/memory.py``,
``ntm/head.py``, ``ntm/controller.py``, ``ntm/aio.py``, ``tasks/copytask.py`` and
``train.py`` at commit 3c64937cb075e737528ff7ecf02b2c1c6d8347a1 (BSD-3-Clause, Copyright (c)
2017 Guy Zana). Written anew from the facts of those files; no code copied.

Kept: ``LSTMController``: one ``nn.LSTM`` over ``[x; previous reads]``, its biases 0 and
its weights uniform in +-5/sqrt(inputs + outputs), the initial hidden and cell states
learned parameters (``randn * 0.05``); ``NTMMemory``: a ``mem_bias`` buffer uniform in
+-1/sqrt(N + M) copied per sequence, ``read`` = ``w @ memory``, ``write`` = ``memory * (1 -
w e^T) + w a^T``, ``address``: content focus ``softmax(beta * cosine(memory + 1e-16, k +
1e-16))``, interpolation ``g * wc + (1 - g) * w_prev``, a 3-tap circular convolution shift,
sharpening ``w ** gamma`` renormalised (+1e-16); the heads' activations (``softplus`` beta,
``sigmoid`` g, ``softmax`` s, ``1 + softplus`` gamma, ``sigmoid`` erase), their
``fc_read``/``fc_write`` (xavier gain 1.4, bias N(0, 0.01)) split into ``k, beta, g, s,
gamma[, e, a]``; ``NTM``: the initial reads a ``randn * 0.01`` buffer, the output ``fc``
(xavier, bias N(0, 0.01)) of ``[controller output; reads]`` through ``sigmoid``;
``EncapsulatedNTM`` with one read head then one write head per ``num_heads``; the copy
task's ``dataloader`` (per batch a length drawn by ``random.randint(min_len, max_len)``,
bits by ``np.random.binomial(1, 0.5)``, the input one channel wider with the delimiter
after the sequence, the target the bits); ``nn.BCELoss()``; ``optim.RMSprop(lr=1e-4,
momentum=0.9, alpha=0.95)``; ``train_batch``: ``zero_grad``, ``init_sequence``, feed the
input and the delimiter, then read the output with no input, ``criterion(y_out, Y)``,
backward, ``clip_grads`` (each gradient clamped to [-10, 10]), step, the cost = error bits
per sequence of the output thresholded at 0.5; the running report every
``report_interval`` batches (kept as a record, not logged).
Shrunk: ``sequence_width`` 4 instead of 8, lengths 1..4 instead of 1..20, memory 16 x 8
instead of 128 x 20, controller 32 instead of 100, batch 8 instead of 1, 300 batches
instead of 50,000, and RMSprop lr 3e-3 instead of 1e-4 (with 500 batches instead of
50,000 the published LR does not leave the "all bits 0.5" plateau); the circular
convolution written as rolls over the batch instead of a per-sample ``conv1d`` loop
(the same numbers).
Measure only (not in the program): the cost (error bits per sequence) on 64 held-out
sequences of each length 1..4, as ``evaluate`` computes it.

nndx, as the author would add it: the NTM is stepped one input at a time, so the author
wraps ``train_batch``'s forward (init_sequence, feed the inputs, read the outputs) in a
module whose ``forward(X)`` returns ``y_out``; a preflight ``nndx.probe`` of it on the
first batch with ``criterion``, ``nndx.Monitor(model, optimizer)`` around the loop, every
batch's loss logged, every ``report_interval`` the held-out loss logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` on the first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn import Parameter

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ntm"
SOURCE = Source("loudinthecloud/pytorch-ntm", "tasks/copytask.py", "3c64937cb075e737528ff7ecf02b2c1c6d8347a1",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (copy task, shrunk sizes)"),
        Variant(
            "zero_grad_missing",
            "optimizer.zero_grad() left out of train_batch: every backward adds to the gradients of all the "
            "batches before it, and RMSprop steps on the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/IDEA-Research/DN-DETR/issues/19", "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/yueliu1999/HSAN/issues/6", "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("eval_cost", "held-out cost (error bits per sequence) at least 0.5 bits above the healthy run's: "
                    "4.96 against 1.25 healthy on seed 0", lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "lr_too_high",
            "RMSprop built with lr=0.03 (a zero dropped from the tuned 0.003) instead of the tuned rate: the "
            "NTM never leaves the 'every bit 0.5' plateau (held-out cost at chance, ~5 bits per sequence)",
            (C.LR_TOO_HIGH,),
            ("https://github.com/shawntan/neural-turing-machines/pull/12",
             "https://github.com/MarkPKCollier/NeuralTuringMachine/issues/5",
             "https://github.com/camigord/Neural-Turing-Machine/issues/5"),
            Measure("eval_cost", "held-out cost (error bits per sequence) at least 0.5 bits above the healthy run's: "
                    "5.02 against 1.25 healthy on seed 0", lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
    )
}

PARAMS = {"controller_size": 32, "controller_layers": 1, "num_heads": 1, "sequence_width": 4,
          "sequence_min_len": 1, "sequence_max_len": 4, "memory_n": 16, "memory_m": 8, "num_batches": 300,
          "batch_size": 8, "rmsprop_lr": 3e-3, "rmsprop_momentum": 0.9, "rmsprop_alpha": 0.95}  # fmt: skip
REPORT_INTERVAL, EVAL_PER_LEN = 100, 64
BUGGY_LR = 3e-2


# --------------------------------------------------------------------------- ntm/controller.py


class LSTMController(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int, num_layers: int) -> None:
        super().__init__()
        self.num_inputs, self.num_outputs, self.num_layers = num_inputs, num_outputs, num_layers
        self.lstm = nn.LSTM(input_size=num_inputs, hidden_size=num_outputs, num_layers=num_layers)
        self.lstm_h_bias = Parameter(torch.randn(num_layers, 1, num_outputs) * 0.05)
        self.lstm_c_bias = Parameter(torch.randn(num_layers, 1, num_outputs) * 0.05)
        self.reset_parameters()

    def create_new_state(self, batch_size: int):
        return self.lstm_h_bias.clone().repeat(1, batch_size, 1), self.lstm_c_bias.clone().repeat(1, batch_size, 1)

    def reset_parameters(self) -> None:
        bound = 5 / np.sqrt(self.num_inputs + self.num_outputs)
        for p in self.lstm.parameters():
            if p.dim() == 1:
                nn.init.constant_(p, 0)
            else:
                nn.init.uniform_(p, -bound, bound)

    def size(self) -> tuple[int, int]:
        return self.num_inputs, self.num_outputs

    def forward(self, x: torch.Tensor, prev_state):
        outp, state = self.lstm(x.unsqueeze(0), prev_state)
        return outp.squeeze(0), state


# --------------------------------------------------------------------------- ntm/memory.py


def _shift(wg: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The 3-tap circular convolution of each row of ``wg`` with its ``s`` (shift -1, 0, +1)."""
    return wg.roll(1, dims=1) * s[:, :1] + wg * s[:, 1:2] + wg.roll(-1, dims=1) * s[:, 2:3]


class NTMMemory(nn.Module):
    def __init__(self, N: int, M: int) -> None:  # noqa: N803 - the paper's names
        super().__init__()
        self.N, self.M = N, M
        self.register_buffer("mem_bias", torch.empty(N, M))
        stdev = 1 / np.sqrt(N + M)
        nn.init.uniform_(self.mem_bias, -stdev, stdev)

    def reset(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.memory = self.mem_bias.clone().repeat(batch_size, 1, 1)

    def size(self) -> tuple[int, int]:
        return self.N, self.M

    def read(self, w: torch.Tensor) -> torch.Tensor:
        return torch.matmul(w.unsqueeze(1), self.memory).squeeze(1)

    def write(self, w: torch.Tensor, e: torch.Tensor, a: torch.Tensor) -> None:
        erase = torch.matmul(w.unsqueeze(-1), e.unsqueeze(1))
        add = torch.matmul(w.unsqueeze(-1), a.unsqueeze(1))
        self.memory = self.memory * (1 - erase) + add

    def address(self, k, beta, g, s, gamma, w_prev) -> torch.Tensor:
        k = k.view(self.batch_size, 1, -1)
        wc = F.softmax(beta * F.cosine_similarity(self.memory + 1e-16, k + 1e-16, dim=-1), dim=1)
        wg = g * wc + (1 - g) * w_prev
        w_hat = _shift(wg, s)
        w = w_hat**gamma
        return torch.div(w, torch.sum(w, dim=1).view(-1, 1) + 1e-16)


# --------------------------------------------------------------------------- ntm/head.py


def _split_cols(mat: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    edges = np.cumsum([0] + lengths)
    return [mat[:, s:e] for s, e in zip(edges[:-1], edges[1:])]


class NTMHeadBase(nn.Module):
    def __init__(self, memory: NTMMemory, controller_size: int) -> None:
        super().__init__()
        self.memory = memory
        self.N, self.M = memory.size()
        self.controller_size = controller_size

    def create_new_state(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, self.N)

    def _address_memory(self, k, beta, g, s, gamma, w_prev) -> torch.Tensor:
        k = k.clone()
        beta = F.softplus(beta)
        g = torch.sigmoid(g)
        s = F.softmax(s, dim=1)
        gamma = 1 + F.softplus(gamma)
        return self.memory.address(k, beta, g, s, gamma, w_prev)


class NTMReadHead(NTMHeadBase):
    def __init__(self, memory: NTMMemory, controller_size: int) -> None:
        super().__init__(memory, controller_size)
        self.read_lengths = [self.M, 1, 1, 3, 1]
        self.fc_read = nn.Linear(controller_size, sum(self.read_lengths))
        nn.init.xavier_uniform_(self.fc_read.weight, gain=1.4)
        nn.init.normal_(self.fc_read.bias, std=0.01)

    def is_read_head(self) -> bool:
        return True

    def forward(self, embeddings: torch.Tensor, w_prev: torch.Tensor):
        k, beta, g, s, gamma = _split_cols(self.fc_read(embeddings), self.read_lengths)
        w = self._address_memory(k, beta, g, s, gamma, w_prev)
        return self.memory.read(w), w


class NTMWriteHead(NTMHeadBase):
    def __init__(self, memory: NTMMemory, controller_size: int) -> None:
        super().__init__(memory, controller_size)
        self.write_lengths = [self.M, 1, 1, 3, 1, self.M, self.M]
        self.fc_write = nn.Linear(controller_size, sum(self.write_lengths))
        nn.init.xavier_uniform_(self.fc_write.weight, gain=1.4)
        nn.init.normal_(self.fc_write.bias, std=0.01)

    def is_read_head(self) -> bool:
        return False

    def forward(self, embeddings: torch.Tensor, w_prev: torch.Tensor) -> torch.Tensor:
        k, beta, g, s, gamma, e, a = _split_cols(self.fc_write(embeddings), self.write_lengths)
        e = torch.sigmoid(e)
        w = self._address_memory(k, beta, g, s, gamma, w_prev)
        self.memory.write(w, e, a)
        return w


# --------------------------------------------------------------------------- ntm/ntm.py, ntm/aio.py


class NTM(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int, controller: LSTMController, memory: NTMMemory,
                 heads: nn.ModuleList) -> None:  # fmt: skip
        super().__init__()
        self.num_inputs, self.num_outputs = num_inputs, num_outputs
        self.controller, self.memory, self.heads = controller, memory, heads
        self.N, self.M = memory.size()
        _, self.controller_size = controller.size()
        self.num_read_heads = 0
        self.init_r = []
        for head in heads:
            if head.is_read_head():
                bias = torch.randn(1, self.M) * 0.01
                self.register_buffer(f"read{self.num_read_heads}_bias", bias.data)
                self.init_r.append(bias)
                self.num_read_heads += 1
        self.fc = nn.Linear(self.controller_size + self.num_read_heads * self.M, num_outputs)
        nn.init.xavier_uniform_(self.fc.weight, gain=1)
        nn.init.normal_(self.fc.bias, std=0.01)

    def create_new_state(self, batch_size: int):
        init_r = [r.clone().repeat(batch_size, 1) for r in self.init_r]
        return init_r, self.controller.create_new_state(batch_size), [h.create_new_state(batch_size) for h in self.heads]

    def forward(self, x: torch.Tensor, prev_state):
        prev_reads, prev_controller_state, prev_heads_states = prev_state
        controller_outp, controller_state = self.controller(torch.cat([x] + prev_reads, dim=1), prev_controller_state)
        reads, heads_states = [], []
        for head, prev_head_state in zip(self.heads, prev_heads_states):
            if head.is_read_head():
                r, head_state = head(controller_outp, prev_head_state)
                reads.append(r)
            else:
                head_state = head(controller_outp, prev_head_state)
            heads_states.append(head_state)
        o = torch.sigmoid(self.fc(torch.cat([controller_outp] + reads, dim=1)))
        return o, (reads, controller_state, heads_states)


class EncapsulatedNTM(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int, controller_size: int, controller_layers: int,
                 num_heads: int, N: int, M: int) -> None:  # noqa: N803
        super().__init__()
        self.num_inputs, self.num_outputs = num_inputs, num_outputs
        memory = NTMMemory(N, M)
        controller = LSTMController(num_inputs + M * num_heads, controller_size, controller_layers)
        heads = nn.ModuleList([])
        for _ in range(num_heads):
            heads += [NTMReadHead(memory, controller_size), NTMWriteHead(memory, controller_size)]
        self.ntm = NTM(num_inputs, num_outputs, controller, memory, heads)
        self.memory = memory

    def init_sequence(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.memory.reset(batch_size)
        self.previous_state = self.ntm.create_new_state(batch_size)

    def forward(self, x: torch.Tensor | None = None):
        if x is None:
            x = torch.zeros(self.batch_size, self.num_inputs)
        o, self.previous_state = self.ntm(x, self.previous_state)
        return o, self.previous_state


class CopyRun(nn.Module):
    """train_batch's forward as one call (the author's wrapper for nndx): the input and the
    delimiter fed, then ``outp_len`` outputs read with no input."""

    def __init__(self, net: EncapsulatedNTM) -> None:
        super().__init__()
        self.net = net

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        inp_seq_len, batch_size, _ = X.shape
        self.net.init_sequence(batch_size)
        for i in range(inp_seq_len):
            self.net(X[i])
        outs = [self.net()[0] for _ in range(inp_seq_len - 1)]
        return torch.stack(outs)


# --------------------------------------------------------------------------- tasks/copytask.py, train.py


def dataloader(num_batches: int, batch_size: int, seq_width: int, min_len: int, max_len: int):
    for batch_num in range(num_batches):
        seq_len = random.randint(min_len, max_len)
        seq = torch.from_numpy(np.random.binomial(1, 0.5, (seq_len, batch_size, seq_width)))
        inp = torch.zeros(seq_len + 1, batch_size, seq_width + 1)
        inp[:seq_len, :, :seq_width] = seq
        inp[seq_len, :, seq_width] = 1.0
        yield batch_num + 1, inp.float(), seq.clone().float()


def clip_grads(net: nn.Module) -> None:
    for p in net.parameters():
        if p.grad is not None:
            p.grad.data.clamp_(-10, 10)


def cost_of(y_out: torch.Tensor, Y: torch.Tensor) -> float:  # noqa: N803
    """Error bits per sequence of the output thresholded at 0.5."""
    return float(torch.sum(torch.abs((y_out.detach() >= 0.5).float() - Y))) / Y.size(1)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    p = dict(PARAMS)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    width = p["sequence_width"]
    net = EncapsulatedNTM(width + 1, width, p["controller_size"], p["controller_layers"], p["num_heads"],
                          p["memory_n"], p["memory_m"])  # fmt: skip
    model = CopyRun(net)
    criterion = nn.BCELoss()
    lr = BUGGY_LR if variant == "lr_too_high" else p["rmsprop_lr"]
    optimizer = optim.RMSprop(net.parameters(), momentum=p["rmsprop_momentum"], alpha=p["rmsprop_alpha"], lr=lr)

    # held-out sequences (measure, and the Monitor's val curve): EVAL_PER_LEN of each length
    held_rng = np.random.RandomState(seed + 1000)
    held_out = []
    for seq_len in range(p["sequence_min_len"], p["sequence_max_len"] + 1):
        seq = torch.from_numpy(held_rng.binomial(1, 0.5, (seq_len, EVAL_PER_LEN, width))).float()
        inp = torch.zeros(seq_len + 1, EVAL_PER_LEN, width + 1)
        inp[:seq_len, :, :width] = seq
        inp[seq_len, :, width] = 1.0
        held_out.append((inp, seq))

    def evaluate() -> tuple[float, float]:
        losses, costs = [], []
        with torch.no_grad():
            for X, Y in held_out:  # noqa: N806
                y_out = model(X)
                losses.append(float(criterion(y_out, Y)))
                costs.append(cost_of(y_out, Y))
        return float(np.mean(losses)), float(np.mean(costs))

    loader = dataloader(p["num_batches"], p["batch_size"], width, p["sequence_min_len"], p["sequence_max_len"])
    losses, costs, reports = [], [], []
    mon = probe_batch = None
    for batch_num, x, y in loader:
        if probe_batch is None:  # the author's preflight, on the first batch
            probe_batch = (x, y)
            nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
            mon = nx.monitor(model, optimizer, every=10)
        # train_batch
        if variant != "zero_grad_missing":
            optimizer.zero_grad()
        y_out = model(x)
        loss = criterion(y_out, y)
        loss.backward()
        clip_grads(net)
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        losses.append(loss.item())
        costs.append(cost_of(y_out, y))
        if batch_num % REPORT_INTERVAL == 0:
            eval_loss, eval_cost = evaluate()
            nx.timed(lambda: mon.log(eval_loss, split="val"))  # noqa: B023
            reports.append((batch_num, float(np.mean(losses[-REPORT_INTERVAL:])),
                            float(np.mean(costs[-REPORT_INTERVAL:])), eval_cost))  # fmt: skip

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    eval_loss, eval_cost = evaluate()
    return {"eval_cost": eval_cost, "eval_loss": eval_loss,
            "train_cost": float(np.mean(costs[-REPORT_INTERVAL:])), "last_loss": float(losses[-1])}  # fmt: skip
