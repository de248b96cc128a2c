"""Port of FelixOpolka/STGCN-PyTorch: spatio-temporal graph convolutional network (Yu et al.)
for traffic speed forecasting: gated temporal convolutions, a first-order graph convolution
over the degree-normalised adjacency, batch norm over the nodes, a linear read-out to the
next time steps; MSE, Adam; speeds z-scored.

Source: github.com/FelixOpolka/STGCN-PyTorch, ``stgcn.py``, ``main.py`` and ``utils.py`` at
commit 846d511416b209c446310c1e4889c710f64ea6d7 (MIT, Copyright (c) 2018 Felix Opolka).
Written anew from the facts of those files; no code copied.

Kept: ``TimeBlock`` (three ``Conv2d(in, out, (1, kernel_size=3))`` over NCHW-permuted input,
``conv1(X) + sigmoid(conv2(X))``, then ``relu(that + conv3(X))``, permuted back);
``STGCNBlock`` (``temporal1``; the graph convolution ``einsum("ij,jklm->kilm", A_hat,
t.permute(1, 0, 2, 3))``; ``relu(lfs @ Theta1)`` with ``Theta1`` uniform in +-1/sqrt(spatial
channels); ``temporal2``; ``BatchNorm2d(num_nodes)``); ``STGCN`` (two blocks, a last
``TimeBlock``, ``fully`` = Linear((T_in - 2 * 5) * out_channels, T_out) over the
flattened time x channel axis); ``utils.py``'s ``load_metr_la_data`` (X as (nodes,
features, time), z-scored with the mean and std of each feature over nodes and time),
``get_normalized_adj`` (``A + I``, degrees floored at 1e-4, ``D^-1/2 (A + I) D^-1/2``),
``generate_dataset`` (windows sliding by 1: inputs (samples, nodes, T_in, features),
targets the speed feature (index 0) of the next T_out steps); ``main.py`` (the 60/20/20
time split, ``num_timesteps_input`` 12, ``num_timesteps_output`` 3, ``batch_size`` 50,
``torch.manual_seed(7)``, ``Adam(lr=1e-3)``, ``MSELoss``; ``train_epoch`` with a
``torch.randperm`` permutation, ``net.train()``, ``optimizer.zero_grad()``, forward,
loss, backward, step, and the mean of the batch losses; per epoch the validation pass
under ``no_grad`` in ``net.eval()``: the loss and the MAE of ``out * stds[0] + means[0]``
against the target unnormalised the same way).
Shrunk: a synthetic road network instead of METR-LA (no download): 20 sensors on a ring
road with 6 cross links, the adjacency a Gaussian kernel of the road distance (as the
DCRNN/METR-LA weights are), 12 days of 5-minute readings at 48 steps a day (a
15-minute day, so that 576 steps hold 12 daily cycles), two features per sensor
(speed in mph and time of day) as in the METR-LA ``node_values``; speeds are each
sensor's free-flow speed (55-70 mph) minus congestion that rises at the morning and
evening rush, spreads to neighbouring sensors through the adjacency and decays, plus
noise; hidden widths 16/8 instead of 64/16; 40 epochs instead of 1,000; no plots or
checkpoints.
Measure only (not in the program): the test MAE and RMSE in mph on the last 20% of the
time axis after training, with the model in eval mode (the program's own validation
MAE is also returned).

nndx, as the author would add it: a preflight ``nndx.probe`` of ``net`` on the first
training batch, inputs ``(A_wave, X_batch)`` in the order ``net`` takes them, target
``y_batch``, ``MSELoss`` and the optimizer; ``nndx.Monitor(net, optimizer,
loss_fn=MSELoss())`` around the epochs, every batch's loss through ``mon.loss_fn`` and
logged, each epoch's validation loss logged with ``split="val"``; after training
``nndx.probe(..., monitor=mon)`` on the same batch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "stgcn"
SOURCE = Source("FelixOpolka/STGCN-PyTorch", "main.py", "846d511416b209c446310c1e4889c710f64ea6d7", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 20 sensors, widths 16/8, 40 epochs)"),
        Variant(
            "no_zscore",
            "load_metr_la_data returns the raw readings (speeds ~60 mph, time of day in [0, 1)) without the "
            "z-score; means 0 and stds 1 so the MAE is still in mph: the network must grow its output to ~60",
            (C.UNNORMALIZED_TARGETS, C.UNNORMALIZED_INPUTS),
            ("https://github.com/hazdzz/stgcn/issues/12", "https://discuss.pytorch.org/t/scaling-target-variables/41046",
             "https://stats.stackexchange.com/questions/409000/should-we-normalize-target-data-as-well-as-input-data"),
            Measure("test_mae", "test MAE (mph) at least 1.5x the healthy run's (2.69 against 1.46 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "zero_grad_per_epoch",
            "optimizer.zero_grad() called once at the start of each epoch instead of before every batch: each "
            "step applies the sum of the gradients of all batches so far in the epoch",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/IDEA-Research/DN-DETR/issues/19", "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            Measure("test_mae", "test MAE (mph) at least 1.2x the healthy run's (1.78 against 1.46 on seed 0)",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

NUM_TIMESTEPS_INPUT, NUM_TIMESTEPS_OUTPUT, EPOCHS, BATCH_SIZE, LR = 12, 3, 40, 50, 1e-3
OUT_CHANNELS, SPATIAL_CHANNELS = 16, 8
N_SENSORS, STEPS_PER_DAY, DAYS = 20, 48, 12


# --------------------------------------------------------------------------- the data (METR-LA stand-in)


def road_network(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sensors on a ring road with a few cross links: (Gaussian-kernel adjacency W, road distances)."""
    rng = np.random.default_rng(1000 + seed)
    n = N_SENSORS
    dist = np.full((n, n), np.inf)
    np.fill_diagonal(dist, 0.0)
    for i in range(n):
        d = rng.uniform(0.8, 2.0)
        dist[i, (i + 1) % n] = dist[(i + 1) % n, i] = d
    for _ in range(6):
        i, j = rng.choice(n, size=2, replace=False)
        dist[i, j] = dist[j, i] = rng.uniform(1.0, 3.0)
    for k in range(n):  # shortest road distances
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
    sigma = np.std(dist[np.isfinite(dist) & (dist > 0)])
    w = np.exp(-((dist / sigma) ** 2))
    w[w < 0.1] = 0.0
    np.fill_diagonal(w, 0.0)
    return w.astype(np.float32), dist


