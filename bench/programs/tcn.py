"""Port of locuslab/TCN's adding problem: a temporal convolutional network regressing a sum.

Source: github.com/locuslab/TCN, ``TCN/adding_problem/add_test.py`` with ``TCN/tcn.py``,
``TCN/adding_problem/model.py`` and ``TCN/adding_problem/utils.py`` at commit
2f8c2b817050206397458dfd1f5a25ce8a32fe65 (MIT, Copyright (c) 2018 CMU Locus Lab). Written
anew from the facts of those files; no code copied.

Kept: ``data_generator(N, seq_length)``: channel 0 uniform in [0, 1], channel 1 zeros with
two positions (drawn without replacement) set to 1, the target the sum of the two marked
numbers, ``X = cat((X_num, X_mask), dim=1)`` of shape (N, 2, L) and ``Y`` of shape (N, 1);
``Chomp1d`` (drops the last ``chomp_size`` steps, ``.contiguous()``); ``TemporalBlock``:
two ``weight_norm(Conv1d(..., padding=(k-1)*d, dilation=d))`` each followed by a
``Chomp1d``, an ``nn.ReLU`` module and an ``nn.Dropout``, all in an ``nn.Sequential``
``net``, a 1x1 ``downsample`` convolution when the widths differ, ``relu(out + res)``, and
``init_weights`` drawing ``conv1.weight.data`` / ``conv2.weight.data`` / ``downsample`` from
N(0, 0.01) (which, on the two weight-normed convolutions, writes into the recomputed
``weight`` tensor and so does not change what the network starts from: the original's
behaviour, kept); ``TemporalConvNet``: dilation ``2 ** i`` at level i; ``TCN``: the
network, then ``Linear(num_channels[-1], output_size)`` (weight from N(0, 0.01)) on the last
time step ``y1[:, :, -1]``; ``add_test.py``: ``channel_sizes = [nhid] * levels``, dropout 0,
``getattr(optim, 'Adam')(lr=4e-3)``, ``train(epoch)`` slicing the tensors in order (no
shuffling, the last short batch kept), ``optimizer.zero_grad()``, ``F.mse_loss(output, y)``,
``backward``, ``clip_grad_norm_`` when ``clip > 0`` (default -1: off), ``step``, the
running loss reported every ``log_interval`` batches (kept as a record); ``evaluate()``:
``model.eval()``, ``torch.no_grad()``, the MSE over the whole test set; ``train`` then
``evaluate`` each epoch; ``torch.manual_seed``.
Shrunk: sequences of 40 steps instead of 400 (kernel 5 and 3 levels instead of 7 and 8, a
receptive field of 57 steps covering them, as the README asks), 24 channels instead of 30,
4,000 training and 500 test sequences instead of 50,000 / 1,000, 4 epochs instead of 10,
log interval 25 instead of 100; the positions drawn by a seeded numpy Generator.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch with
``F.mse_loss`` and the data splits, ``nndx.Monitor`` around the epochs with ``F.mse_loss``
called as ``mon.loss_fn``, each batch's loss logged, each ``evaluate``'s test loss logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.nn.utils import weight_norm  # the original's import (deprecated for parametrizations)

NAME = "tcn"
SOURCE = Source("locuslab/TCN", "TCN/adding_problem/add_test.py", "2f8c2b817050206397458dfd1f5a25ce8a32fe65", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "view_not_transpose",
            "the sequences built time-major, (N, L, 2) as for an LSTM, and fed with x.view(-1, input_channels, "
            "seq_length) (pmnist_test.py's line) instead of a transpose: the two channels interleave the "
            "numbers and the marks of the first and the second half of the sequence",
            (C.WRONG_RESHAPE,),
            ("https://github.com/locuslab/TCN/issues/19", "https://github.com/locuslab/TCN/issues/35",
             "https://github.com/proceduralia/pytorch-conv2_1d/issues/1",
             "https://github.com/zamanzadeh/CARLA/issues/16"),
            Measure("test_mse", "test MSE (targets aligned) 2x the healthy run's or more: 0.031/0.050/0.148 "
                    "against 0.005/0.016/0.012 healthy on seeds 0-2 (always predicting 1: 0.177)",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
        Variant(
            "target_broadcast",
            "Y made of shape (N,) instead of (N, 1): F.mse_loss(output (B, 1), y (B,)) broadcasts to (B, B) and "
            "fits every output to every target in the batch (PyTorch only warns)",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/pull/18349", "https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/andrewgcodes/xlstm/issues/4", "https://github.com/pytorch/pytorch/issues/4938"),
            Measure("test_mse", "test MSE (targets aligned) 2x the healthy run's or more: 0.168/0.156/0.186 "
                    "against 0.005/0.016/0.012 healthy on seeds 0-2 (the batch mean is all it learns)",
                    lambda healthy, buggy: not buggy < 2 * healthy),
        ),
    )
}

ARGS = {"batch_size": 32, "dropout": 0.0, "clip": -1.0, "epochs": 4, "ksize": 5, "levels": 3, "seq_len": 40,
        "log_interval": 25, "lr": 4e-3, "optim": "Adam", "nhid": 24, "seed": 1111}  # fmt: skip
N_TRAIN, N_TEST = 4000, 500


# --------------------------------------------------------------------------- TCN/tcn.py


class Chomp1d(nn.Module):
    def __init__(self, chomp_size: int) -> None:
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, : -self.chomp_size].contiguous()


class TemporalBlock(nn.Module):
    def __init__(self, n_inputs, n_outputs, kernel_size, stride, dilation, padding, dropout=0.2) -> None:
        super().__init__()
        self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, stride=stride, padding=padding,
                                           dilation=dilation))  # fmt: skip
        self.chomp1 = Chomp1d(padding)
        self.relu1 = nn.ReLU()
        self.dropout1 = nn.Dropout(dropout)
        self.conv2 = weight_norm(nn.Conv1d(n_outputs, n_outputs, kernel_size, stride=stride, padding=padding,
                                           dilation=dilation))  # fmt: skip
        self.chomp2 = Chomp1d(padding)
        self.relu2 = nn.ReLU()
        self.dropout2 = nn.Dropout(dropout)
        self.net = nn.Sequential(self.conv1, self.chomp1, self.relu1, self.dropout1,
                                 self.conv2, self.chomp2, self.relu2, self.dropout2)  # fmt: skip
        self.downsample = nn.Conv1d(n_inputs, n_outputs, 1) if n_inputs != n_outputs else None
        self.relu = nn.ReLU()
        self.init_weights()

    def init_weights(self) -> None:
        self.conv1.weight.data.normal_(0, 0.01)
        self.conv2.weight.data.normal_(0, 0.01)
        if self.downsample is not None:
            self.downsample.weight.data.normal_(0, 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        res = x if self.downsample is None else self.downsample(x)
        return self.relu(out + res)


class TemporalConvNet(nn.Module):
    def __init__(self, num_inputs: int, num_channels: list[int], kernel_size: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        layers = []
        for i, out_channels in enumerate(num_channels):
            dilation_size = 2**i
            in_channels = num_inputs if i == 0 else num_channels[i - 1]
            layers += [TemporalBlock(in_channels, out_channels, kernel_size, stride=1, dilation=dilation_size,
                                     padding=(kernel_size - 1) * dilation_size, dropout=dropout)]  # fmt: skip
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


# --------------------------------------------------------------------------- adding_problem/model.py, utils.py


class TCN(nn.Module):
    def __init__(self, input_size, output_size, num_channels, kernel_size, dropout) -> None:
        super().__init__()
        self.tcn = TemporalConvNet(input_size, num_channels, kernel_size=kernel_size, dropout=dropout)
        self.linear = nn.Linear(num_channels[-1], output_size)
        self.init_weights()

    def init_weights(self) -> None:
        self.linear.weight.data.normal_(0, 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y1 = self.tcn(x)
        return self.linear(y1[:, :, -1])


def data_generator(N: int, seq_length: int, rng: np.random.Generator, variant: str = "healthy"):
    """The adding problem: (X, Y). ``view_not_transpose`` builds X time-major, (N, L, 2);
    ``target_broadcast`` builds Y of shape (N,)."""
    time_major = variant == "view_not_transpose"
    X_num = torch.rand([N, seq_length, 1] if time_major else [N, 1, seq_length])
    X_mask = torch.zeros_like(X_num)
    Y = torch.zeros([N]) if variant == "target_broadcast" else torch.zeros([N, 1])
    for i in range(N):
        positions = rng.choice(seq_length, size=2, replace=False)
        for p in positions:
            if time_major:
                X_mask[i, p, 0] = 1
            else:
                X_mask[i, 0, p] = 1
        total = X_num[i, positions[0], 0] + X_num[i, positions[1], 0] if time_major else \
            X_num[i, 0, positions[0]] + X_num[i, 0, positions[1]]  # fmt: skip
        Y[i] = total
    X = torch.cat((X_num, X_mask), dim=2 if time_major else 1)
    return X, Y


# --------------------------------------------------------------------------- add_test.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(args["seed"] + seed)
    rng = np.random.default_rng(args["seed"] + seed)
    input_channels, n_classes = 2, 1
    batch_size, seq_length, epochs = args["batch_size"], args["seq_len"], args["epochs"]
    X_train, Y_train = data_generator(N_TRAIN, seq_length, rng, variant)
    X_test, Y_test = data_generator(N_TEST, seq_length, rng, variant)

    def shaped(x: torch.Tensor) -> torch.Tensor:
        """What the model is given: the buggy variant's view of time-major data."""
        return x.view(-1, input_channels, seq_length) if variant == "view_not_transpose" else x

    channel_sizes = [args["nhid"]] * args["levels"]
    with warnings.catch_warnings():  # weight_norm's deprecation notice
        warnings.simplefilter("ignore")
        model = TCN(input_channels, n_classes, channel_sizes, kernel_size=args["ksize"], dropout=args["dropout"])
    lr = args["lr"]
    optimizer = getattr(optim, args["optim"])(model.parameters(), lr=lr)

    splits = (shaped(X_train), Y_train, shaped(X_test), Y_test)
    first_batch = (shaped(X_train[:batch_size]), Y_train[:batch_size])
    with warnings.catch_warnings():  # the broadcast variant's UserWarning, once per call
        warnings.simplefilter("ignore")
        nx.preflight(model, first_batch, F.mse_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=F.mse_loss)

    reported: list[float] = []

    def train_epoch(epoch: int) -> None:
        model.train()
        batch_idx, total_loss = 1, 0.0
        for i in range(0, X_train.size(0), batch_size):
            if i + batch_size > X_train.size(0):
                x, y = X_train[i:], Y_train[i:]
            else:
                x, y = X_train[i : i + batch_size], Y_train[i : i + batch_size]
            x = shaped(x)
            optimizer.zero_grad()
            output = model(x)
            loss = mon.loss_fn(output, y)
            loss.backward()
            if args["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args["clip"])
            optimizer.step()
            mon.log(loss)
            batch_idx += 1
            total_loss += loss.item()
            if batch_idx % args["log_interval"] == 0:
                reported.append(total_loss / args["log_interval"])  # the 'Train Epoch' line
                total_loss = 0.0

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            output = model(shaped(X_test))
            test_loss = F.mse_loss(output, Y_test)
        mon.log(test_loss.item(), split="val")
        return test_loss.item()

    test_losses: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for ep in range(1, epochs + 1):
            train_epoch(ep)
            test_losses.append(evaluate())
        nx.finish(mon, model, first_batch, F.mse_loss, optimizer=optimizer, data=splits)

    # measure only: the test MSE with output and target of the same shape (what the bug hides)
    model.eval()
    with torch.no_grad():
        output = model(shaped(X_test)).view(-1)
        test_mse = F.mse_loss(output, Y_test.view(-1)).item()
    return {"test_mse": test_mse, "reported_test_loss": test_losses[-1], "last_train_loss": reported[-1]}
