"""Port of zhouhaoyi/Informer2020 (the Informer long-sequence forecaster: ProbSparse
self-attention, a distilling encoder, a generative decoder fed a start token of known
values followed by zeros for the horizon, MSE on the horizon, Adam with the LR halved
after every epoch).

Source: github.com/zhouhaoyi/Informer2020, ``models/model.py``, ``models/attn.py``,
``models/encoder.py``, ``models/decoder.py``, ``models/embed.py``, ``utils/masking.py``,
``utils/tools.py``, ``utils/timefeatures.py``, ``data/data_loader.py`` and
``exp/exp_informer.py`` at commit 29f2a739226a509202a092b464163da81fa74960 (Apache-2.0,
Copyright (c) 2020 Haoyi Zhou et al.). Written anew from the facts of those files; no
code copied.

Kept: ``Informer`` with ``DataEmbedding`` (``TokenEmbedding``: a circular-padded
kernel-3 ``Conv1d`` with Kaiming-normal init; the sinusoidal ``PositionalEmbedding``; the
``timeF`` ``TimeFeatureEmbedding``, a ``Linear`` over the four hourly time features
HourOfDay/DayOfWeek/DayOfMonth/DayOfYear scaled to [-0.5, 0.5]; dropout), the encoder of
``EncoderLayer`` s (``AttentionLayer`` over ``ProbAttention`` without a mask: sampled
query sparsity ``max - mean``, the top ``factor * ceil(ln L)`` queries attended, the
others given the mean of V; residual, ``LayerNorm``, a kernel-1 ``Conv1d`` feed-forward
with GELU, ``LayerNorm``) with a ``ConvLayer`` between them (``distil``: circular conv,
``BatchNorm1d``, ELU, ``MaxPool1d(3, 2, 1)``) and a final ``LayerNorm``; the decoder of
``DecoderLayer`` s (masked ``ProbAttention`` self-attention with ``ProbMask`` and the
cumulative-sum initial context, ``mix=True``'s transpose of the heads, then
``FullAttention`` cross-attention over the encoder output, the same feed-forward, three
``LayerNorm`` s) and a final ``LayerNorm``; ``projection`` to ``c_out``, the last
``pred_len`` steps returned. ``Dataset_ETT_hour``'s borders (train, then val and test
each starting ``seq_len`` before their own span), the ``StandardScaler`` fitted on the
train span only and applied to all of it, ``__getitem__`` (``seq_x`` = ``seq_len``
values, ``seq_y`` = the last ``label_len`` of them followed by ``pred_len`` future
values, and their time marks); ``_get_data`` (train shuffled with ``drop_last``, val and
test unshuffled with ``drop_last``); ``_process_one_batch`` (``dec_inp`` = the first
``label_len`` steps of ``batch_y`` concatenated with zeros for ``pred_len``, ``padding``
0; the target the last ``pred_len`` steps, ``f_dim`` 0 for ``features='M'``);
``nn.MSELoss``; ``Adam``; the epoch loop (``zero_grad``, forward, loss, backward, step;
``vali`` on val and test with ``model.eval()`` then ``model.train()``; ``EarlyStopping``
with patience 3 keeping the best val checkpoint (in memory, not ``torch.save``);
``adjust_learning_rate`` type1, ``lr * 0.5 ** (epoch - 1)`` after each epoch); the best
checkpoint reloaded, then ``test``'s MSE/MAE over the test loader.
Shrunk: a synthetic 7-variable hourly series (the ETTh1 stand-in: 7 columns, each a
level between 20 and 400, a daily and a weekly cycle, a slow trend, AR(1) noise, the
last column a mix of the others; no download) of 1,800 hours split 60/20/20 instead of
ETTh1's 12/4/4 months; ``seq_len`` 48, ``label_len`` 24, ``pred_len`` 12 instead of
96/48/24; ``d_model`` 32, ``n_heads`` 4, ``d_ff`` 64 instead of 512/8/2048;
``e_layers`` 2 and ``d_layers`` 1 (the defaults); ``train_epochs`` 5 instead of 6 and
``learning_rate`` 1e-3 instead of 1e-4 (about 40 steps an epoch instead of 250); one
run instead of ``itr`` 2; no result files.
Measure only (not in the program): ``forecast_mse``, the test MSE (in train-standardised
units) of the forecast made the way ``predict`` makes it, with nothing of the horizon
known to the decoder (zeros, as ``Dataset_Pred`` gives), and the same for the naive
forecast (the last known value repeated), as ``forecast_vs_naive``.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
as ``_process_one_batch`` builds it (inputs ``(batch_x, batch_x_mark, dec_inp,
batch_y_mark)``, target the horizon) with ``criterion`` and the optimizer, and the
encoder windows and horizons of the train and val splits as ``data``;
``nndx.Monitor(model, model_optim)`` around the epochs, each batch's loss logged and each
epoch's ``vali_loss`` logged as ``split="val"``; then ``nndx.probe(...,
monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "informer"
SOURCE = Source("zhouhaoyi/Informer2020", "exp/exp_informer.py", "29f2a739226a509202a092b464163da81fa74960",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (features M, timeF embedding, ProbSparse attention)"),
        Variant(
            "decoder_sees_horizon",
            "dec_inp built from the whole batch_y (the zero padding of the pred_len horizon left out): the "
            "decoder is handed the values it is asked to forecast, in training, vali and test alike",
            (C.DATA_LEAKAGE,),
            ("https://github.com/zhouhaoyi/Informer2020/issues/223",
             "https://github.com/zhouhaoyi/Informer2020/issues/431",
             "https://github.com/thuml/Autoformer/issues/177",
             "https://github.com/sktime/pytorch-forecasting/issues/182"),
            Measure("forecast_mse", "test MSE of the forecast with the horizon unknown (as predict() makes it) "
                    "1.5x the healthy run's or more (the program's own test MSE looks better instead)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "no_scaling",
            "the StandardScaler left out (scale=False): the model reads and is scored on the raw series, "
            "levels of 20 to 400 with swings of a few units to tens",
            (C.UNNORMALIZED_TARGETS, C.UNNORMALIZED_INPUTS),
            ("https://github.com/zhouhaoyi/Informer2020/issues/584",
             "https://github.com/maxjcohen/transformer/issues/45",
             "https://github.com/sktime/pytorch-forecasting/issues/1",
             "https://github.com/QData/spacetimeformer/issues/28"),
            Measure("forecast_mse", "test MSE of the forecast, measured in train-standardised units for every "
                    "variant, 1.5x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

ARGS = {
    "seq_len": 48, "label_len": 24, "pred_len": 12, "enc_in": 7, "dec_in": 7, "c_out": 7, "factor": 5,
    "d_model": 32, "n_heads": 4, "e_layers": 2, "d_layers": 1, "d_ff": 64, "dropout": 0.05, "activation": "gelu",
    "distil": True, "mix": True, "train_epochs": 5, "batch_size": 32, "patience": 3, "learning_rate": 1e-3,
    "padding": 0,
}  # fmt: skip
HOURS = 1800


# --------------------------------------------------------------------------- utils/masking.py


def triangular_causal_mask(B: int, L: int) -> torch.Tensor:
    return torch.triu(torch.ones(B, 1, L, L, dtype=torch.bool), diagonal=1)


def prob_mask(B: int, H: int, L: int, index: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    upper = torch.ones(L, scores.shape[-1], dtype=torch.bool).triu(1)
    expanded = upper[None, None, :].expand(B, H, L, scores.shape[-1])
    picked = expanded[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :]
    return picked.view(scores.shape)


# --------------------------------------------------------------------------- models/attn.py


class FullAttention(nn.Module):
    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1) -> None:
        super().__init__()
        self.scale, self.mask_flag = scale, mask_flag
        self.dropout = nn.Dropout(attention_dropout)

    def forward(self, queries, keys, values, attn_mask):
        B, L, H, E = queries.shape
        scale = self.scale or 1.0 / math.sqrt(E)
        scores = torch.einsum("blhe,bshe->bhls", queries, keys)
        if self.mask_flag:
            mask = attn_mask if attn_mask is not None else triangular_causal_mask(B, L)
            scores = scores.masked_fill(mask, -np.inf)
        A = self.dropout(torch.softmax(scale * scores, dim=-1))
        return torch.einsum("bhls,bshd->blhd", A, values).contiguous(), None


class ProbAttention(nn.Module):
    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1) -> None:
        super().__init__()
        self.factor, self.scale, self.mask_flag = factor, scale, mask_flag
        self.dropout = nn.Dropout(attention_dropout)

    def _prob_QK(self, Q, K, sample_k: int, n_top: int):
        B, H, L_K, E = K.shape
        L_Q = Q.shape[2]
        K_expand = K.unsqueeze(-3).expand(B, H, L_Q, L_K, E)
        index_sample = torch.randint(L_K, (L_Q, sample_k))
        K_sample = K_expand[:, :, torch.arange(L_Q).unsqueeze(1), index_sample, :]
        Q_K_sample = torch.matmul(Q.unsqueeze(-2), K_sample.transpose(-2, -1)).squeeze(-2)
        M = Q_K_sample.max(-1)[0] - Q_K_sample.sum(-1) / L_K  # the sparsity measurement
        M_top = M.topk(n_top, sorted=False)[1]
        Q_reduce = Q[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], M_top, :]
        return torch.matmul(Q_reduce, K.transpose(-2, -1)), M_top

    def _get_initial_context(self, V, L_Q: int):
        B, H, L_V, D = V.shape
        if not self.mask_flag:
            return V.mean(dim=-2).unsqueeze(-2).expand(B, H, L_Q, D).clone()
        assert L_Q == L_V
        return V.cumsum(dim=-2)

    def _update_context(self, context, V, scores, index, L_Q: int):
        B, H, L_V, D = V.shape
        if self.mask_flag:
            scores = scores.masked_fill(prob_mask(B, H, L_Q, index, scores), -np.inf)
        attn = torch.softmax(scores, dim=-1)
        context[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :] = \
            torch.matmul(attn, V).type_as(context)  # fmt: skip
        return context

    def forward(self, queries, keys, values, attn_mask):
        B, L_Q, H, D = queries.shape
        L_K = keys.shape[1]
        queries, keys, values = queries.transpose(2, 1), keys.transpose(2, 1), values.transpose(2, 1)
        U_part = min(self.factor * int(np.ceil(np.log(L_K))), L_K)
        u = min(self.factor * int(np.ceil(np.log(L_Q))), L_Q)
        scores_top, index = self._prob_QK(queries, keys, sample_k=U_part, n_top=u)
        scores_top = scores_top * (self.scale or 1.0 / math.sqrt(D))
        context = self._get_initial_context(values, L_Q)
        context = self._update_context(context, values, scores_top, index, L_Q)
        return context.transpose(2, 1).contiguous(), None


class AttentionLayer(nn.Module):
    def __init__(self, attention, d_model: int, n_heads: int, mix: bool = False) -> None:
        super().__init__()
        d_keys = d_values = d_model // n_heads
        self.inner_attention = attention
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads, self.mix = n_heads, mix

    def forward(self, queries, keys, values, attn_mask):
        B, L, _ = queries.shape
        S, H = keys.shape[1], self.n_heads
        out, attn = self.inner_attention(self.query_projection(queries).view(B, L, H, -1),
                                         self.key_projection(keys).view(B, S, H, -1),
                                         self.value_projection(values).view(B, S, H, -1), attn_mask)  # fmt: skip
        if self.mix:
            out = out.transpose(2, 1).contiguous()
        return self.out_projection(out.view(B, L, -1)), attn


# --------------------------------------------------------------------------- models/encoder.py, decoder.py


class ConvLayer(nn.Module):
    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.downConv = nn.Conv1d(c_in, c_in, kernel_size=3, padding=1, padding_mode="circular")
        self.norm = nn.BatchNorm1d(c_in)
        self.activation = nn.ELU()
        self.maxPool = nn.MaxPool1d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        x = self.maxPool(self.activation(self.norm(self.downConv(x.permute(0, 2, 1)))))
        return x.transpose(1, 2)


class EncoderLayer(nn.Module):
    def __init__(self, attention, d_model: int, d_ff: int, dropout: float, activation: str) -> None:
        super().__init__()
        self.attention = attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x, attn_mask=None):
        new_x, attn = self.attention(x, x, x, attn_mask=attn_mask)
        y = x = self.norm1(x + self.dropout(new_x))
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm2(x + y), attn


class Encoder(nn.Module):
    def __init__(self, attn_layers, conv_layers=None, norm_layer=None) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(attn_layers)
        self.conv_layers = nn.ModuleList(conv_layers) if conv_layers is not None else None
        self.norm = norm_layer

    def forward(self, x, attn_mask=None):
        if self.conv_layers is not None:
            for attn_layer, conv_layer in zip(self.attn_layers, self.conv_layers):
                x, _ = attn_layer(x, attn_mask=attn_mask)
                x = conv_layer(x)
            x, _ = self.attn_layers[-1](x, attn_mask=attn_mask)
        else:
            for attn_layer in self.attn_layers:
                x, _ = attn_layer(x, attn_mask=attn_mask)
        return self.norm(x) if self.norm is not None else x


class DecoderLayer(nn.Module):
    def __init__(self, self_attention, cross_attention, d_model: int, d_ff: int, dropout: float,
                 activation: str) -> None:  # fmt: skip
        super().__init__()
        self.self_attention, self.cross_attention = self_attention, cross_attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x, cross, x_mask=None, cross_mask=None):
        x = self.norm1(x + self.dropout(self.self_attention(x, x, x, attn_mask=x_mask)[0]))
        x = x + self.dropout(self.cross_attention(x, cross, cross, attn_mask=cross_mask)[0])
        y = x = self.norm2(x)
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm3(x + y)


class Decoder(nn.Module):
    def __init__(self, layers, norm_layer=None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer

    def forward(self, x, cross, x_mask=None, cross_mask=None):
        for layer in self.layers:
            x = layer(x, cross, x_mask=x_mask, cross_mask=cross_mask)
        return self.norm(x) if self.norm is not None else x


# --------------------------------------------------------------------------- models/embed.py


class PositionalEmbedding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 5000) -> None:
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).float().unsqueeze(1)
        div_term = (torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model)).exp()
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.pe[:, : x.size(1)]


class TokenEmbedding(nn.Module):
    def __init__(self, c_in: int, d_model: int) -> None:
        super().__init__()
        self.tokenConv = nn.Conv1d(c_in, d_model, kernel_size=3, padding=1, padding_mode="circular")
        nn.init.kaiming_normal_(self.tokenConv.weight, mode="fan_in", nonlinearity="leaky_relu")

    def forward(self, x):
        return self.tokenConv(x.permute(0, 2, 1)).transpose(1, 2)


class TimeFeatureEmbedding(nn.Module):
    def __init__(self, d_model: int, d_inp: int = 4) -> None:  # freq 'h': 4 time features
        super().__init__()
        self.embed = nn.Linear(d_inp, d_model)

    def forward(self, x):
        return self.embed(x)


class DataEmbedding(nn.Module):
    def __init__(self, c_in: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.value_embedding = TokenEmbedding(c_in, d_model)
        self.position_embedding = PositionalEmbedding(d_model)
        self.temporal_embedding = TimeFeatureEmbedding(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, x_mark):
        return self.dropout(self.value_embedding(x) + self.position_embedding(x) + self.temporal_embedding(x_mark))


# --------------------------------------------------------------------------- models/model.py


class Informer(nn.Module):
    def __init__(self, enc_in, dec_in, c_out, out_len, factor, d_model, n_heads, e_layers, d_layers, d_ff, dropout,
                 activation, distil=True, mix=True) -> None:  # fmt: skip
        super().__init__()
        self.pred_len = out_len
        self.enc_embedding = DataEmbedding(enc_in, d_model, dropout)
        self.dec_embedding = DataEmbedding(dec_in, d_model, dropout)
        self.encoder = Encoder(
            [EncoderLayer(AttentionLayer(ProbAttention(False, factor, attention_dropout=dropout), d_model, n_heads),
                          d_model, d_ff, dropout, activation) for _ in range(e_layers)],
            [ConvLayer(d_model) for _ in range(e_layers - 1)] if distil else None,
            norm_layer=nn.LayerNorm(d_model),
        )  # fmt: skip
        self.decoder = Decoder(
            [DecoderLayer(AttentionLayer(ProbAttention(True, factor, attention_dropout=dropout), d_model, n_heads,
                                         mix=mix),
                          AttentionLayer(FullAttention(False, factor, attention_dropout=dropout), d_model, n_heads),
                          d_model, d_ff, dropout, activation) for _ in range(d_layers)],
            norm_layer=nn.LayerNorm(d_model),
        )  # fmt: skip
        self.projection = nn.Linear(d_model, c_out)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        enc_out = self.encoder(self.enc_embedding(x_enc, x_mark_enc))
        dec_out = self.decoder(self.dec_embedding(x_dec, x_mark_dec), enc_out)
        return self.projection(dec_out)[:, -self.pred_len :, :]


# --------------------------------------------------------------------------- data (ETTh1 stand-in)


def make_series(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(values [HOURS, 7], time marks [HOURS, 4]): hourly, from a Monday 00:00, 1 January."""
    rng = np.random.default_rng(seed)
    t = np.arange(HOURS, dtype=np.float64)
    cols = []
    for _ in range(6):
        level = np.exp(rng.uniform(np.log(20.0), np.log(400.0)))
        daily = level * rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * t / 24 + rng.uniform(0, 2 * np.pi))
        weekly = level * rng.uniform(0.02, 0.1) * np.sin(2 * np.pi * t / 168 + rng.uniform(0, 2 * np.pi))
        trend = level * rng.uniform(-0.1, 0.1) * t / HOURS
        noise = np.zeros(HOURS)
        eps = rng.normal(0, level * 0.02, HOURS)
        for i in range(1, HOURS):
            noise[i] = 0.8 * noise[i - 1] + eps[i]
        cols.append(level + daily + weekly + trend + noise)
    mix = rng.dirichlet(np.ones(6))
    cols.append(sum(w * c for w, c in zip(mix, cols)) + rng.normal(0, 1.0, HOURS))  # 'OT'
    hour, day = t % 24, t // 24
    marks = np.stack([hour / 23.0 - 0.5, (day % 7) / 6.0 - 0.5, (day % 31) / 30.0 - 0.5, (day % 366) / 365.0 - 0.5],
                     axis=1)  # fmt: skip
    return np.stack(cols, axis=1), marks


