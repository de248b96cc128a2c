"""Port of cure-lab/LTSF-Linear's DLinear (Zeng et al., "Are Transformers Effective for Time
Series Forecasting?"): a moving-average series decomposition, then one ``Linear`` from the
look-back window to the horizon for the seasonal part and one for the trend, summed;
trained with MSE and Adam, the LR halved after every epoch, early stopping on validation.

Source: github.com/cure-lab/LTSF-Linear, ``run_longExp.py``, ``exp/exp_main.py``,
``models/DLinear.py``, ``data_provider/data_factory.py``, ``data_provider/data_loader.py``
and ``utils/tools.py`` at commit 0c113668a3b88c4c4ee586b8c5ec3e539c4de5a6 (Apache-2.0,
Copyright 2022 DLinear Authors). Written anew from the facts of those files; no code copied.

Kept: ``models/DLinear.py``'s ``Model`` with ``individual=False`` (the ETTh1 script passes no
``--individual``): ``moving_avg`` (the window padded at both ends by repeating its first
and last step ``(kernel_size - 1) // 2`` times, ``AvgPool1d(kernel_size, stride=1,
padding=0)`` over time), ``series_decomp`` with ``kernel_size = 25`` (residual = input -
moving mean), ``Linear_Seasonal`` and ``Linear_Trend`` = ``nn.Linear(seq_len, pred_len)``
with their default init, the forward (decompose ``[B, L, C]``, ``permute(0, 2, 1)`` both
parts to ``[B, C, L]``, the two linears, their sum permuted back to ``[B, pred_len, C]``).
``Dataset_ETT_hour``'s borders (train, then val and test each starting ``seq_len`` before
their own span), the ``StandardScaler`` fitted on the train span and applied to the whole
series, ``__getitem__`` (``seq_x`` the ``seq_len`` inputs; ``seq_y`` the last
``label_len`` of them then the ``pred_len`` future steps; their ``timeF`` marks), and
``data_provider`` (train and val loaders shuffled with ``drop_last=True``, the test loader
unshuffled without ``drop_last``); ``Exp_Main``: ``Adam(lr)``, ``nn.MSELoss()``, the epoch
loop (``model.train()``; per batch ``zero_grad``, ``outputs = model(batch_x)`` as for every
'Linear' model, ``f_dim = 0`` for ``features='M'``, outputs and ``batch_y`` cut to their
last ``pred_len`` steps, loss, ``backward``, ``step``), ``vali`` on the val and test loaders
(``model.eval()``, ``torch.no_grad()``, then ``model.train()``), ``EarlyStopping``
(patience 3, the best validation loss's weights kept: in memory instead of
``checkpoint.pth``), ``adjust_learning_rate`` type1 (``lr * 0.5 ** epoch`` after epoch
``epoch + 1``), the best weights reloaded, then ``test`` (``model.eval()``, MSE and MAE over
the whole test loader). The ETTh1 script's settings: ``features M``, ``seq_len 336``,
``label_len 48`` (the default), ``pred_len 96`` (the first of its four runs), ``enc_in 7``,
``batch_size 32``, ``learning_rate 0.005``, ``train_epochs 10``, ``patience 3``, ``itr 1``.
Shrunk: only the data: a synthetic 7-column hourly series stands in for ETTh1.csv (no
download), with ETTh1's 12/4/4-month borders (8,640/2,880/2,880 hours): six "load" columns (a
slowly wandering level shared in part by all, a daily cycle with a harmonic, a weekly cycle,
AR(1) noise, each on its own scale and offset) and an "OT" column (a slow, lagged mix of the
loads plus its own daily cycle and noise). DLinear itself is small enough to keep every
setting of the script. No plots, result files or ``predict``.
Measure only (not in the program): ``forecast_mse``, the test MSE of ``model(batch_x)``
against the true horizon (the last ``pred_len`` steps of ``batch_y``) whatever the program
itself compares, and ``naive_mse``, the last input value repeated over the horizon.

nndx, as the author would add it: a preflight ``nndx.probe`` on one shuffled training batch
as the loop builds it (``batch_x``, the target cut from ``batch_y``) with ``criterion`` and
the optimizer, the train and val windows and their targets as ``data``;
``nndx.Monitor(model, model_optim, loss_fn=criterion)`` around the epochs, the loss called
as ``mon.loss_fn``, each batch's loss logged and each epoch's ``vali_loss`` logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dlinear"
SOURCE = Source("cure-lab/LTSF-Linear", "exp/exp_main.py", "0c113668a3b88c4c4ee586b8c5ec3e539c4de5a6",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the ETTh1 script's DLinear run as published (seq_len 336, pred_len 96, lr 0.005)"),
        Variant(
            "view_not_permute",
            "DLinear's forward lays the decomposed [B, L, C] parts out as [B, C, L] with reshape instead of "
            "permute(0, 2, 1), and its [B, C, pred_len] output back with reshape: each 'time' row the linears "
            "read mixes channels and time steps",
            (C.WRONG_RESHAPE,),
            ("https://github.com/xinzzzhou/ScalableTransformer4HighDimensionMTSF/issues/4",
             "https://github.com/vitrioil/Speech-Separation/issues/4",
             "https://github.com/jsbaan/transformer-from-scratch/pull/6"),
            Measure("forecast_mse", "test MSE of the forecast 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "target_from_label_start",
            "the loss's target cut from the start of batch_y (batch_y[:, :pred_len]) instead of its end: seq_y "
            "begins with the last label_len input steps, so the model is fitted to a window shifted label_len "
            "steps into the past, half of it copied from its own input (train, vali and test alike)",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/cure-lab/SCINet/issues/13",
             "https://github.com/lingbai-kong/CausalFormer/issues/8",
             "https://github.com/cure-lab/LTSF-Linear/issues/1"),
            Measure("forecast_mse", "test MSE of the forecast against the true horizon 1.15x the healthy run's "
                    "or more (the program's own test MSE, against the shifted target, looks better instead)",
                    lambda healthy, buggy: not buggy < 1.15 * healthy),
        ),
    )
}

ARGS = {
    "seq_len": 336, "label_len": 48, "pred_len": 96, "enc_in": 7, "individual": False, "moving_avg": 25,
    "batch_size": 32, "learning_rate": 0.005, "train_epochs": 10, "patience": 3, "lradj": "type1",
}  # fmt: skip
N_TRAIN, N_VAL, N_TEST = 12 * 30 * 24, 4 * 30 * 24, 4 * 30 * 24
HOURS = N_TRAIN + N_VAL + N_TEST


# --------------------------------------------------------------------------- models/DLinear.py


class MovingAvg(nn.Module):
    """The trend: a moving average over time, the ends padded with the first/last step."""

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.avg = nn.AvgPool1d(kernel_size=kernel_size, stride=stride, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, L, C]
        pad = (self.kernel_size - 1) // 2
        padded = torch.cat([x[:, :1, :].repeat(1, pad, 1), x, x[:, -1:, :].repeat(1, pad, 1)], dim=1)
        return self.avg(padded.permute(0, 2, 1)).permute(0, 2, 1)


class SeriesDecomp(nn.Module):
    def __init__(self, kernel_size: int) -> None:
        super().__init__()
        self.moving_avg = MovingAvg(kernel_size, stride=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        trend = self.moving_avg(x)
        return x - trend, trend


class DLinear(nn.Module):
    """Decomposition-Linear. ``layout_by_view``: the bug, the [B, L, C] <-> [B, C, L] changes of
    layout made with ``reshape`` instead of ``permute``."""

    def __init__(self, seq_len: int, pred_len: int, enc_in: int, individual: bool = False, kernel_size: int = 25,
                 layout_by_view: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.seq_len, self.pred_len = seq_len, pred_len
        self.decompsition = SeriesDecomp(kernel_size)
        self.individual, self.channels = individual, enc_in
        self.layout_by_view = layout_by_view
        if individual:
            self.Linear_Seasonal = nn.ModuleList([nn.Linear(seq_len, pred_len) for _ in range(enc_in)])
            self.Linear_Trend = nn.ModuleList([nn.Linear(seq_len, pred_len) for _ in range(enc_in)])
        else:
            self.Linear_Seasonal = nn.Linear(seq_len, pred_len)
            self.Linear_Trend = nn.Linear(seq_len, pred_len)

    def _swap_time_and_channels(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout_by_view:  # the bug
            return x.reshape(x.shape[0], x.shape[2], x.shape[1])
        return x.permute(0, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, seq_len, C]
        seasonal_init, trend_init = self.decompsition(x)
        seasonal_init = self._swap_time_and_channels(seasonal_init)  # [B, C, seq_len]
        trend_init = self._swap_time_and_channels(trend_init)
        if self.individual:
            seasonal_output = torch.zeros(seasonal_init.size(0), seasonal_init.size(1), self.pred_len,
                                          dtype=seasonal_init.dtype)  # fmt: skip
            trend_output = torch.zeros_like(seasonal_output)
            for i in range(self.channels):
                seasonal_output[:, i, :] = self.Linear_Seasonal[i](seasonal_init[:, i, :])
                trend_output[:, i, :] = self.Linear_Trend[i](trend_init[:, i, :])
        else:
            seasonal_output = self.Linear_Seasonal(seasonal_init)
            trend_output = self.Linear_Trend(trend_init)
        return self._swap_time_and_channels(seasonal_output + trend_output)  # [B, pred_len, C]


# --------------------------------------------------------------------------- data (ETTh1 stand-in)


def make_series(seed: int, hours: int = HOURS) -> tuple[np.ndarray, np.ndarray]:
    """(values [hours, 7], timeF marks [hours, 4]) hourly from 2016-07-01 00:00 (a Friday)."""
    rng = np.random.default_rng(1000 + seed)
    t = np.arange(hours, dtype=np.float64)
    shared = np.cumsum(rng.normal(0.0, 0.04, hours))  # a slowly wandering level (weather, demand)
    shared = np.convolve(shared, np.ones(72) / 72, mode="same")
    loads = []
    for _ in range(6):
        own = np.cumsum(rng.normal(0.0, 0.03, hours))
        phase = rng.uniform(0, 2 * np.pi)
        daily = rng.uniform(0.6, 1.4) * np.sin(2 * np.pi * t / 24 + phase) \
            + rng.uniform(0.1, 0.5) * np.sin(4 * np.pi * t / 24 + rng.uniform(0, 2 * np.pi))  # fmt: skip
        weekly = rng.uniform(0.2, 0.6) * np.sin(2 * np.pi * t / 168 + rng.uniform(0, 2 * np.pi))
        noise = np.zeros(hours)
        eps = rng.normal(0.0, 0.25, hours)
        for i in range(1, hours):
            noise[i] = 0.9 * noise[i - 1] + eps[i]
        column = rng.uniform(0.5, 1.5) * shared + own + daily + weekly + noise
        loads.append(rng.uniform(2.0, 12.0) * column + rng.uniform(-5.0, 20.0))
    loads = np.stack(loads, axis=1)
    mix = rng.dirichlet(np.ones(6)) @ ((loads - loads.mean(0)) / loads.std(0)).T
    smooth = np.zeros(hours)
    for i in range(1, hours):  # oil temperature follows the load slowly
        smooth[i] = 0.95 * smooth[i - 1] + 0.05 * mix[i - 1]
    ot = 8.0 * smooth + 2.0 * np.sin(2 * np.pi * (t - 14) / 24) + rng.normal(0.0, 0.5, hours) + 30.0
    values = np.concatenate([loads, ot[:, None]], axis=1)
    hour, day = t % 24, t // 24  # timeF for freq 'h': HourOfDay, DayOfWeek, DayOfMonth, DayOfYear
    marks = np.stack([hour / 23.0 - 0.5, ((day + 4) % 7) / 6.0 - 0.5, (day % 30) / 30.0 - 0.5,
                      ((day + 182) % 366) / 365.0 - 0.5], axis=1)  # fmt: skip
    return values, marks


class StandardScaler:
    def fit(self, data: np.ndarray) -> None:
        self.mean_, self.scale_ = data.mean(0), data.std(0)

    def transform(self, data: np.ndarray) -> np.ndarray:
        return (data - self.mean_) / self.scale_


class Dataset_ETT_hour(Dataset):
    def __init__(self, values: np.ndarray, marks: np.ndarray, flag: str, size: tuple[int, int, int],
                 scale: bool = True, borders: tuple[int, int, int] = (N_TRAIN, N_VAL, N_TEST)) -> None:  # fmt: skip
        self.seq_len, self.label_len, self.pred_len = size
        k = {"train": 0, "val": 1, "test": 2}[flag]
        n_train, n_val, n_test = borders
        border1s = [0, n_train - self.seq_len, n_train + n_val - self.seq_len]
        border2s = [n_train, n_train + n_val, n_train + n_val + n_test]
        self.scaler = StandardScaler()
        if scale:
            self.scaler.fit(values[border1s[0] : border2s[0]])
            data = self.scaler.transform(values)
        else:
            data = values
        self.data_x = data[border1s[k] : border2s[k]].astype(np.float32)
        self.data_y = data[border1s[k] : border2s[k]].astype(np.float32)
        self.data_stamp = marks[border1s[k] : border2s[k]].astype(np.float32)

    def __getitem__(self, index: int):
        s_end = index + self.seq_len
        r_begin = s_end - self.label_len
        r_end = r_begin + self.label_len + self.pred_len
        return (self.data_x[index:s_end], self.data_y[r_begin:r_end], self.data_stamp[index:s_end],
                self.data_stamp[r_begin:r_end])  # fmt: skip

    def __len__(self) -> int:
        return len(self.data_x) - self.seq_len - self.pred_len + 1


def data_provider(values, marks, flag: str, seed: int) -> tuple[Dataset_ETT_hour, DataLoader]:
    size = (ARGS["seq_len"], ARGS["label_len"], ARGS["pred_len"])
    data_set = Dataset_ETT_hour(values, marks, flag, size)
    shuffle_flag, drop_last = (False, False) if flag == "test" else (True, True)
    generator = torch.Generator().manual_seed(seed + {"train": 1, "val": 2, "test": 3}[flag])
    loader = DataLoader(data_set, batch_size=ARGS["batch_size"], shuffle=shuffle_flag, drop_last=drop_last,
                        generator=generator)  # fmt: skip
    return data_set, loader


# --------------------------------------------------------------------------- exp/exp_main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(2021 + seed)
    np.random.seed(2021 + seed)
    values, marks = make_series(seed)
    train_data, train_loader = data_provider(values, marks, "train", seed)
    vali_data, vali_loader = data_provider(values, marks, "val", seed)
    test_data, test_loader = data_provider(values, marks, "test", seed)

    model = DLinear(args["seq_len"], args["pred_len"], args["enc_in"], args["individual"], args["moving_avg"],
                    layout_by_view=variant == "view_not_permute").float()  # fmt: skip
    model_optim = torch.optim.Adam(model.parameters(), lr=args["learning_rate"])
    criterion = nn.MSELoss()
    pred_len, f_dim = args["pred_len"], 0  # features 'M'

    def cut_target(batch_y: torch.Tensor) -> torch.Tensor:
        if variant == "target_from_label_start":
            return batch_y[:, :pred_len, f_dim:]
        return batch_y[:, -pred_len:, f_dim:]

    def stacked(ds: Dataset_ETT_hour) -> tuple[torch.Tensor, torch.Tensor]:
        items = [ds[i] for i in range(len(ds))]
        x = torch.from_numpy(np.stack([it[0] for it in items]))
        return x, cut_target(torch.from_numpy(np.stack([it[1] for it in items])))

    probe_x, probe_y, _, _ = next(iter(DataLoader(train_data, batch_size=args["batch_size"], shuffle=True,
                                                  generator=torch.Generator().manual_seed(seed + 7))))  # fmt: skip
    probe_batch = (probe_x.float(), cut_target(probe_y.float()))
    splits = (*stacked(train_data), *stacked(vali_data))
    nx.preflight(model, probe_batch, criterion, optimizer=model_optim, data=splits)
    mon = nx.monitor(model, model_optim, every=5, loss_fn=criterion)

    def vali(loader: DataLoader) -> float:
        total_loss = []
        model.eval()
        with torch.no_grad():
            for batch_x, batch_y, _batch_x_mark, _batch_y_mark in loader:
                outputs = model(batch_x.float())
                outputs = outputs[:, -pred_len:, f_dim:]
                total_loss.append(criterion(outputs, cut_target(batch_y.float())).item())
        model.train()
        return float(np.average(total_loss))

    best_score, best_state, counter = None, None, 0
    train_loss = vali_loss = test_loss = float("nan")
    epochs_run = 0
    for epoch in range(args["train_epochs"]):
        losses = []
        model.train()
        for batch_x, batch_y, _batch_x_mark, _batch_y_mark in train_loader:
            model_optim.zero_grad()
            outputs = model(batch_x.float())
            outputs = outputs[:, -pred_len:, f_dim:]
            loss = mon.loss_fn(outputs, cut_target(batch_y.float()))
            losses.append(loss.item())
            loss.backward()
            model_optim.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
        epochs_run = epoch + 1
        train_loss = float(np.average(losses))
        vali_loss = vali(vali_loader)
        test_loss = vali(test_loader)
        nx.timed(lambda: mon.log(vali_loss, split="val"))  # noqa: B023
        score = -vali_loss  # EarlyStopping
        if best_score is None or score >= best_score:
            best_score, best_state, counter = score, copy.deepcopy(model.state_dict()), 0
        else:
            counter += 1
            if counter >= args["patience"]:
                break
        lr = args["learning_rate"] * 0.5 ** epoch  # adjust_learning_rate(type1) called with epoch + 1
        for param_group in model_optim.param_groups:
            param_group["lr"] = lr

    nx.finish(mon, model, probe_batch, criterion, optimizer=model_optim, data=splits)
    model.load_state_dict(best_state)

    # test(): the program's own MSE/MAE; forecast_mse and naive_mse are the measure's
    model.eval()
    preds, trues, horizons, naive = [], [], [], []
    with torch.no_grad():
        for batch_x, batch_y, _batch_x_mark, _batch_y_mark in test_loader:
            outputs = model(batch_x.float())[:, -pred_len:, f_dim:]
            preds.append(outputs.numpy())
            trues.append(cut_target(batch_y.float()).numpy())
            horizons.append(batch_y[:, -pred_len:, f_dim:].numpy())
            naive.append(np.repeat(batch_x[:, -1:, f_dim:].numpy(), pred_len, axis=1))
    preds, trues, horizons, naive = (np.concatenate(a) for a in (preds, trues, horizons, naive))
    mse, mae = float(np.mean((preds - trues) ** 2)), float(np.mean(np.abs(preds - trues)))
    forecast_mse = float(np.mean((preds - horizons) ** 2))
    naive_mse = float(np.mean((naive - horizons) ** 2))
    return {"test_mse": mse, "test_mae": mae, "forecast_mse": forecast_mse, "naive_mse": naive_mse,
            "forecast_vs_naive": forecast_mse / naive_mse, "train_loss": train_loss, "vali_loss": vali_loss,
            "test_loss": test_loss, "epochs": float(epochs_run)}  # fmt: skip
