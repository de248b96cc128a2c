"""Port of zhykoties/TimeSeries, DeepAR in PyTorch (an LSTM over the previous value and
covariates, a Gaussian likelihood with a softplus sigma, the negative log-likelihood summed
over the window, each window scaled by its mean, ancestral sampling at prediction).

Source: github.com/zhykoties/TimeSeries, ``model/net.py``, ``train.py``, ``evaluate.py``,
``dataloader.py``, ``utils.py`` and ``preprocess_elect.py`` at commit
b12b13c8250a096e38882d258213abd6c2d78c43 (Apache-2.0, Copyright (c) zhykoties / Yunkai
Zhang et al.). Written anew from the facts of those files; no code copied.

Kept: ``prep_data``'s windows (``window_size``, ``stride_size``, ``input_size =
window_size - stride_size``): channel 0 the previous value z_{t-1} (z_0 = 0), then the
covariates (age z-scored per series, day of week and hour of day z-scored), the series id
in the last column; ``v = mean of the nonzero conditioning inputs + 1``, inputs divided by
``v`` in every window and labels only in the training windows (the test labels stay in
their own units, ``v`` multiplies the forecasts back); ``TrainDataset`` splitting off the
id; ``WeightedSampler`` (windows drawn with replacement, weight proportional to ``v``);
``Net``: ``Embedding(num_class, embedding_dim)``, ``LSTM(1 + cov_dim + embedding_dim,
lstm_hidden_dim, lstm_layers, dropout=lstm_dropout)`` time-major with the forget-gate biases
set to 1, ``distribution_mu`` and ``distribution_presigma`` over the hidden states of all
layers, ``Softplus`` for sigma; ``loss_fn`` (Gaussian log-likelihood of the nonzero labels,
negated and averaged); ``train`` (``zero_grad``, ``init_hidden``/``init_cell``, a step per
time point with missing inputs replaced by the last ``mu``, the losses summed over the
window, ``backward``, ``step``); ``Adam(lr=1e-3)``; ``evaluate`` (``model.eval()``,
``no_grad``, the conditioning pass over ``test_predict_start`` steps, then ``Net.test``
with ``sampling=True``: ``sample_times`` ancestral paths, each sample fed back as the next
input, the median as the forecast) and its ``ND``, ``RMSE`` and ``test_loss``
(``update_metrics`` / ``final_metrics``) after every epoch, the best ``ND`` kept.
Shrunk: 16 synthetic hourly series (a daily and a weekly cycle, 5% noise, levels spread
log-uniformly from 5 to 500) instead of the 370 electricity clients of UCI LD2011_2014 (no
download); 384 training hours, then 4 test windows per series whose forecasts cover the 48
hours after them; ``window_size`` 48 with ``predict_start`` 36 and ``predict_steps`` 12
instead of 192/168/24 (``stride_size`` 12 instead of 24); 3 covariates instead of 4 (no
month in 18 days); ``lstm_hidden_dim`` 24 instead of 40, ``embedding_dim`` 8 instead of 20,
2 LSTM layers instead of 3; ``sample_times`` 20 instead of 200; 10 epochs (80 steps) at
lr 3e-3 instead of 20 epochs at 1e-3; the mid-epoch evaluation every 1000 batches (here:
the first batch of each epoch, a repeat of the previous epoch's), plots and checkpoints
left out. Measure only (not in the program): nothing beyond the program's own
``ND``/``RMSE``.
Not planted: channel 0 filled with z_t instead of z_{t-1} (the target leaking into its own
input, as reported in sktime/pytorch-forecasting#182 and #640): at this size the model
does not come to lean on the leak (best ND 0.111 against 0.139 healthy on seed 0 at 10
epochs, 0.095 against 0.088 at 18 epochs), so no measure shows it doing harm.

nndx, as the author would add it: nndx's probe takes a model called on a batch, and
``Net`` is called once per time step, so a small ``Unrolled`` module runs ``train``'s
inner loop over a whole window (input: the stored window with its id column, as
``prep_data`` saves it; output: ``mu`` and ``sigma`` per step) and the loss is the window's
summed ``loss_fn``; a preflight ``nndx.probe`` on a batch drawn as the sampler draws one,
with the optimizer and the training windows and labels as ``data``;
``nndx.Monitor(model, optimizer)`` around the epochs, each batch's summed loss logged and
each evaluation's ``test_loss`` logged as ``split="val"``; then ``nndx.probe(unrolled,
..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deepar"
SOURCE = Source("zhykoties/TimeSeries", "train.py", "b12b13c8250a096e38882d258213abd6c2d78c43", "Apache-2.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16 series, windows of 48 hours, 10 epochs)"),
        Variant(
            "no_scaling",
            "prep_data's scaling left out (v = 1): the LSTM reads and the Gaussian head must output each series "
            "in its own units, from ~5 to ~500, instead of values around 1",
            (C.UNNORMALIZED_TARGETS, C.UNNORMALIZED_INPUTS),
            ("https://github.com/awslabs/gluonts/issues/2413", "https://github.com/awslabs/gluonts/pull/1070",
             "https://github.com/Nixtla/neuralforecast/issues/344"),
            Measure("best_ND", "best test ND at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() dropped from train(): every batch's gradients of the window's summed NLL are "
            "added to all the previous ones before each Adam step",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/wenet-e2e/wekws/pull/73", "https://github.com/snakers4/silero-vad/pull/699",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7", "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("best_ND", "best test ND at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

params = SimpleNamespace(
    learning_rate=3e-3, batch_size=64, lstm_layers=2, num_epochs=10, train_window=48, test_window=48,
    predict_start=36, test_predict_start=36, predict_steps=12, num_class=16, cov_dim=3, lstm_hidden_dim=24,
    embedding_dim=8, sample_times=20, lstm_dropout=0.1, predict_batch=256, device=torch.device("cpu"),
)  # fmt: skip
window_size, stride_size, num_covariates = 48, 12, 3
TRAIN_HOURS, TEST_HOURS = 384, 48


# --------------------------------------------------------------------------- data (preprocess_elect.py)


def make_series(seed: int) -> np.ndarray:
    """[hours, series] of positive hourly loads: a daily and a weekly cycle around a level
    of its own per series, multiplicative noise."""
    rng = np.random.default_rng(seed + 11)
    hours = np.arange(TRAIN_HOURS + TEST_HOURS)
    level = np.exp(rng.uniform(math.log(5), math.log(500), params.num_class))
    phase = rng.uniform(0, 24, params.num_class)
    daily_amp = rng.uniform(0.3, 0.6, params.num_class)
    daily = np.sin(2 * np.pi * (hours[:, None] + phase) / 24)
    weekly = 0.15 * np.sin(2 * np.pi * hours[:, None] / (24 * 7))
    noise = rng.normal(0, 0.05, (len(hours), params.num_class))
    return level * (1 + daily_amp * daily + weekly) * (1 + noise)


def gen_covariates(n_hours: int) -> np.ndarray:
    covariates = np.zeros((n_hours, num_covariates))
    hours = np.arange(n_hours)
    covariates[:, 1] = (hours // 24) % 7  # day of week
    covariates[:, 2] = hours % 24  # hour of day
    for i in range(1, num_covariates):
        covariates[:, i] = (covariates[:, i] - covariates[:, i].mean()) / covariates[:, i].std()
    return covariates


def prep_data(data, covariates, total_time, train=True, scale=True):
    """Windows, scales and labels as prep_data saves them (the series id in the last column)."""
    time_len, num_series = data.shape
    input_size = window_size - stride_size
    windows_per_series = (time_len - input_size) // stride_size
    total_windows = windows_per_series * num_series
    x_input = np.zeros((total_windows, window_size, 1 + num_covariates + 1), dtype="float32")
    label = np.zeros((total_windows, window_size), dtype="float32")
    v_input = np.zeros((total_windows, 2), dtype="float32")
    covariates = covariates.copy() if train else covariates[-time_len:].copy()
    count = 0
    for series in range(num_series):
        age = np.arange(total_time)
        cov_age = (age - age.mean()) / age.std()
        covariates[:, 0] = cov_age[:time_len] if train else cov_age[-time_len:]
        for i in range(windows_per_series):
            window_start = stride_size * i
            window_end = window_start + window_size
            x_input[count, 1:, 0] = data[window_start : window_end - 1, series]  # z_{t-1}
            x_input[count, :, 1 : 1 + num_covariates] = covariates[window_start:window_end, :]
            x_input[count, :, -1] = series
            label[count, :] = data[window_start:window_end, series]
            nonzero_sum = (x_input[count, 1:input_size, 0] != 0).sum()
            if nonzero_sum == 0 or not scale:
                v_input[count, 0] = 0 if scale else 1  # the bug: no scaling at all
            else:
                v_input[count, 0] = np.true_divide(x_input[count, 1:input_size, 0].sum(), nonzero_sum) + 1
                x_input[count, :, 0] = x_input[count, :, 0] / v_input[count, 0]
                if train:
                    label[count, :] = label[count, :] / v_input[count, 0]
            count += 1
    return x_input, v_input, label


# --------------------------------------------------------------------------- model/net.py


class Net(nn.Module):
    def __init__(self, params):
        super().__init__()
        self.params = params
        self.embedding = nn.Embedding(params.num_class, params.embedding_dim)
        self.lstm = nn.LSTM(input_size=1 + params.cov_dim + params.embedding_dim, hidden_size=params.lstm_hidden_dim,
                            num_layers=params.lstm_layers, bias=True, batch_first=False,
                            dropout=params.lstm_dropout)  # fmt: skip
        for names in self.lstm._all_weights:  # forget gate bias 1
            for name in filter(lambda n: "bias" in n, names):
                bias = getattr(self.lstm, name)
                n = bias.size(0)
                bias.data[n // 4 : n // 2].fill_(1.0)
        self.relu = nn.ReLU()
        self.distribution_mu = nn.Linear(params.lstm_hidden_dim * params.lstm_layers, 1)
        self.distribution_presigma = nn.Linear(params.lstm_hidden_dim * params.lstm_layers, 1)
        self.distribution_sigma = nn.Softplus()

    def forward(self, x, idx, hidden, cell):
        onehot_embed = self.embedding(idx)
        lstm_input = torch.cat((x, onehot_embed), dim=2)
        output, (hidden, cell) = self.lstm(lstm_input, (hidden, cell))
        hidden_permute = hidden.permute(1, 2, 0).contiguous().view(hidden.shape[1], -1)  # all layers' h
        pre_sigma = self.distribution_presigma(hidden_permute)
        mu = self.distribution_mu(hidden_permute)
        sigma = self.distribution_sigma(pre_sigma)
        return torch.squeeze(mu), torch.squeeze(sigma), hidden, cell

    def init_hidden(self, input_size):
        return torch.zeros(self.params.lstm_layers, input_size, self.params.lstm_hidden_dim, device=self.params.device)

    def init_cell(self, input_size):
        return torch.zeros(self.params.lstm_layers, input_size, self.params.lstm_hidden_dim, device=self.params.device)

    def test(self, x, v_batch, id_batch, hidden, cell, sampling=False):
        batch_size = x.shape[1]
        p = self.params
        samples = torch.zeros(p.sample_times, batch_size, p.predict_steps, device=p.device)
        for j in range(p.sample_times):
            decoder_hidden, decoder_cell = hidden, cell
            for t in range(p.predict_steps):
                mu_de, sigma_de, decoder_hidden, decoder_cell = self(x[p.predict_start + t].unsqueeze(0), id_batch,
                                                                     decoder_hidden, decoder_cell)  # fmt: skip
                pred = torch.distributions.normal.Normal(mu_de, sigma_de).sample()  # not scaled
                samples[j, :, t] = pred * v_batch[:, 0] + v_batch[:, 1]
                if t < p.predict_steps - 1:
                    x[p.predict_start + t + 1, :, 0] = pred
        sample_mu = torch.median(samples, dim=0)[0]
        sample_sigma = samples.std(dim=0)
        return samples, sample_mu, sample_sigma


def loss_fn(mu, sigma, labels):
    zero_index = labels != 0
    distribution = torch.distributions.normal.Normal(mu[zero_index], sigma[zero_index])
    likelihood = distribution.log_prob(labels[zero_index])
    return -torch.mean(likelihood)


def accuracy_ND(mu, labels):
    zero_index = labels != 0
    diff = torch.sum(torch.abs(mu[zero_index] - labels[zero_index])).item()
    return [diff, torch.sum(torch.abs(labels[zero_index])).item()]


def accuracy_RMSE(mu, labels):
    zero_index = labels != 0
    diff = torch.sum((mu[zero_index] - labels[zero_index]) ** 2).item()
    return [diff, torch.sum(torch.abs(labels[zero_index])).item(), torch.sum(zero_index).item()]


class Unrolled(nn.Module):
    """What the author hands nndx's probe: train()'s inner loop over one window, on the
    window as prep_data stores it (the series id in the last column)."""

    def __init__(self, net: Net) -> None:
        super().__init__()
        self.net = net

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        train_batch = windows[:, :, :-1].permute(1, 0, 2).clone()
        idx = windows[:, 0, -1].long().unsqueeze(0)
        hidden, cell = self.net.init_hidden(windows.shape[0]), self.net.init_cell(windows.shape[0])
        mus, sigmas = [], []
        for t in range(train_batch.shape[0]):
            zero_index = train_batch[t, :, 0] == 0
            if t > 0 and torch.sum(zero_index) > 0:
                train_batch[t, zero_index, 0] = mu[zero_index]
            mu, sigma, hidden, cell = self.net(train_batch[t].unsqueeze(0).clone(), idx, hidden, cell)
            mus.append(mu)
            sigmas.append(sigma)
        return torch.stack((torch.stack(mus, 1), torch.stack(sigmas, 1)), dim=-1)  # [batch, window, (mu, sigma)]


def window_nll(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """train()'s loss: loss_fn summed over the window's steps."""
    return sum(loss_fn(output[:, t, 0], output[:, t, 1], labels[:, t]) for t in range(labels.shape[1]))


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    scale = variant != "no_scaling"
    series = make_series(seed)
    total_time = series.shape[0]
    covariates = gen_covariates(total_time)
    train_x, train_v, train_label = prep_data(series[:TRAIN_HOURS], covariates[:TRAIN_HOURS], total_time,
                                              scale=scale)  # fmt: skip
    test_span = series[TRAIN_HOURS - (window_size - stride_size) :]
    test_x, test_v, test_label = prep_data(test_span, covariates, total_time, train=False, scale=scale)
    train_windows, train_labels = torch.from_numpy(train_x), torch.from_numpy(train_label)
    test_windows, test_labels = torch.from_numpy(test_x), torch.from_numpy(test_label)
    weights = torch.as_tensor(np.abs(train_v[:, 0]) / np.sum(np.abs(train_v[:, 0])), dtype=torch.double)

    model = Net(params)
    optimizer = optim.Adam(model.parameters(), lr=params.learning_rate)
    unrolled = Unrolled(model)

    probe_rows = torch.multinomial(weights, params.batch_size, True, generator=torch.Generator().manual_seed(seed + 1))
    probe_batch = (train_windows[probe_rows], train_labels[probe_rows])
    nx.preflight(unrolled, probe_batch, window_nll, optimizer=optimizer, data=(train_windows, train_labels))
    mon = nx.monitor(model, optimizer, every=5)

    def train_epoch():
        model.train()
        order = torch.multinomial(weights, len(weights), True).tolist()  # WeightedSampler
        losses = []
        for b in range(0, len(order), params.batch_size):
            rows = order[b : b + params.batch_size]
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            batch_size = len(rows)
            train_batch = train_windows[rows, :, :-1].permute(1, 0, 2).to(torch.float32)  # not scaled
            labels_batch = train_labels[rows].permute(1, 0).to(torch.float32)
            idx = train_windows[rows, 0, -1].long().unsqueeze(0)
            loss = torch.zeros(1)
            hidden, cell = model.init_hidden(batch_size), model.init_cell(batch_size)
            for t in range(params.train_window):
                zero_index = train_batch[t, :, 0] == 0
                if t > 0 and torch.sum(zero_index) > 0:
                    train_batch[t, zero_index, 0] = mu[zero_index]
                mu, sigma, hidden, cell = model(train_batch[t].unsqueeze_(0).clone(), idx, hidden, cell)
                loss += loss_fn(mu, sigma, labels_batch[t])
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item() / params.train_window)
        return float(np.mean(losses))

    def evaluate():
        model.eval()
        with torch.no_grad():
            raw = {"ND": np.zeros(2), "RMSE": np.zeros(3), "test_loss": np.zeros(2)}
            for b in range(0, len(test_windows), params.predict_batch):
                test_batch = test_windows[b : b + params.predict_batch, :, :-1].permute(1, 0, 2).clone()
                id_batch = test_windows[b : b + params.predict_batch, 0, -1].long().unsqueeze(0)
                v_batch = torch.from_numpy(test_v[b : b + params.predict_batch])
                labels = test_labels[b : b + params.predict_batch]
                batch_size = test_batch.shape[1]
                input_mu = torch.zeros(batch_size, params.test_predict_start)
                input_sigma = torch.zeros(batch_size, params.test_predict_start)
                hidden, cell = model.init_hidden(batch_size), model.init_cell(batch_size)
                for t in range(params.test_predict_start):
                    zero_index = test_batch[t, :, 0] == 0
                    if t > 0 and torch.sum(zero_index) > 0:
                        test_batch[t, zero_index, 0] = mu[zero_index]
                    mu, sigma, hidden, cell = model(test_batch[t].unsqueeze(0), id_batch, hidden, cell)
                    input_mu[:, t] = v_batch[:, 0] * mu + v_batch[:, 1]
                    input_sigma[:, t] = v_batch[:, 0] * sigma
                _samples, sample_mu, _ = model.test(test_batch, v_batch, id_batch, hidden, cell, sampling=True)
                raw["ND"] += accuracy_ND(sample_mu, labels[:, params.test_predict_start :])
                raw["RMSE"] += accuracy_RMSE(sample_mu, labels[:, params.test_predict_start :])
                steps = input_mu.numel()
                raw["test_loss"] += [loss_fn(input_mu, input_sigma, labels[:, : params.test_predict_start]).item()
                                     * steps, steps]  # fmt: skip
        nd = raw["ND"][0] / raw["ND"][1]
        rmse = np.sqrt(raw["RMSE"][0] / raw["RMSE"][2]) / (raw["RMSE"][1] / raw["RMSE"][2])
        test_loss = raw["test_loss"][0] / raw["test_loss"][1]
        return {"ND": float(nd), "RMSE": float(rmse), "test_loss": float(test_loss)}

    best_test_ND, best = float("inf"), None
    for _epoch in range(params.num_epochs):
        train_loss = train_epoch()
        test_metrics = evaluate()
        mon.log(torch.tensor(test_metrics["test_loss"]), split="val")
        if test_metrics["ND"] <= best_test_ND:
            best_test_ND, best = test_metrics["ND"], test_metrics

    nx.finish(mon, unrolled, probe_batch, window_nll, optimizer=optimizer, data=(train_windows, train_labels))
    return {
        "best_ND": best_test_ND,
        "best_RMSE": best["RMSE"],
        "last_ND": test_metrics["ND"],
        "last_test_loss": test_metrics["test_loss"],
        "last_train_loss": train_loss,
    }