def node_values(w: np.ndarray, seed: int) -> np.ndarray:
    """(time, sensors, 2): speed in mph and time of day, as METR-LA's node_values.npy."""
    rng = np.random.default_rng(seed)
    n, steps = N_SENSORS, STEPS_PER_DAY * DAYS
    free_flow = rng.uniform(55.0, 70.0, size=n)
    sensitivity = rng.uniform(0.3, 1.0, size=n)
    p = w / np.maximum(w.sum(1, keepdims=True), 1e-6)
    tod = (np.arange(steps) % STEPS_PER_DAY) / STEPS_PER_DAY
    congestion = np.zeros(n)
    speeds = np.zeros((steps, n))
    for t in range(steps):
        rush = math.exp(-((tod[t] - 0.33) ** 2) / 0.004) + 0.8 * math.exp(-((tod[t] - 0.72) ** 2) / 0.006)
        forcing = 0.35 * rush * sensitivity * rng.uniform(0.7, 1.3, size=n)
        congestion = 0.6 * congestion + 0.3 * p @ congestion + forcing
        speeds[t] = free_flow - 28.0 * np.tanh(congestion) + rng.normal(0.0, 1.5, size=n)
    return np.stack([speeds, np.repeat(tod[:, None], n, axis=1)], axis=2).astype(np.float32)


