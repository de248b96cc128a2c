"""Port of jinglescode/time-series-forecasting-pytorch: an LSTM predicting the next day's price.

Source: github.com/jinglescode/time-series-forecasting-pytorch, ``project.py`` (the
script form of ``demo-predicting-stock-prices.ipynb``) at commit
749689e352290616e69d9b3e243af36936328964 (Apache-2.0, Copyright (c) Jingles / Hong Jing).
Written anew from the facts of that file; no code copied.

Kept: the ``config`` dict; ``Normalizer`` (mean/std over the whole series, as the author
fits it); ``prepare_data_x`` (windows of ``window_size`` by stride tricks, the last one
kept aside as the unseen input) and ``prepare_data_y`` (the next value as the label); the
80/20 split in time; ``TimeSeriesDataset`` (``x`` given a feature axis, float32); train and
val ``DataLoader``s both shuffled; ``LSTMModel``: ``linear_1`` (1 -> hidden), an
``nn.ReLU`` module, a 2-layer ``batch_first`` ``nn.LSTM``, its final hidden states
``h_n.permute(1, 0, 2).reshape(batch, -1)``, ``nn.Dropout(0.2)``, ``linear_2``
(2 * hidden -> 1), ``predictions[:, -1]`` returned; ``init_weights``: LSTM biases 0,
``weight_ih`` kaiming-normal, ``weight_hh`` orthogonal; ``nn.MSELoss()``;
``optim.Adam(lr=0.01, betas=(0.9, 0.98), eps=1e-9)``; ``StepLR(step_size, gamma=0.1)``
stepped once per epoch after the train and val passes; ``run_epoch(dataloader,
is_training)``: ``model.train()``/``model.eval()``, ``optimizer.zero_grad()`` only when
training, ``criterion(out.contiguous(), y.contiguous())``, ``epoch_loss +=
loss.item() / batchsize`` (the author's scaling), the LR read with
``scheduler.get_last_lr()``; afterwards unshuffled loaders, ``model.eval()`` and the
predictions on the validation part.
Shrunk: a synthetic daily "adjusted close" (a noisy random walk with drift plus a weekly
and a ~quarterly cycle, 640 days) instead of IBM's history from Alpha Vantage (no
download); ``lstm_size`` 16 instead of 32; 30 epochs instead of 100 and
``scheduler_step_size`` 12 instead of 40 (the same two decays per run, scaled); no plots.

nndx, as the author would add it: a preflight ``nndx.probe`` on a training batch drawn as
the shuffled loader draws one, with ``criterion`` and the train/val windows as ``data``;
``nndx.Monitor`` around the epoch loop; inside ``run_epoch`` each batch's loss logged, as
``split="val"`` in the evaluation pass; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lstm_forecast"
SOURCE = Source("jinglescode/time-series-forecasting-pytorch", "project.py", "749689e352290616e69d9b3e243af36936328964",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "scheduler_step_per_batch",
            "scheduler.step() moved into run_epoch's batch loop (after optimizer.step()): StepLR's step_size, meant "
            "in epochs, counts batches, so the LR is divided by 10 every 12 batches (1.5 epochs) and is ~1e-22 long "
            "before the end",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/ivadomed/ivadomed/pull/55", "https://github.com/pytorch/tutorials/pull/640",
             "https://github.com/aimagelab/meshed-memory-transformer/issues/71"),
            Measure("val_mse", "validation MSE (normalised prices) 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "prediction_not_squeezed",
            "LSTMModel.forward returns predictions (batch, 1) instead of predictions[:, -1] (batch,): MSELoss "
            "broadcasts it against the (batch,) labels to a (batch, batch) matrix (only a UserWarning), so every "
            "window is scored against every label and the model learns the batch mean",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/jsboige/CoursIA/pull/926", "https://github.com/aiboxlab/nlp/issues/97",
             "https://github.com/replicahealth/GluPredKit/issues/45"),
            Measure("val_mse", "validation MSE (normalised prices) 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

config = {
    "data": {"window_size": 20, "train_split_size": 0.80},
    "model": {"input_size": 1, "num_lstm_layers": 2, "lstm_size": 16, "dropout": 0.2},
    "training": {"device": "cpu", "batch_size": 64, "num_epoch": 30, "learning_rate": 0.01, "scheduler_step_size": 12},
}
DAYS = 640


def download_data(seed: int) -> np.ndarray:
    """The adjusted close prices, made up: a random walk with drift, a weekly and a
    ~quarterly cycle, and day-to-day noise, around 100."""
    rng = np.random.default_rng(seed + 5)
    t = np.arange(DAYS)
    walk = np.cumsum(rng.normal(0.05, 0.8, DAYS))
    season = 4.0 * np.sin(2 * np.pi * t / 63) + 1.5 * np.sin(2 * np.pi * t / 5)
    return 100.0 + walk + season + rng.normal(0, 0.3, DAYS)


class Normalizer:
    def __init__(self):
        self.mu = None
        self.sd = None

    def fit_transform(self, x):
        self.mu = np.mean(x, axis=0, keepdims=True)
        self.sd = np.std(x, axis=0, keepdims=True)
        return (x - self.mu) / self.sd

    def inverse_transform(self, x):
        return x * self.sd + self.mu


def prepare_data_x(x, window_size):
    n_row = x.shape[0] - window_size + 1
    output = np.lib.stride_tricks.as_strided(x, shape=(n_row, window_size), strides=(x.strides[0], x.strides[0]))
    return output[:-1], output[-1]


def prepare_data_y(x, window_size):
    return x[window_size:]  # the next day as the label


class TimeSeriesDataset(Dataset):
    def __init__(self, x, y):
        self.x = np.expand_dims(x, 2).astype(np.float32)  # [batch, sequence, features]
        self.y = y.astype(np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


class LSTMModel(nn.Module):
    def __init__(self, input_size=1, hidden_layer_size=32, num_layers=2, output_size=1, dropout=0.2,
                 squeeze: bool = True):  # fmt: skip
        super().__init__()
        self.hidden_layer_size = hidden_layer_size
        self.linear_1 = nn.Linear(input_size, hidden_layer_size)
        self.relu = nn.ReLU()
        self.lstm = nn.LSTM(hidden_layer_size, hidden_size=self.hidden_layer_size, num_layers=num_layers,
                            batch_first=True)  # fmt: skip
        self.dropout = nn.Dropout(dropout)
        self.linear_2 = nn.Linear(num_layers * hidden_layer_size, output_size)
        self.squeeze = squeeze
        self.init_weights()

    def init_weights(self):
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0.0)
            elif "weight_ih" in name:
                nn.init.kaiming_normal_(param)
            elif "weight_hh" in name:
                nn.init.orthogonal_(param)

    def forward(self, x):
        batchsize = x.shape[0]
        x = self.relu(self.linear_1(x))
        lstm_out, (h_n, c_n) = self.lstm(x)
        x = h_n.permute(1, 0, 2).reshape(batchsize, -1)
        predictions = self.linear_2(self.dropout(x))
        return predictions[:, -1] if self.squeeze else predictions  # the bug: (batch, 1) kept


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    data_close_price = download_data(seed)
    scaler = Normalizer()
    normalized = scaler.fit_transform(data_close_price)
    window = config["data"]["window_size"]
    data_x, _data_x_unseen = prepare_data_x(normalized, window_size=window)
    data_y = prepare_data_y(normalized, window_size=window)
    split_index = int(data_y.shape[0] * config["data"]["train_split_size"])
    dataset_train = TimeSeriesDataset(data_x[:split_index], data_y[:split_index])
    dataset_val = TimeSeriesDataset(data_x[split_index:], data_y[split_index:])

    tr = config["training"]
    generator = torch.Generator().manual_seed(seed)
    train_dataloader = DataLoader(dataset_train, batch_size=tr["batch_size"], shuffle=True, generator=generator)
    val_dataloader = DataLoader(dataset_val, batch_size=tr["batch_size"], shuffle=True, generator=generator)

    m = config["model"]
    model = LSTMModel(input_size=m["input_size"], hidden_layer_size=m["lstm_size"], num_layers=m["num_lstm_layers"],
                      output_size=1, dropout=m["dropout"], squeeze=variant != "prediction_not_squeezed")  # fmt: skip
    criterion = nn.MSELoss()
    optimizer = optim.Adam(model.parameters(), lr=tr["learning_rate"], betas=(0.9, 0.98), eps=1e-9)
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=tr["scheduler_step_size"], gamma=0.1)
    per_batch = variant == "scheduler_step_per_batch"

    x_train, y_train = torch.from_numpy(dataset_train.x), torch.from_numpy(dataset_train.y)
    x_val, y_val = torch.from_numpy(dataset_val.x), torch.from_numpy(dataset_val.y)
    # a batch as the shuffled train loader serves one (its own generator: the loop's order is untouched)
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(seed + 1))[: tr["batch_size"]]
    first_batch = (x_train[order], y_train[order])
    splits = (x_train, y_train, x_val, y_val)
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5)

    def run_epoch(dataloader, is_training=False):
        epoch_loss = 0
        model.train() if is_training else model.eval()
        for x, y in dataloader:
            if is_training:
                optimizer.zero_grad()
            batchsize = x.shape[0]
            out = model(x)
            loss = criterion(out.contiguous(), y.contiguous())
            if is_training:
                loss.backward()
                optimizer.step()
                if per_batch:
                    scheduler.step()  # the bug: the epoch schedule stepped per batch
            mon.log(loss, split="train" if is_training else "val")
            epoch_loss += loss.detach().item() / batchsize
        return epoch_loss, scheduler.get_last_lr()[0]

    for _epoch in range(tr["num_epoch"]):
        loss_train, lr_train = run_epoch(train_dataloader, is_training=True)
        loss_val, lr_val = run_epoch(val_dataloader)
        if not per_batch:
            scheduler.step()

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    # the author's evaluation: unshuffled loader, eval mode, predictions on the validation part
    model.eval()
    val_dataloader = DataLoader(dataset_val, batch_size=tr["batch_size"], shuffle=False)
    predicted_val = np.array([])
    with torch.no_grad():
        for x, _y in val_dataloader:
            predicted_val = np.concatenate((predicted_val, model(x).reshape(-1).numpy()))
    val_mse = float(np.mean((predicted_val - dataset_val.y) ** 2))
    return {"val_mse": val_mse, "last_loss_train": loss_train, "last_loss_val": loss_val, "last_lr": lr_train}
