"""Port of thuml/iTransformer: the inverted Transformer for multivariate forecasting. Each
variate's whole look-back window is one token (``DataEmbedding_inverted``: a Linear from
``seq_len`` to ``d_model``), the time features are extra tokens, a post-norm Transformer
encoder attends across variates, a Linear projects each token to ``pred_len`` future values,
and the instance normalisation of ``forecast`` (the Non-stationary Transformer's) subtracts
each window's mean and divides by its standard deviation before, and undoes it after.

Source: github.com/thuml/iTransformer, ``model/iTransformer.py``, ``layers/Embed.py``
(``DataEmbedding_inverted``), ``layers/SelfAttention_Family.py`` (``FullAttention``,
``AttentionLayer``), ``layers/Transformer_EncDec.py`` (``Encoder``, ``EncoderLayer``),
``experiments/exp_long_term_forecasting.py`` (``Exp_Long_Term_Forecast.train``/``vali``/
``test``), ``utils/tools.py`` (``adjust_learning_rate``, ``EarlyStopping``),
``data_provider/data_loader.py`` (``Dataset_Custom``), ``data_provider/data_factory.py``
and ``run.py`` at commit c2426e68ca13f74aaec08045c5c724d8ad328124 (MIT, Copyright (c) 2022
THUML @ Tsinghua University). Written anew from the facts of those files; no code copied.

Kept: the model as published (``use_norm``: means over time, detached; ``x_enc - means``;
``stdev = sqrt(var(unbiased=False) + 1e-5)``; the in-place ``x_enc /= stdev``; the inverted
embedding with the time marks concatenated as tokens; ``FullAttention(mask_flag=False)`` with
its einsums and ``1/sqrt(E)`` scale and attention dropout; ``AttentionLayer`` projections and
``view`` into heads; ``EncoderLayer`` post-norm with the two ``Conv1d(kernel_size=1)`` as the
FFN, GELU (``run.py``'s default activation), dropout 0.1; the final ``LayerNorm``; the
projector ``Linear(d_model, pred_len)``, the ``permute`` and ``[:, :, :N]`` that drop the
covariate tokens; de-normalisation by the first step's stdev and mean, ``repeat``ed over
``pred_len``); ``features='M'``, ``embed='timeF'`` (time features: hour of day, day of
week, day of month, day of year, each scaled to [-0.5, 0.5], as ``time_features`` at
``freq='h'``); ``Dataset_Custom``'s 70/10/20 split with the val and test windows starting
``seq_len`` before their border, the ``StandardScaler`` fitted on the training rows only,
windows ``seq_x = data[s:s+seq_len]``, ``seq_y = data[s+seq_len-label_len : s+seq_len+pred_len]``;
the train loader shuffled with ``drop_last=True``, the val loader shuffled with drop_last
at the training batch size, the test loader at batch size 1 unshuffled; ``dec_inp`` built
from ``batch_y`` (unused by the inverted model, as in the original); ``Adam(lr)``,
``nn.MSELoss``; per batch ``zero_grad``, forward, slice ``outputs[:, -pred_len:, 0:]`` and
``batch_y[:, -pred_len:, 0:]``, loss, ``backward``, ``step``; per epoch the val and test
losses (``vali``: eval mode, no grad, the mean of the batch losses),
``EarlyStopping(patience)`` keeping the best weights, then ``adjust_learning_rate(optimizer,
epoch + 1, args)`` with ``lradj='type1'`` (the lr halved every epoch); the best weights loaded
after training; ``test``: MSE and MAE over the test windows.
Shrunk: a synthetic hourly series of 7 variates and 2,400 hours (ETTh1's width) instead of the
CSV files: each variate a level, a slow trend with a change of slope, daily and weekly
seasonality with its own phase and amplitude, a lagged copy of another variate and AR(1)
noise; ``seq_len`` 96, ``label_len`` 48, ``pred_len`` 24 (instead of 96); ``d_model`` and
``d_ff`` 32 (instead of 512), 4 heads (instead of 8), ``e_layers`` 2; batch size 32,
``learning_rate`` 5e-4 (the ECL script's), 6 epochs (instead of 10), patience 3; the test
loss each epoch over every 4th test window only (it is printed, never used); CPU; no plots,
no files.

nndx, as the author would add it: the model takes ``(x_enc, x_mark_enc, x_dec,
x_mark_dec)``, so nndx gets the first training batch as ``((batch_x, batch_x_mark, dec_inp,
batch_y_mark), batch_y[:, -pred_len:])`` with the ``MSELoss``; a preflight ``nndx.probe``
with the optimizer and the train/val windows as ``data``; ``nndx.Monitor(model, optimizer,
loss_fn=criterion)`` around the loop, the batch loss computed through ``mon.loss_fn`` and
logged where the program prints it (every batch), the val loss logged once per epoch as
``split="val"``; after training (best weights loaded) ``nndx.probe(..., monitor=mon)`` on the
same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
from math import sqrt

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "itransformer"
SOURCE = Source("thuml/iTransformer", "model/iTransformer.py", "c2426e68ca13f74aaec08045c5c724d8ad328124", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: synthetic 7-variate hourly series, d_model 32, "
                "pred_len 24, 6 epochs)"),
        Variant(
            "embedding_reshape",
            "DataEmbedding_inverted turns [B, L, N] into variate tokens with x.reshape(B, N, L) instead of "
            "x.permute(0, 2, 1): the tensor is re-cut in memory order, so each 'variate token' holds a slice of "
            "time steps of all variates interleaved, and the token the projector reads for variate n is not "
            "variate n's history",
            (C.WRONG_RESHAPE,),
            ("https://github.com/xinzzzhou/ScalableTransformer4HighDimensionMTSF/issues/4",
             "https://github.com/zamanzadeh/CARLA/issues/16",
             "https://github.com/jsbaan/transformer-from-scratch/pull/6",
             "https://github.com/torchgeo/terratorch/pull/133"),
            Measure("test_mse", "test MSE at least 1.15x the healthy run's: 0.425 against 0.133 on seed 0",
                    lambda healthy, buggy: not buggy < 1.15 * healthy),
        ),
        Variant(
            "lr_adjusted_every_batch",
            "adjust_learning_rate(model_optim, i + 1, args) is called inside the batch loop with the batch index "
            "where the epoch belongs: lradj 'type1' halves the lr for every batch instead of every epoch, so "
            "after ~20 steps the lr is ~1e-10 and training stops where it began",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/hazdzz/STGCN/issues/18",
             "https://github.com/ivadomed/ivadomed/pull/55",
             "https://github.com/automl/Auto-PyTorch/pull/210"),
            Measure("test_mse", "test MSE at least 1.3x the healthy run's: 0.826 against 0.133 on seed 0",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

ARGS = {"seq_len": 96, "label_len": 48, "pred_len": 24, "enc_in": 7, "d_model": 32, "n_heads": 4, "e_layers": 2,
        "d_ff": 32, "factor": 1, "dropout": 0.1, "activation": "gelu", "output_attention": False, "use_norm": True,
        "train_epochs": 6, "batch_size": 32, "patience": 3, "learning_rate": 5e-4, "lradj": "type1",
        "features": "M", "embed": "timeF", "freq": "h", "class_strategy": "projection"}  # fmt: skip
N_HOURS = 2400


class dotdict(dict):  # noqa: N801 - utils/tools.py's name
    __getattr__ = dict.get
    __setattr__ = dict.__setitem__
    __delattr__ = dict.__delitem__


# --------------------------------------------------------------------------- layers/Embed.py


class DataEmbedding_inverted(nn.Module):  # noqa: N801
    def __init__(self, c_in, d_model, embed_type="fixed", freq="h", dropout=0.1, reshape_bug=False):
        super().__init__()
        self.value_embedding = nn.Linear(c_in, d_model)
        self.dropout = nn.Dropout(p=dropout)
        self.reshape_bug = reshape_bug

    def forward(self, x, x_mark):
        if self.reshape_bug:
            x = x.reshape(x.shape[0], x.shape[2], x.shape[1])
        else:
            x = x.permute(0, 2, 1)
        # x: [Batch Variate Time]
        if x_mark is None:
            x = self.value_embedding(x)
        else:
            x = self.value_embedding(torch.cat([x, x_mark.permute(0, 2, 1)], 1))
        return self.dropout(x)


# --------------------------------------------------------------------------- layers/SelfAttention_Family.py


class FullAttention(nn.Module):
    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1, output_attention=False):
        super().__init__()
        self.scale = scale
        self.mask_flag = mask_flag
        self.output_attention = output_attention
        self.dropout = nn.Dropout(attention_dropout)

    def forward(self, queries, keys, values, attn_mask, tau=None, delta=None):
        B, L, H, E = queries.shape  # noqa: N806
        _, S, _, D = values.shape  # noqa: N806
        scale = self.scale or 1.0 / sqrt(E)
        scores = torch.einsum("blhe,bshe->bhls", queries, keys)
        if self.mask_flag:  # never taken by iTransformer (mask_flag=False)
            raise NotImplementedError
        A = self.dropout(torch.softmax(scale * scores, dim=-1))  # noqa: N806
        V = torch.einsum("bhls,bshd->blhd", A, values)  # noqa: N806
        if self.output_attention:
            return (V.contiguous(), A)
        return (V.contiguous(), None)


class AttentionLayer(nn.Module):
    def __init__(self, attention, d_model, n_heads, d_keys=None, d_values=None):
        super().__init__()
        d_keys = d_keys or (d_model // n_heads)
        d_values = d_values or (d_model // n_heads)
        self.inner_attention = attention
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, queries, keys, values, attn_mask, tau=None, delta=None):
        B, L, _ = queries.shape  # noqa: N806
        _, S, _ = keys.shape  # noqa: N806
        H = self.n_heads  # noqa: N806
        queries = self.query_projection(queries).view(B, L, H, -1)
        keys = self.key_projection(keys).view(B, S, H, -1)
        values = self.value_projection(values).view(B, S, H, -1)
        out, attn = self.inner_attention(queries, keys, values, attn_mask, tau=tau, delta=delta)
        out = out.view(B, L, -1)
        return self.out_projection(out), attn


# --------------------------------------------------------------------------- layers/Transformer_EncDec.py


class EncoderLayer(nn.Module):
    def __init__(self, attention, d_model, d_ff=None, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.attention = attention
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x, attn_mask=None, tau=None, delta=None):
        new_x, attn = self.attention(x, x, x, attn_mask=attn_mask, tau=tau, delta=delta)
        x = x + self.dropout(new_x)
        y = x = self.norm1(x)
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm2(x + y), attn


class Encoder(nn.Module):
    def __init__(self, attn_layers, conv_layers=None, norm_layer=None):
        super().__init__()
        self.attn_layers = nn.ModuleList(attn_layers)
        self.conv_layers = nn.ModuleList(conv_layers) if conv_layers is not None else None
        self.norm = norm_layer

    def forward(self, x, attn_mask=None, tau=None, delta=None):
        attns = []
        for attn_layer in self.attn_layers:
            x, attn = attn_layer(x, attn_mask=attn_mask, tau=tau, delta=delta)
            attns.append(attn)
        if self.norm is not None:
            x = self.norm(x)
        return x, attns


# --------------------------------------------------------------------------- model/iTransformer.py


class Model(nn.Module):
    def __init__(self, configs, reshape_bug=False):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.output_attention = configs.output_attention
        self.use_norm = configs.use_norm
        self.enc_embedding = DataEmbedding_inverted(configs.seq_len, configs.d_model, configs.embed, configs.freq,
                                                    configs.dropout, reshape_bug=reshape_bug)  # fmt: skip
        self.class_strategy = configs.class_strategy
        self.encoder = Encoder(
            [
                EncoderLayer(
                    AttentionLayer(
                        FullAttention(False, configs.factor, attention_dropout=configs.dropout,
                                      output_attention=configs.output_attention), configs.d_model, configs.n_heads),
                    configs.d_model,
                    configs.d_ff,
                    dropout=configs.dropout,
                    activation=configs.activation,
                )
                for _ in range(configs.e_layers)
            ],
            norm_layer=torch.nn.LayerNorm(configs.d_model),
        )
        self.projector = nn.Linear(configs.d_model, configs.pred_len, bias=True)

    def forecast(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        if self.use_norm:
            means = x_enc.mean(1, keepdim=True).detach()
            x_enc = x_enc - means
            stdev = torch.sqrt(torch.var(x_enc, dim=1, keepdim=True, unbiased=False) + 1e-5)
            x_enc /= stdev
        _, _, N = x_enc.shape  # noqa: N806
        enc_out = self.enc_embedding(x_enc, x_mark_enc)
        enc_out, attns = self.encoder(enc_out, attn_mask=None)
        dec_out = self.projector(enc_out).permute(0, 2, 1)[:, :, :N]
        if self.use_norm:
            dec_out = dec_out * (stdev[:, 0, :].unsqueeze(1).repeat(1, self.pred_len, 1))
            dec_out = dec_out + (means[:, 0, :].unsqueeze(1).repeat(1, self.pred_len, 1))
        return dec_out, attns

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        dec_out, attns = self.forecast(x_enc, x_mark_enc, x_dec, x_mark_dec)
        if self.output_attention:
            return dec_out[:, -self.pred_len :, :], attns
        return dec_out[:, -self.pred_len :, :]


# --------------------------------------------------------------------------- the data (synthetic, Dataset_Custom's shape)


def synthetic_series(n: int, n_vars: int, rng: np.random.Generator) -> np.ndarray:
    """Hourly multivariate series: level, trend with a slope change, daily and weekly seasons,
    a lagged coupling between variates and AR(1) noise."""
    t = np.arange(n, dtype=np.float64)
    data = np.zeros((n, n_vars))
    for v in range(n_vars):
        level = rng.uniform(-5, 5)
        slope = rng.uniform(-2, 2) / n
        knee = rng.uniform(0.3, 0.8) * n
        trend = level + slope * t + rng.uniform(-3, 3) / n * np.maximum(t - knee, 0)
        daily = rng.uniform(0.5, 2.0) * np.sin(2 * np.pi * t / 24 + rng.uniform(0, 2 * np.pi))
        daily2 = rng.uniform(0.1, 0.6) * np.sin(4 * np.pi * t / 24 + rng.uniform(0, 2 * np.pi))
        weekly = rng.uniform(0.3, 1.5) * np.sin(2 * np.pi * t / 168 + rng.uniform(0, 2 * np.pi))
        eps = rng.normal(0, 0.15, n)
        ar = np.zeros(n)
        for i in range(1, n):
            ar[i] = 0.8 * ar[i - 1] + eps[i]
        data[:, v] = trend + daily + daily2 + weekly + ar
    lagged = np.roll(data[:, 0], 6)
    lagged[:6] = data[0, 0]
    data[:, n_vars - 1] += 0.8 * lagged  # the target 'OT' (last column) follows variate 0 six hours late
    return data


def time_features(n: int) -> np.ndarray:
    """timeF at freq 'h': HourOfDay, DayOfWeek, DayOfMonth, DayOfYear in [-0.5, 0.5], from an hourly index
    starting 2016-07-01 00:00 (a Friday; ETT's start)."""
    h = np.arange(n)
    hour = h % 24
    day = h // 24
    dow = (day + 4) % 7
    dom = day % 31
    doy = (day + 182) % 366
    return np.stack([hour / 23.0 - 0.5, dow / 6.0 - 0.5, dom / 30.0 - 0.5, doy / 365.0 - 0.5], 1)


class Dataset_Custom(Dataset):  # noqa: N801
    def __init__(self, raw: np.ndarray, stamp: np.ndarray, flag: str, size: tuple[int, int, int]) -> None:
        self.seq_len, self.label_len, self.pred_len = size
        self.set_type = {"train": 0, "val": 1, "test": 2}[flag]
        num_train = int(len(raw) * 0.7)
        num_test = int(len(raw) * 0.2)
        num_vali = len(raw) - num_train - num_test
        border1s = [0, num_train - self.seq_len, len(raw) - num_test - self.seq_len]
        border2s = [num_train, num_train + num_vali, len(raw)]
        border1, border2 = border1s[self.set_type], border2s[self.set_type]
        train_data = raw[border1s[0] : border2s[0]]
        self.mean, self.std = train_data.mean(0), train_data.std(0)  # StandardScaler fitted on train
        data = (raw - self.mean) / self.std
        self.data_x = data[border1:border2]
        self.data_y = data[border1:border2]
        self.data_stamp = stamp[border1:border2]

    def __getitem__(self, index):
        s_begin = index
        s_end = s_begin + self.seq_len
        r_begin = s_end - self.label_len
        r_end = r_begin + self.label_len + self.pred_len
        return (self.data_x[s_begin:s_end], self.data_y[r_begin:r_end], self.data_stamp[s_begin:s_end],
                self.data_stamp[r_begin:r_end])  # fmt: skip

    def __len__(self):
        return len(self.data_x) - self.seq_len - self.pred_len + 1


# --------------------------------------------------------------------------- utils/tools.py


def adjust_learning_rate(optimizer, epoch, args):
    if args.lradj == "type1":
        lr_adjust = {epoch: args.learning_rate * (0.5 ** ((epoch - 1) // 1))}
    elif args.lradj == "type2":
        lr_adjust = {2: 5e-5, 4: 1e-5, 6: 5e-6, 8: 1e-6, 10: 5e-7, 15: 1e-7, 20: 5e-8}
    if epoch in lr_adjust.keys():
        lr = lr_adjust[epoch]
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr


class EarlyStopping:
    def __init__(self, patience=7, verbose=False, delta=0):
        self.patience = patience
        self.counter = 0
        self.best_score = None
        self.early_stop = False
        self.val_loss_min = np.inf
        self.delta = delta
        self.checkpoint = None

    def __call__(self, val_loss, model):
        score = -val_loss
        if self.best_score is None:
            self.best_score = score
            self.save_checkpoint(val_loss, model)
        elif score < self.best_score + self.delta:
            self.counter += 1
            if self.counter >= self.patience:
                self.early_stop = True
        else:
            self.best_score = score
            self.save_checkpoint(val_loss, model)
            self.counter = 0

    def save_checkpoint(self, val_loss, model):  # torch.save(model.state_dict(), path/checkpoint.pth)
        self.checkpoint = copy.deepcopy(model.state_dict())
        self.val_loss_min = val_loss


# --------------------------------------------------------------------------- experiments/exp_long_term_forecasting.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dotdict(ARGS)
    torch.manual_seed(2021 + seed)  # run.py's fix_seed
    np.random.seed(2021 + seed)
    rng = np.random.default_rng(seed)
    raw = synthetic_series(N_HOURS, args.enc_in, rng)
    stamp = time_features(N_HOURS)
    size = (args.seq_len, args.label_len, args.pred_len)
    sets = {flag: Dataset_Custom(raw, stamp, flag, size) for flag in ("train", "val", "test")}
    loader_gen = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(sets["train"], batch_size=args.batch_size, shuffle=True, drop_last=True,
                              generator=loader_gen)  # fmt: skip
    vali_loader = DataLoader(sets["val"], batch_size=args.batch_size, shuffle=True, drop_last=True,
                             generator=loader_gen)  # fmt: skip
    test_loader = DataLoader(sets["test"], batch_size=1, shuffle=False, drop_last=True)

    model = Model(args, reshape_bug=variant == "embedding_reshape").float()
    model_optim = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    criterion = nn.MSELoss()
    lr_every_batch = variant == "lr_adjusted_every_batch"

    def inputs_of(batch_x, batch_y, batch_x_mark, batch_y_mark):
        batch_x, batch_y = batch_x.float(), batch_y.float()
        batch_x_mark, batch_y_mark = batch_x_mark.float(), batch_y_mark.float()
        dec_inp = torch.zeros_like(batch_y[:, -args.pred_len :, :]).float()
        dec_inp = torch.cat([batch_y[:, : args.label_len, :], dec_inp], dim=1).float()
        return (batch_x, batch_x_mark, dec_inp, batch_y_mark), batch_y[:, -args.pred_len :, 0:]

    def vali(loader, every: int = 1):
        total_loss = []
        model.eval()
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if i % every:
                    continue
                inputs, true = inputs_of(*batch)
                outputs = model(*inputs)
                f_dim = -1 if args.features == "MS" else 0
                pred = outputs[:, -args.pred_len :, f_dim:].detach()
                total_loss.append(criterion(pred, true[:, :, f_dim:]).item())
        model.train()
        return float(np.average(total_loss))

    def stacked(ds):
        x = torch.from_numpy(np.stack([ds[i][0] for i in range(len(ds))])).float()
        y = torch.from_numpy(np.stack([ds[i][1][-args.pred_len :] for i in range(len(ds))])).float()
        return x, y

    with torch.random.fork_rng():
        first = next(iter(DataLoader(sets["train"], batch_size=args.batch_size, shuffle=False)))
    probe_batch = inputs_of(*first)
    splits = (*stacked(sets["train"]), *stacked(sets["val"]))
    nx.preflight(model, probe_batch, criterion, optimizer=model_optim, data=splits)
    mon = nx.monitor(model, model_optim, every=5, loss_fn=criterion)

    early_stopping = EarlyStopping(patience=args.patience, verbose=True)
    train_losses, vali_losses = [], []
    epochs_run = 0
    for epoch in range(args.train_epochs):
        train_loss = []
        model.train()
        for i, batch in enumerate(train_loader):
            model_optim.zero_grad()
            inputs, batch_y = inputs_of(*batch)
            outputs = model(*inputs)
            f_dim = -1 if args.features == "MS" else 0
            outputs = outputs[:, -args.pred_len :, f_dim:]
            batch_y = batch_y[:, -args.pred_len :, f_dim:]
            loss = mon.loss_fn(outputs, batch_y)
            train_loss.append(loss.item())
            loss.backward()
            model_optim.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            if lr_every_batch:
                adjust_learning_rate(model_optim, i + 1, args)
        train_loss = float(np.average(train_loss))
        vali_loss = vali(vali_loader)
        _test_loss = vali(test_loader, every=4)  # printed by the original, never used
        nx.timed(lambda: mon.log(vali_loss, split="val"))  # noqa: B023
        train_losses.append(train_loss)
        vali_losses.append(vali_loss)
        epochs_run += 1
        early_stopping(vali_loss, model)
        if early_stopping.early_stop:
            break
        if not lr_every_batch:
            adjust_learning_rate(model_optim, epoch + 1, args)

    model.load_state_dict(early_stopping.checkpoint)
    nx.finish(mon, model, probe_batch, criterion, optimizer=model_optim, data=splits)

    # test(): every test window at batch size 1
    model.eval()
    preds, trues = [], []
    with torch.no_grad():
        for batch in test_loader:
            inputs, true = inputs_of(*batch)
            preds.append(model(*inputs)[:, -args.pred_len :, 0:].numpy())
            trues.append(true.numpy())
    preds, trues = np.concatenate(preds), np.concatenate(trues)
    # the mean of the last look-back value carried forward, as a reference (measure only)
    naive = np.concatenate([np.repeat(b[0][:, -1:, :].numpy(), args.pred_len, 1) for b in test_loader])
    return {"test_mse": float(np.mean((preds - trues) ** 2)), "test_mae": float(np.mean(np.abs(preds - trues))),
            "best_vali_loss": float(early_stopping.val_loss_min), "final_train_loss": train_losses[-1],
            "first_train_loss": train_losses[0], "epochs": float(epochs_run),
            "naive_test_mse": float(np.mean((naive - trues) ** 2)),
            "final_lr": float(model_optim.param_groups[0]["lr"])}  # fmt: skip