def load_metr_la_data(seed: int, zscore: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    w = road_network(seed)[0]
    X = node_values(w, seed).transpose((1, 2, 0))  # (nodes, features, time)  # noqa: N806
    if not zscore:  # the variant: raw readings
        return w, X, np.zeros(X.shape[1], np.float32), np.ones(X.shape[1], np.float32)
    means = np.mean(X, axis=(0, 2))
    X = X - means.reshape(1, -1, 1)  # noqa: N806
    stds = np.std(X, axis=(0, 2))
    X = X / stds.reshape(1, -1, 1)  # noqa: N806
    return w, X, means, stds


def get_normalized_adj(A: np.ndarray) -> np.ndarray:  # noqa: N803
    A = A + np.diag(np.ones(A.shape[0], dtype=np.float32))  # noqa: N806
    D = np.array(np.sum(A, axis=1)).reshape((-1,))  # noqa: N806
    D[D <= 10e-5] = 10e-5
    diag = np.reciprocal(np.sqrt(D))
    return np.multiply(np.multiply(diag.reshape((-1, 1)), A), diag.reshape((1, -1)))


def generate_dataset(X: np.ndarray, num_timesteps_input: int, num_timesteps_output: int):  # noqa: N803
    indices = [(i, i + num_timesteps_input + num_timesteps_output)
               for i in range(X.shape[2] - (num_timesteps_input + num_timesteps_output) + 1)]  # fmt: skip
    features, target = [], []
    for i, j in indices:
        features.append(X[:, :, i : i + num_timesteps_input].transpose((0, 2, 1)))
        target.append(X[:, 0, i + num_timesteps_input : j])
    return torch.from_numpy(np.array(features)), torch.from_numpy(np.array(target))


# --------------------------------------------------------------------------- stgcn.py


class TimeBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, (1, kernel_size))
        self.conv2 = nn.Conv2d(in_channels, out_channels, (1, kernel_size))
        self.conv3 = nn.Conv2d(in_channels, out_channels, (1, kernel_size))

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        X = X.permute(0, 3, 1, 2)  # noqa: N806
        temp = self.conv1(X) + torch.sigmoid(self.conv2(X))
        out = F.relu(temp + self.conv3(X))
        return out.permute(0, 2, 3, 1)


class STGCNBlock(nn.Module):
    def __init__(self, in_channels: int, spatial_channels: int, out_channels: int, num_nodes: int) -> None:
        super().__init__()
        self.temporal1 = TimeBlock(in_channels=in_channels, out_channels=out_channels)
        self.Theta1 = nn.Parameter(torch.FloatTensor(out_channels, spatial_channels))
        self.temporal2 = TimeBlock(in_channels=spatial_channels, out_channels=out_channels)
        self.batch_norm = nn.BatchNorm2d(num_nodes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.Theta1.shape[1])
        self.Theta1.data.uniform_(-stdv, stdv)

    def forward(self, X: torch.Tensor, A_hat: torch.Tensor) -> torch.Tensor:  # noqa: N803
        t = self.temporal1(X)
        lfs = torch.einsum("ij,jklm->kilm", [A_hat, t.permute(1, 0, 2, 3)])
        t2 = F.relu(torch.matmul(lfs, self.Theta1))
        t3 = self.temporal2(t2)
        return self.batch_norm(t3)