class StandardScaler:
    def __init__(self) -> None:
        self.mean, self.std = 0.0, 1.0

    def fit(self, data: np.ndarray) -> None:
        self.mean, self.std = data.mean(0), data.std(0)

    def transform(self, data: np.ndarray) -> np.ndarray:
        return (data - self.mean) / self.std


class Dataset_ETT_hour(Dataset):
    def __init__(self, values: np.ndarray, marks: np.ndarray, flag: str, size: tuple[int, int, int],
                 scale: bool = True) -> None:  # fmt: skip
        self.seq_len, self.label_len, self.pred_len = size
        n_train, n_val = int(HOURS * 0.6), int(HOURS * 0.2)
        border1s = [0, n_train - self.seq_len, n_train + n_val - self.seq_len]
        border2s = [n_train, n_train + n_val, HOURS]
        k = {"train": 0, "val": 1, "test": 2}[flag]
        self.scaler = StandardScaler()
        self.scaler.fit(values[border1s[0] : border2s[0]])  # the train statistics, as a reference for every run
        data = self.scaler.transform(values) if scale else values
        self.data_x = data[border1s[k] : border2s[k]].astype(np.float32)
        self.data_y = self.data_x
        self.data_stamp = marks[border1s[k] : border2s[k]].astype(np.float32)

    def __getitem__(self, index: int):
        s_end = index + self.seq_len
        r_begin = s_end - self.label_len
        r_end = r_begin + self.label_len + self.pred_len
        return (self.data_x[index:s_end], self.data_y[r_begin:r_end], self.data_stamp[index:s_end],
                self.data_stamp[r_begin:r_end])  # fmt: skip

    def __len__(self) -> int:
        return len(self.data_x) - self.seq_len - self.pred_len + 1


