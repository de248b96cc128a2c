"""Port of laiguokun's LSTNet (Lai et al., "Modeling Long- and Short-Term Temporal Patterns
with Deep Neural Networks"): a convolution over the window, a GRU, a skip-GRU over periodic
steps and a highway autoregressive component, for multivariate time-series forecasting.

Source: github.com/laiguokun/LSTNet, ``main.py``, ``models/LSTNet.py``, ``utils.py`` and
``Optim.py`` at commit 093c4dced7b7f7405be0620d65bb288b6d7ab4f0 (the four files last changed
in 001bec3916352c02a773a5570691288c0e52b4f9; MIT, Copyright (c) 2019 Guokun Lai, Yiming
Yang, Shinjae Yoo). Written anew from the facts of those files; no code copied.

Kept: ``Data_utility`` with ``normalize = 2`` (each series divided by its maximum absolute
value, ``scale`` kept), the 0.6/0.2/0.2 split in time, ``_batchify`` (windows of ``P`` rows
ending ``horizon`` steps before the target row), ``get_batches`` (``torch.randperm`` when
shuffling, batches of ``batch_size``), ``rse`` = the population std of the scaled test
targets and ``rae`` their mean absolute deviation; ``Model``: ``conv1 = Conv2d(1, hidC,
(Ck, m))`` + ReLU + dropout, squeezed; ``GRU1(hidC, hidR)`` over the conv steps, its last
hidden state with dropout; the skip-GRU: the last ``pt * skip`` conv steps viewed as
``(batch, hidC, pt, skip)``, permuted to ``(pt, batch * skip, hidC)``, ``GRUskip(hidC,
hidS)``, its last hidden state viewed ``(batch, skip * hidS)`` with dropout and concatenated;
``linear1`` to ``m``; the highway: the last ``hw`` rows permuted to ``(batch * m, hw)``,
``Linear(hw, 1)``, viewed ``(batch, m)`` and added; the output function (``--output_fun``:
sigmoid, tanh, anything else none); ``criterion = L1Loss`` summed (``size_average=False``) on
``output * scale`` against ``Y * scale``; ``Optim``: ``Adam(lr=0.001)`` behind a wrapper
whose ``step`` rescales every gradient by ``max_grad_norm / grad_norm`` when that is below 1
(``clip = 10``); ``train``: ``model.train()``, per batch ``model.zero_grad()``, forward,
loss, backward, ``optim.step()``, the epoch loss divided by ``n_samples * m``; ``evaluate``:
``model.eval()``, unshuffled batches, summed MSE and L1 of the scaled outputs, ``rse =
sqrt(total / n_samples) / data.rse``, ``rae``, and the per-series correlation averaged over
the series whose std is not 0; each epoch the validation RSE/RAE/CORR, the best
validation RSE's model kept (``torch.save``d in the original) and evaluated on the test
split at the end. ``pt``/``skip`` cast to ``int`` (the Python 2 integer division the file
was written for, as issue #10 there asks).
Shrunk: a synthetic 8-series "electricity" matrix (1,000 hourly rows, a 12-step "day" and
84-step "week" cycle per series, AR(1) noise; four series swing around 0, four are
positive loads) instead of the downloaded datasets; ``window`` 48 instead of 168, ``skip``
12 instead of 24, ``highway_window`` 12 instead of 24, ``horizon`` 3 instead of 12,
``hidCNN``/``hidRNN`` 16 instead of 100, ``hidSkip`` 4 instead of 5, ``CNN_kernel`` 6 kept,
``batch_size`` 128 kept, 30 epochs instead of 100; ``output_fun`` ``Linear`` as
``ele.sh``/``solar.sh`` pass it; the test evaluation every 5 epochs not printed.
Measure only: nothing beyond the program's own test RSE and CORR.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the program's scaled loss (``criterion(output * scale, Y * scale)``) and the
train/validation windows as ``data``; ``nndx.Monitor`` on the model and the wrapper's torch
optimizer (``optim.optimizer``), each batch's loss logged and each epoch's validation RSE
logged as ``split="val"``; after the epochs ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lstnet"
SOURCE = Source("laiguokun/LSTNet", "main.py", "093c4dced7b7f7405be0620d65bb288b6d7ab4f0", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (output_fun Linear, as ele.sh and solar.sh run it)"),
        Variant(
            "sigmoid_output_signed_data",
            "the argparse default --output_fun sigmoid left on data whose series swing below 0 (normalised by "
            "their max |x| into [-1, 1]): the forecasts cannot be negative, half of every swing is lost",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/sktime/pytorch-forecasting/issues/560", "https://github.com/zhang-xd18/cfnet/issues/1",
             "https://github.com/CSBDeep/CSBDeep/issues/4"),
            Measure("test_rse", "test RSE 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "normalize_0",
            "--normalize 0: Data_utility keeps the raw matrix (scale all ones), so the conv, GRUs and highway see "
            "and must output values in the hundreds, the series on scales 50x apart",
            (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
            ("https://github.com/unit8co/darts/issues/779", "https://github.com/sktime/pytorch-forecasting/issues/1",
             "https://github.com/pusj/LSTM-Time-Series-Analysis-using-Tensorflow/issues/3"),
            Measure("test_rse", "test RSE 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

ARGS = {
    "window": 48, "hidCNN": 16, "hidRNN": 16, "CNN_kernel": 6, "highway_window": 12, "clip": 10.0, "epochs": 30,
    "batch_size": 128, "dropout": 0.2, "seed": 54321, "optim": "adam", "lr": 0.001, "horizon": 3, "skip": 12,
    "hidSkip": 4, "L1Loss": True, "normalize": 2, "output_fun": "Linear",
}  # fmt: skip
ROWS, SERIES = 1000, 8


# --------------------------------------------------------------------------- the data file


def electricity(seed: int) -> np.ndarray:
    """The ``(n, m)`` matrix the program loads with ``np.loadtxt``, made up: per series a
    daily (12-step) and weekly (84-step) cycle and AR(1) noise; series 0-3 swing around 0,
    series 4-7 are positive loads of different sizes."""
    rng = np.random.default_rng(seed + 11)
    t = np.arange(ROWS)
    out = np.zeros((ROWS, SERIES))
    for i in range(SERIES):
        daily = rng.uniform(0.5, 1.5) * np.sin(2 * np.pi * t / 12 + rng.uniform(0, 2 * np.pi))
        weekly = rng.uniform(0.3, 1.0) * np.sin(2 * np.pi * t / 84 + rng.uniform(0, 2 * np.pi))
        noise = np.zeros(ROWS)
        for k in range(1, ROWS):
            noise[k] = 0.7 * noise[k - 1] + rng.normal(0, 0.15)
        level = 0.0 if i < SERIES // 2 else rng.uniform(3.0, 6.0)
        out[:, i] = (level + daily + weekly + noise) * rng.uniform(1.0, 50.0)
    return out


# --------------------------------------------------------------------------- utils.py


def normal_std(x: torch.Tensor) -> torch.Tensor:
    return x.std() * np.sqrt((len(x) - 1.0) / (len(x)))


class Data_utility:
    def __init__(self, rawdat: np.ndarray, train: float, valid: float, horizon: int, window: int,
                 normalize: int = 2):  # fmt: skip
        self.P, self.h = window, horizon
        self.rawdat = rawdat
        self.dat = np.zeros(self.rawdat.shape)
        self.n, self.m = self.dat.shape
        self.scale = np.ones(self.m)
        self._normalized(normalize)
        self._split(int(train * self.n), int((train + valid) * self.n), self.n)
        self.scale = torch.from_numpy(self.scale).float()
        tmp = self.test[1] * self.scale.expand(self.test[1].size(0), self.m)
        self.rse = normal_std(tmp)
        self.rae = torch.mean(torch.abs(tmp - torch.mean(tmp)))

    def _normalized(self, normalize: int) -> None:
        if normalize == 0:
            self.dat = self.rawdat
        if normalize == 1:
            self.dat = self.rawdat / np.max(self.rawdat)
        if normalize == 2:  # each series (column) by its largest absolute value
            for i in range(self.m):
                self.scale[i] = np.max(np.abs(self.rawdat[:, i]))
                self.dat[:, i] = self.rawdat[:, i] / np.max(np.abs(self.rawdat[:, i]))

    def _split(self, train: int, valid: int, test: int) -> None:
        self.train = self._batchify(range(self.P + self.h - 1, train))
        self.valid = self._batchify(range(train, valid))
        self.test = self._batchify(range(valid, self.n))

    def _batchify(self, idx_set: range) -> list[torch.Tensor]:
        n = len(idx_set)
        X = torch.zeros((n, self.P, self.m))
        Y = torch.zeros((n, self.m))
        for i in range(n):
            end = idx_set[i] - self.h + 1
            start = end - self.P
            X[i, :, :] = torch.from_numpy(self.dat[start:end, :])
            Y[i, :] = torch.from_numpy(self.dat[idx_set[i], :])
        return [X, Y]

    def get_batches(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, shuffle: bool = True):
        length = len(inputs)
        index = torch.randperm(length) if shuffle else torch.arange(length)
        start_idx = 0
        while start_idx < length:
            end_idx = min(length, start_idx + batch_size)
            excerpt = index[start_idx:end_idx]
            yield inputs[excerpt], targets[excerpt]
            start_idx += batch_size


# --------------------------------------------------------------------------- models/LSTNet.py


class Model(nn.Module):
    def __init__(self, args: dict, data: Data_utility) -> None:
        super().__init__()
        self.P = args["window"]
        self.m = data.m
        self.hidR, self.hidC, self.hidS = args["hidRNN"], args["hidCNN"], args["hidSkip"]
        self.Ck = args["CNN_kernel"]
        self.skip = int(args["skip"])
        self.pt = int((self.P - self.Ck) / self.skip)
        self.hw = args["highway_window"]
        self.conv1 = nn.Conv2d(1, self.hidC, kernel_size=(self.Ck, self.m))
        self.GRU1 = nn.GRU(self.hidC, self.hidR)
        self.dropout = nn.Dropout(p=args["dropout"])
        if self.skip > 0:
            self.GRUskip = nn.GRU(self.hidC, self.hidS)
            self.linear1 = nn.Linear(self.hidR + self.skip * self.hidS, self.m)
        else:
            self.linear1 = nn.Linear(self.hidR, self.m)
        if self.hw > 0:
            self.highway = nn.Linear(self.hw, 1)
        self.output = None
        if args["output_fun"] == "sigmoid":
            self.output = torch.sigmoid
        if args["output_fun"] == "tanh":
            self.output = torch.tanh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size = x.size(0)
        # CNN
        c = x.view(-1, 1, self.P, self.m)
        c = F.relu(self.conv1(c))
        c = self.dropout(c)
        c = torch.squeeze(c, 3)
        # RNN
        r = c.permute(2, 0, 1).contiguous()
        _, r = self.GRU1(r)
        r = self.dropout(torch.squeeze(r, 0))
        # skip-RNN
        if self.skip > 0:
            s = c[:, :, int(-self.pt * self.skip):].contiguous()
            s = s.view(batch_size, self.hidC, self.pt, self.skip)
            s = s.permute(2, 0, 3, 1).contiguous()
            s = s.view(self.pt, batch_size * self.skip, self.hidC)
            _, s = self.GRUskip(s)
            s = s.view(batch_size, self.skip * self.hidS)
            s = self.dropout(s)
            r = torch.cat((r, s), 1)
        res = self.linear1(r)
        # highway
        if self.hw > 0:
            z = x[:, -self.hw:, :]
            z = z.permute(0, 2, 1).contiguous().view(-1, self.hw)
            z = self.highway(z)
            z = z.view(-1, self.m)
            res = res + z
        if self.output:
            res = self.output(res)
        return res


# --------------------------------------------------------------------------- Optim.py


class Optim:
    def _makeOptimizer(self) -> None:
        if self.method == "sgd":
            self.optimizer = torch.optim.SGD(self.params, lr=self.lr)
        elif self.method == "adam":
            self.optimizer = torch.optim.Adam(self.params, lr=self.lr)
        else:
            raise RuntimeError("Invalid optim method: " + self.method)

    def __init__(self, params, method: str, lr: float, max_grad_norm: float) -> None:
        self.params = list(params)
        self.lr, self.max_grad_norm, self.method = lr, max_grad_norm, method
        self._makeOptimizer()

    def step(self) -> float:
        grad_norm = 0.0
        for param in self.params:
            grad_norm += math.pow(param.grad.data.norm(), 2)
        grad_norm = math.sqrt(grad_norm)
        shrinkage = self.max_grad_norm / grad_norm if grad_norm > 0 else 1.0
        for param in self.params:
            if shrinkage < 1:
                param.grad.data.mul_(shrinkage)
        self.optimizer.step()
        return grad_norm


# --------------------------------------------------------------------------- main.py


def evaluate(data: Data_utility, X, Y, model, evaluateL2, evaluateL1, batch_size):
    model.eval()
    total_loss = total_loss_l1 = 0.0
    n_samples = 0
    predict = test = None
    with torch.no_grad():
        for X_b, Y_b in data.get_batches(X, Y, batch_size, False):
            output = model(X_b)
            predict = output if predict is None else torch.cat((predict, output))
            test = Y_b if test is None else torch.cat((test, Y_b))
            scale = data.scale.expand(output.size(0), data.m)
            total_loss += evaluateL2(output * scale, Y_b * scale).item()
            total_loss_l1 += evaluateL1(output * scale, Y_b * scale).item()
            n_samples += output.size(0) * data.m
    rse = math.sqrt(total_loss / n_samples) / float(data.rse)
    rae = (total_loss_l1 / n_samples) / float(data.rae)
    predict, Ytest = predict.numpy(), test.numpy()
    sigma_p, sigma_g = predict.std(axis=0), Ytest.std(axis=0)
    mean_p, mean_g = predict.mean(axis=0), Ytest.mean(axis=0)
    index = sigma_g != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        correlation = ((predict - mean_p) * (Ytest - mean_g)).mean(axis=0) / (sigma_p * sigma_g)
    correlation = (correlation[index]).mean()
    return rse, rae, float(correlation)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    if variant == "sigmoid_output_signed_data":
        args["output_fun"] = "sigmoid"
    if variant == "normalize_0":
        args["normalize"] = 0
    torch.manual_seed(args["seed"] + seed)
    Data = Data_utility(electricity(seed), 0.6, 0.2, args["horizon"], args["window"], args["normalize"])
    model = Model(args, Data)

    criterion = nn.L1Loss(reduction="sum") if args["L1Loss"] else nn.MSELoss(reduction="sum")
    evaluateL2 = nn.MSELoss(reduction="sum")
    evaluateL1 = nn.L1Loss(reduction="sum")
    optim = Optim(model.parameters(), args["optim"], args["lr"], args["clip"])

    def scaled_loss(output: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """The program's loss: the criterion on the de-normalised output and target."""
        scale = Data.scale.expand(output.size(0), Data.m)
        return criterion(output * scale, Y * scale)

    X_train, Y_train = Data.train
    first_batch = (X_train[: args["batch_size"]], Y_train[: args["batch_size"]])
    splits = (X_train, Y_train, Data.valid[0], Data.valid[1])
    nx.preflight(model, first_batch, scaled_loss, optimizer=optim.optimizer, data=splits)
    mon = nx.monitor(model, optim.optimizer, every=5)

    def train_epoch() -> float:
        model.train()
        total_loss, n_samples = 0.0, 0
        for X, Y in Data.get_batches(X_train, Y_train, args["batch_size"], True):
            model.zero_grad()
            output = model(X)
            loss = scaled_loss(output, Y)
            loss.backward()
            optim.step()
            mon.log(loss)
            total_loss += loss.item()
            n_samples += output.size(0) * Data.m
        return total_loss / n_samples

    best_val, best_state = 10000000.0, None
    train_losses, val_rses = [], []
    for epoch in range(1, args["epochs"] + 1):
        train_losses.append(train_epoch())
        val_loss, val_rae, val_corr = evaluate(Data, Data.valid[0], Data.valid[1], model, evaluateL2, evaluateL1,
                                               args["batch_size"])  # fmt: skip
        mon.log(val_loss, split="val")
        val_rses.append(val_loss)
        if val_loss < best_val:  # torch.save(model) in the original
            best_state, best_val = copy.deepcopy(model.state_dict()), val_loss
    nx.finish(mon, model, first_batch, scaled_loss, optimizer=optim.optimizer, data=splits)

    model.load_state_dict(best_state)  # the best saved model
    test_rse, test_rae, test_corr = evaluate(Data, Data.test[0], Data.test[1], model, evaluateL2, evaluateL1,
                                             args["batch_size"])  # fmt: skip
    return {
        "final_train_loss": train_losses[-1],
        "best_val_rse": best_val,
        "test_rse": test_rse,
        "test_rae": test_rae,
        "test_corr": test_corr,
    }