class STGCN(nn.Module):
    def __init__(self, num_nodes: int, num_features: int, num_timesteps_input: int, num_timesteps_output: int) -> None:
        super().__init__()
        self.block1 = STGCNBlock(in_channels=num_features, out_channels=OUT_CHANNELS,
                                 spatial_channels=SPATIAL_CHANNELS, num_nodes=num_nodes)  # fmt: skip
        self.block2 = STGCNBlock(in_channels=OUT_CHANNELS, out_channels=OUT_CHANNELS,
                                 spatial_channels=SPATIAL_CHANNELS, num_nodes=num_nodes)  # fmt: skip
        self.last_temporal = TimeBlock(in_channels=OUT_CHANNELS, out_channels=OUT_CHANNELS)
        self.fully = nn.Linear((num_timesteps_input - 2 * 5) * OUT_CHANNELS, num_timesteps_output)

    def forward(self, A_hat: torch.Tensor, X: torch.Tensor) -> torch.Tensor:  # noqa: N803
        out1 = self.block1(X, A_hat)
        out2 = self.block2(out1, A_hat)
        out3 = self.last_temporal(out2)
        return self.fully(out3.reshape((out3.shape[0], out3.shape[1], -1)))


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(7 + seed)
    A, X, means, stds = load_metr_la_data(seed, zscore=variant != "no_zscore")  # noqa: N806
    split_line1, split_line2 = int(X.shape[2] * 0.6), int(X.shape[2] * 0.8)
    training_input, training_target = generate_dataset(X[:, :, :split_line1], NUM_TIMESTEPS_INPUT,
                                                       NUM_TIMESTEPS_OUTPUT)  # fmt: skip
    val_input, val_target = generate_dataset(X[:, :, split_line1:split_line2], NUM_TIMESTEPS_INPUT,
                                             NUM_TIMESTEPS_OUTPUT)  # fmt: skip
    test_input, test_target = generate_dataset(X[:, :, split_line2:], NUM_TIMESTEPS_INPUT, NUM_TIMESTEPS_OUTPUT)
    A_wave = torch.from_numpy(get_normalized_adj(A))  # noqa: N806

    net = STGCN(A_wave.shape[0], training_input.shape[3], NUM_TIMESTEPS_INPUT, NUM_TIMESTEPS_OUTPUT)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    loss_criterion = nn.MSELoss()

    probe_batch = ((A_wave, training_input[:BATCH_SIZE]), training_target[:BATCH_SIZE])
    nx.preflight(net, probe_batch, loss_criterion, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10, loss_fn=loss_criterion)

    def train_epoch(batch_size: int) -> float:
        permutation = torch.randperm(training_input.shape[0])
        epoch_training_losses = []
        if variant == "zero_grad_per_epoch":
            optimizer.zero_grad()
        for i in range(0, training_input.shape[0], batch_size):
            net.train()
            if variant != "zero_grad_per_epoch":
                optimizer.zero_grad()
            indices = permutation[i : i + batch_size]
            X_batch, y_batch = training_input[indices], training_target[indices]  # noqa: N806
            out = net(A_wave, X_batch)
            loss = mon.loss_fn(out, y_batch)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            epoch_training_losses.append(loss.detach().cpu().numpy())
        return float(sum(epoch_training_losses) / len(epoch_training_losses))

    def evaluate(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float, float]:
        with torch.no_grad():
            net.eval()
            out = net(A_wave, inputs)
            loss = loss_criterion(out, targets).item()
            out_unnormalized = out.numpy() * stds[0] + means[0]
            target_unnormalized = targets.numpy() * stds[0] + means[0]
            mae = float(np.mean(np.absolute(out_unnormalized - target_unnormalized)))
            rmse = float(np.sqrt(np.mean((out_unnormalized - target_unnormalized) ** 2)))
        return loss, mae, rmse

    training_losses, validation_losses, validation_maes = [], [], []
    for _epoch in range(EPOCHS):
        training_losses.append(train_epoch(BATCH_SIZE))
        val_loss, val_mae, _ = evaluate(val_input, val_target)
        validation_losses.append(val_loss)
        validation_maes.append(val_mae)
        nx.timed(lambda: mon.log(val_loss, split="val"))

    nx.finish(mon, net, probe_batch, loss_criterion, optimizer=optimizer)
    _, test_mae, test_rmse = evaluate(test_input, test_target)
    return {
        "test_mae": test_mae,
        "test_rmse": test_rmse,
        "val_mae": validation_maes[-1],
        "val_loss": validation_losses[-1],
        "train_loss": training_losses[-1],
    }