# --------------------------------------------------------------------------- exp/exp_informer.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    np.random.seed(seed)
    scale = variant != "no_scaling"
    values, marks = make_series(seed)
    size = (args["seq_len"], args["label_len"], args["pred_len"])
    sets = {flag: Dataset_ETT_hour(values, marks, flag, size, scale=scale) for flag in ("train", "val", "test")}
    loaders = {
        "train": DataLoader(sets["train"], batch_size=args["batch_size"], shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(seed)),
        "val": DataLoader(sets["val"], batch_size=args["batch_size"], shuffle=False, drop_last=True),
        "test": DataLoader(sets["test"], batch_size=args["batch_size"], shuffle=False, drop_last=True),
    }  # fmt: skip

    model = Informer(args["enc_in"], args["dec_in"], args["c_out"], args["pred_len"], args["factor"], args["d_model"],
                     args["n_heads"], args["e_layers"], args["d_layers"], args["d_ff"], args["dropout"],
                     args["activation"], args["distil"], args["mix"]).float()  # fmt: skip
    model_optim = torch.optim.Adam(model.parameters(), lr=args["learning_rate"])
    criterion = nn.MSELoss()

    def decoder_input(batch_y: torch.Tensor, known_horizon: bool) -> torch.Tensor:
        if known_horizon:  # the bug: the horizon's true values handed to the decoder
            return batch_y.float()
        dec_inp = torch.zeros(batch_y.shape[0], args["pred_len"], batch_y.shape[-1])
        return torch.cat([batch_y[:, : args["label_len"], :], dec_inp], dim=1).float()

    def process_one_batch(batch_x, batch_y, batch_x_mark, batch_y_mark, honest: bool = False):
        dec_inp = decoder_input(batch_y, known_horizon=variant == "decoder_sees_horizon" and not honest)
        outputs = model(batch_x.float(), batch_x_mark.float(), dec_inp, batch_y_mark.float())
        return outputs, batch_y[:, -args["pred_len"] :, 0:].float()

    def inputs_of(batch_x, batch_y, batch_x_mark, batch_y_mark):
        dec_inp = decoder_input(batch_y, known_horizon=variant == "decoder_sees_horizon")
        return (batch_x.float(), batch_x_mark.float(), dec_inp, batch_y_mark.float()), \
            batch_y[:, -args["pred_len"] :, :].float()  # fmt: skip

    def stacked(ds: Dataset_ETT_hour) -> tuple[torch.Tensor, torch.Tensor]:
        items = [ds[i] for i in range(len(ds))]
        x = torch.from_numpy(np.stack([it[0] for it in items]))
        y = torch.from_numpy(np.stack([it[1][-args["pred_len"] :] for it in items]))
        return x, y

    first = next(iter(DataLoader(sets["train"], batch_size=args["batch_size"], shuffle=False)))
    probe_batch = inputs_of(*first)
    splits = (*stacked(sets["train"]), *stacked(sets["val"]))
    nx.preflight(model, probe_batch, criterion, optimizer=model_optim, data=splits)
    mon = nx.monitor(model, model_optim, every=5, loss_fn=criterion)

    def vali(loader) -> float:
        model.eval()
        total = []
        with torch.no_grad():
            for batch in loader:
                pred, true = process_one_batch(*batch)
                total.append(criterion(pred, true).item())
        model.train()
        return float(np.average(total))

    best_score, best_state, counter = None, None, 0
    train_loss = vali_loss = test_loss = float("nan")
    for epoch in range(args["train_epochs"]):
        model.train()
        losses = []
        for batch in loaders["train"]:
            model_optim.zero_grad()
            pred, true = process_one_batch(*batch)
            loss = criterion(pred, true)
            losses.append(loss.item())
            loss.backward()
            model_optim.step()
            nx.timed(lambda: mon.log(loss))
        train_loss = float(np.average(losses))
        vali_loss = vali(loaders["val"])
        test_loss = vali(loaders["test"])
        nx.timed(lambda: mon.log(vali_loss, split="val"))
        if best_score is None or -vali_loss >= best_score:  # EarlyStopping
            best_score, best_state, counter = -vali_loss, copy.deepcopy(model.state_dict()), 0
        else:
            counter += 1
            if counter >= args["patience"]:
                break
        lr = args["learning_rate"] * 0.5 ** epoch  # adjust_learning_rate(type1) with epoch + 1
        for group in model_optim.param_groups:
            group["lr"] = lr

    nx.finish(mon, model, probe_batch, criterion, optimizer=model_optim, data=splits)
    model.load_state_dict(best_state)

    # test(): the program's own MSE/MAE on the test loader
    model.eval()
    preds, trues, honest, naive = [], [], [], []
    ref = sets["train"].scaler
    with torch.no_grad():
        for batch in loaders["test"]:
            pred, true = process_one_batch(*batch)
            preds.append(pred.numpy())
            trues.append(true.numpy())
            fc, _ = process_one_batch(*batch, honest=True)  # measure only: the horizon unknown
            honest.append(fc.numpy())
            naive.append(np.repeat(batch[0][:, -1:, :].numpy(), args["pred_len"], axis=1))
    preds, trues, honest, naive = (np.concatenate(a) for a in (preds, trues, honest, naive))
    mse, mae = float(np.mean((preds - trues) ** 2)), float(np.mean(np.abs(preds - trues)))

    def std_units(a: np.ndarray) -> np.ndarray:  # every variant scored in train-standardised units
        return a if scale else (a - ref.mean) / ref.std

    forecast_mse = float(np.mean((std_units(honest) - std_units(trues)) ** 2))
    naive_mse = float(np.mean((std_units(naive) - std_units(trues)) ** 2))
    return {"test_mse": mse, "test_mae": mae, "forecast_mse": forecast_mse, "naive_mse": naive_mse,
            "forecast_vs_naive": forecast_mse / naive_mse, "train_loss": train_loss, "vali_loss": vali_loss,
            "test_loss": test_loss}  # fmt: skip
