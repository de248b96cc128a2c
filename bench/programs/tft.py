"""Port of jdb78/pytorch-forecasting's Temporal Fusion Transformer (variable selection
networks of gated residual networks, static covariate encoders, an LSTM encoder-decoder,
interpretable multi-head attention, quantile loss over seven quantiles).

Source: github.com/jdb78/pytorch-forecasting, ``pytorch_forecasting/models/
temporal_fusion_transformer/__init__.py`` and ``sub_modules.py``, ``metrics/quantile.py``
and the stallion tutorial's settings at commit 63fadd1a51963f8b1d0853c6d095a0256e3cb9c4
(MIT, Copyright (c) 2020 Jan Beitner). Written anew from the facts of those files; no
code copied.

Kept: ``GatedLinearUnit`` (dropout, ``Linear(in, 2 * hidden)``, ``F.glu``, xavier/zero
init), ``TimeDistributedInterpolation`` (linear ``F.interpolate`` resampling),
``ResampleNorm`` (resample, trainable ``sigmoid(mask) * 2`` gate, ``LayerNorm``), ``AddNorm``,
``GateAddNorm``, ``GatedResidualNetwork`` (``fc1``, a bias-free context projection, ``ELU``,
``fc2``, ``GateAddNorm`` over the resampled residual; kaiming init of fc1/fc2),
``VariableSelectionNetwork`` (shared prescalers ``Linear(1, hidden_continuous_size)`` for
reals, ``ResampleNorm`` for embedded categoricals, a flattened GRN with context giving the
softmax weights), ``ScaledDotProductAttention`` and ``InterpretableMultiHeadAttention``
(per-head q/k layers, one shared v layer, heads averaged, ``w_h``), the causal attention
mask (each decoder step attends to the encoder and to earlier decoder steps only); the
network: embeddings of the categoricals (sizes by the library's ``1.6 * n ** 0.56`` rule),
static variable selection, the four static context GRNs (variable selection, LSTM hidden,
LSTM cell, enrichment), encoder/decoder variable selection with the static context,
``LSTM`` encoder and decoder (batch-first, initial state from the static encoders), the
shared post-LSTM ``GatedLinearUnit`` + ``AddNorm`` skip, static enrichment GRN, attention
with queries from the decoder steps only, ``post_attn_gate_norm``, ``pos_wise_ff`` GRN,
``pre_output_gate_norm`` over the LSTM output, ``Linear(hidden, 7)``; the target scaled per
series (``GroupNormalizer``, method "standard": each series' mean and standard deviation
on the training span), the scaled target an encoder input, the network's output mapped
back with ``target_scale`` (``transform_output``) and the ``QuantileLoss`` (quantiles
0.02 ... 0.98, ``2 * max((q - 1) * e, q * e)``, mean) scored against the target in its own
units, as the library does; ``relative_time_idx`` as a known real; Adam at the tutorial's
``learning_rate`` 0.03, ``gradient_clip_val`` 0.1 (norm clipping as Lightning does),
``hidden_size`` 16, ``attention_head_size`` 2, ``dropout`` 0.1, ``hidden_continuous_size``
8, ``lstm_layers`` 1; validation loss each epoch in eval mode.
Shrunk: 24 synthetic daily series (4 categories; a level of the category times one of
the series, a weekly profile of the category, a trend and 5% noise) instead of the
stallion sales data; encoder 21 days, prediction 7 days; 98 training days, then 4 test
weeks; batch 64, 8 epochs of 20 batches; no Lightning (its loop written out: zero_grad,
forward, loss, backward, clip, step), no reduce-on-plateau (patience larger than the run),
no tensorboard or interpretation plots. ``forward`` takes the dict's tensors as arguments
(``x_cat``, ``x_cont``, ``target_scale``) and returns the prediction alone.
Measure only (not in the program): on the held-out weeks the P50 forecast's normalised
MAE (sum |y - p50| / sum |y|, original units) and the mean quantile loss.

nndx, as the author would add it: a preflight ``nndx.probe(model, batch, quantile_loss,
optimizer=...)`` on the first training batch ``((x_cat, x_cont, target_scale), y)``;
``nndx.Monitor(model, optimizer)`` around the epochs, every batch's loss logged and each
epoch's validation loss logged as ``split="val"``; after training ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "tft"
SOURCE = Source("jdb78/pytorch-forecasting", "pytorch_forecasting/models/temporal_fusion_transformer/__init__.py",
                "63fadd1a51963f8b1d0853c6d095a0256e3cb9c4", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 24 series, 21+7 days, 160 steps)"),
        Variant(
            "no_target_normalizer",
            "the per-series target normalizer left out (center 0, scale 1): the scaled-target encoder input and "
            "the network's output are in each series' own units, levels from ~10 to ~1,000",
            (C.UNNORMALIZED_TARGETS, C.UNNORMALIZED_INPUTS),
            ("https://github.com/sktime/pytorch-forecasting/issues/1",
             "https://github.com/sktime/pytorch-forecasting/issues/1332",
             "https://github.com/sktime/pytorch-forecasting/issues/410"),
            Measure("test_nmae", "held-out P50 normalised MAE at least 1.5x the healthy run's (0.58 against 0.12 "
                    "on seed 0)", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "quantile_target_broadcast",
            "the target batched with a channel axis, (batch, 1, horizon), into the quantile loss: "
            "target - y_pred[..., i] broadcasts to (batch, batch, horizon), every window's forecast is fit to the targets of the whole batch",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/ml-stat-Sustech/TorchCP/issues/27",
             "https://github.com/ourownstory/neural_prophet/issues/735",
             "https://github.com/BY571/QR-DQN/issues/1"),
            Measure("test_nmae", "held-out P50 normalised MAE at least 1.5x the healthy run's (0.83 against 0.12 "
                    "on seed 0)", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

QUANTILES = [0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98]
HIDDEN, HEADS, DROPOUT, HIDDEN_CONT, LSTM_LAYERS = 16, 2, 0.1, 8, 1
LR, CLIP, BATCH, EPOCHS, BATCHES_PER_EPOCH = 0.03, 0.1, 64, 8, 20
ENC, DEC = 21, 7
N_SERIES, N_CAT, TRAIN_DAYS, TEST_WEEKS = 24, 4, 98, 4


def embedding_size(n: int) -> int:
    return min(round(1.6 * n**0.56), 100) if n > 2 else 1


# --------------------------------------------------------------------------- data


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[series, days] of positive daily values; each series' category; day of week."""
    rng = np.random.default_rng(seed + 7)
    days = TRAIN_DAYS + 7 * TEST_WEEKS
    category = np.arange(N_SERIES) % N_CAT
    cat_level = np.array([10.0, 50.0, 200.0, 800.0])
    profile = 1 + 0.5 * rng.uniform(-1, 1, (N_CAT, 7))
    level = cat_level[category] * rng.uniform(0.7, 1.4, N_SERIES)
    t = np.arange(days)
    dow = (t + rng.integers(0, 7)) % 7
    trend = 1 + rng.uniform(-0.2, 0.4, N_SERIES)[:, None] * t[None] / days
    noise = 1 + rng.normal(0, 0.05, (N_SERIES, days))
    values = level[:, None] * profile[category][:, dow] * trend * noise
    return values.astype(np.float32), category, dow


def windows(values, category, dow, starts, center, scale, channel_axis=False):
    """pytorch-forecasting's x dict for windows starting at ``starts`` (series, day):
    x_cat [B, T, 3] (series id, category, day of week), x_cont [B, T, 2] (scaled target,
    relative_time_idx; the target is 0 in the decoder), target_scale [B, 2], y [B, DEC]
    (the bug: [B, 1, DEC], a channel axis kept)."""
    b = len(starts)
    x_cat = np.zeros((b, ENC + DEC, 3), dtype=np.int64)
    x_cont = np.zeros((b, ENC + DEC, 2), dtype=np.float32)
    scales = np.zeros((b, 2), dtype=np.float32)
    y = np.zeros((b, DEC), dtype=np.float32)
    rel = (np.arange(-ENC, DEC) / ENC).astype(np.float32)
    for i, (s, d) in enumerate(starts):
        x_cat[i, :, 0], x_cat[i, :, 1], x_cat[i, :, 2] = s, category[s], dow[d : d + ENC + DEC]
        x_cont[i, :ENC, 0] = (values[s, d : d + ENC] - center[s]) / scale[s]
        x_cont[i, :, 1] = rel
        scales[i] = center[s], scale[s]
        y[i] = values[s, d + ENC : d + ENC + DEC]
    target = torch.from_numpy(y)
    return (torch.from_numpy(x_cat), torch.from_numpy(x_cont), torch.from_numpy(scales)), (
        target.unsqueeze(1) if channel_axis else target)


# --------------------------------------------------------------------------- sub_modules.py


class TimeDistributedInterpolation(nn.Module):
    def __init__(self, output_size: int, batch_first: bool = False, trainable: bool = False) -> None:
        super().__init__()
        self.output_size, self.batch_first, self.trainable = output_size, batch_first, trainable
        if trainable:
            self.mask = nn.Parameter(torch.zeros(output_size))
            self.gate = nn.Sigmoid()

    def interpolate(self, x):
        up = F.interpolate(x.unsqueeze(1), self.output_size, mode="linear", align_corners=True).squeeze(1)
        return up * self.gate(self.mask.unsqueeze(0)) * 2.0 if self.trainable else up

    def forward(self, x):
        if x.dim() <= 2:
            return self.interpolate(x)
        y = self.interpolate(x.contiguous().view(-1, x.size(-1)))
        if self.batch_first:
            return y.contiguous().view(x.size(0), -1, y.size(-1))
        return y.view(-1, x.size(1), y.size(-1))


class GatedLinearUnit(nn.Module):
    def __init__(self, input_size: int, hidden_size: int | None = None, dropout: float | None = None) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout) if dropout is not None else None
        self.hidden_size = hidden_size or input_size
        self.fc = nn.Linear(input_size, self.hidden_size * 2)
        for n, p in self.named_parameters():
            if "bias" in n:
                nn.init.zeros_(p)
            else:
                nn.init.xavier_uniform_(p)

    def forward(self, x):
        if self.dropout is not None:
            x = self.dropout(x)
        return F.glu(self.fc(x), dim=-1)


class ResampleNorm(nn.Module):
    def __init__(self, input_size: int, output_size: int | None = None, trainable_add: bool = True) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size or input_size
        self.trainable_add = trainable_add
        if self.input_size != self.output_size:
            self.resample = TimeDistributedInterpolation(self.output_size, batch_first=True)
        if trainable_add:
            self.mask = nn.Parameter(torch.zeros(self.output_size))
            self.gate = nn.Sigmoid()
        self.norm = nn.LayerNorm(self.output_size)

    def forward(self, x):
        if self.input_size != self.output_size:
            x = self.resample(x)
        if self.trainable_add:
            x = x * self.gate(self.mask) * 2.0
        return self.norm(x)


class AddNorm(nn.Module):
    def __init__(self, input_size: int, skip_size: int | None = None, trainable_add: bool = True) -> None:
        super().__init__()
        self.input_size, self.skip_size = input_size, skip_size or input_size
        self.trainable_add = trainable_add
        if self.input_size != self.skip_size:
            self.resample = TimeDistributedInterpolation(self.input_size, batch_first=True)
        if trainable_add:
            self.mask = nn.Parameter(torch.zeros(self.input_size))
            self.gate = nn.Sigmoid()
        self.norm = nn.LayerNorm(self.input_size)

    def forward(self, x, skip):
        if self.input_size != self.skip_size:
            skip = self.resample(skip)
        if self.trainable_add:
            skip = skip * self.gate(self.mask) * 2.0
        return self.norm(x + skip)


class GateAddNorm(nn.Module):
    def __init__(self, input_size, hidden_size=None, skip_size=None, trainable_add=False, dropout=None) -> None:
        super().__init__()
        self.hidden_size = hidden_size or input_size
        self.skip_size = skip_size or self.hidden_size
        self.glu = GatedLinearUnit(input_size, hidden_size=self.hidden_size, dropout=dropout)
        self.add_norm = AddNorm(self.hidden_size, skip_size=self.skip_size, trainable_add=trainable_add)

    def forward(self, x, skip):
        return self.add_norm(self.glu(x), skip)


class GatedResidualNetwork(nn.Module):
    def __init__(self, input_size, hidden_size, output_size, dropout=0.1, context_size=None, residual=False) -> None:
        super().__init__()
        self.input_size, self.output_size, self.residual = input_size, output_size, residual
        residual_size = input_size if (input_size != output_size and not residual) else output_size
        if output_size != residual_size:
            self.resample_norm = ResampleNorm(residual_size, output_size)
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.elu = nn.ELU()
        self.context = nn.Linear(context_size, hidden_size, bias=False) if context_size is not None else None
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        for name, p in self.named_parameters():
            if "bias" in name:
                nn.init.zeros_(p)
            elif "fc1" in name or "fc2" in name:
                nn.init.kaiming_normal_(p, a=0, mode="fan_in", nonlinearity="leaky_relu")
            elif "context" in name:
                nn.init.xavier_uniform_(p)
        self.gate_norm = GateAddNorm(hidden_size, skip_size=output_size, hidden_size=output_size, dropout=dropout)

    def forward(self, x, context=None, residual=None):
        if residual is None:
            residual = x
        if self.input_size != self.output_size and not self.residual:
            residual = self.resample_norm(residual)
        x = self.fc1(x)
        if context is not None:
            x = x + self.context(context)
        x = self.fc2(self.elu(x))
        return self.gate_norm(x, residual)


class VariableSelectionNetwork(nn.Module):
    def __init__(self, input_sizes: dict[str, int], hidden_size: int, input_embedding_flags: dict[str, bool],
                 dropout: float, context_size: int | None, prescalers: nn.ModuleDict) -> None:  # fmt: skip
        super().__init__()
        self.input_sizes = input_sizes
        total = sum(input_sizes.values())
        if len(input_sizes) > 1:
            self.flattened_grn = GatedResidualNetwork(total, min(hidden_size, len(input_sizes)), len(input_sizes),
                                                      dropout, context_size, residual=False)  # fmt: skip
        self.single_variable_grns = nn.ModuleDict()
        self.prescalers = nn.ModuleDict()
        for name, size in input_sizes.items():
            if input_embedding_flags.get(name, False):
                self.single_variable_grns[name] = ResampleNorm(size, hidden_size)
            else:
                self.single_variable_grns[name] = GatedResidualNetwork(size, min(size, hidden_size), hidden_size,
                                                                       dropout)  # fmt: skip
                self.prescalers[name] = prescalers[name]
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: dict[str, torch.Tensor], context=None):
        var_outputs, weight_inputs = [], []
        for name in self.input_sizes:
            emb = x[name]
            if name in self.prescalers:
                emb = self.prescalers[name](emb)
            weight_inputs.append(emb)
            var_outputs.append(self.single_variable_grns[name](emb))
        var_outputs = torch.stack(var_outputs, dim=-1)
        sparse_weights = self.softmax(self.flattened_grn(torch.cat(weight_inputs, dim=-1), context)).unsqueeze(-2)
        return (var_outputs * sparse_weights).sum(dim=-1), sparse_weights


class ScaledDotProductAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.softmax = nn.Softmax(dim=2)

    def forward(self, q, k, v, mask=None):
        attn = torch.bmm(q, k.permute(0, 2, 1)) / math.sqrt(k.size(-1))
        if mask is not None:
            attn = attn.masked_fill(mask, -1e9)
        attn = self.softmax(attn)
        return torch.bmm(attn, v), attn


class InterpretableMultiHeadAttention(nn.Module):
    def __init__(self, n_head: int, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_head, self.d_k = n_head, d_model // n_head
        self.dropout = nn.Dropout(dropout)
        self.v_layer = nn.Linear(d_model, self.d_k)
        self.q_layers = nn.ModuleList([nn.Linear(d_model, self.d_k) for _ in range(n_head)])
        self.k_layers = nn.ModuleList([nn.Linear(d_model, self.d_k) for _ in range(n_head)])
        self.attention = ScaledDotProductAttention()
        self.w_h = nn.Linear(self.d_k, d_model, bias=False)
        for name, p in self.named_parameters():
            if "bias" not in name:
                nn.init.xavier_uniform_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, q, k, v, mask=None):
        heads, attns = [], []
        vs = self.v_layer(v)
        for i in range(self.n_head):
            head, attn = self.attention(self.q_layers[i](q), self.k_layers[i](k), vs, mask)
            heads.append(self.dropout(head))
            attns.append(attn)
        head = torch.stack(heads, dim=2) if self.n_head > 1 else heads[0]
        outputs = torch.mean(head, dim=2) if self.n_head > 1 else head
        return self.dropout(self.w_h(outputs)), torch.stack(attns, dim=2)


# --------------------------------------------------------------------------- temporal_fusion_transformer/__init__.py


class TemporalFusionTransformer(nn.Module):
    categoricals = ("series", "category", "day_of_week")
    reals = ("target", "relative_time_idx")
    static_variables = ("series", "category")
    encoder_variables = ("day_of_week", "target", "relative_time_idx")
    decoder_variables = ("day_of_week", "relative_time_idx")

    def __init__(self, cardinalities: dict[str, int]) -> None:
        super().__init__()
        h = HIDDEN
        self.emb_sizes = {n: min(embedding_size(c), h) for n, c in cardinalities.items()}
        self.input_embeddings = nn.ModuleDict({n: nn.Embedding(c, self.emb_sizes[n]) for n, c in cardinalities.items()})
        self.prescalers = nn.ModuleDict({n: nn.Linear(1, HIDDEN_CONT) for n in self.reals})

        def sizes(names):
            return {n: (self.emb_sizes[n] if n in self.categoricals else HIDDEN_CONT) for n in names}

        def flags(names):
            return {n: n in self.categoricals for n in names}

        self.static_variable_selection = VariableSelectionNetwork(
            sizes(self.static_variables), h, flags(self.static_variables), DROPOUT, None, self.prescalers)
        self.encoder_variable_selection = VariableSelectionNetwork(
            sizes(self.encoder_variables), h, flags(self.encoder_variables), DROPOUT, h, self.prescalers)
        self.decoder_variable_selection = VariableSelectionNetwork(
            sizes(self.decoder_variables), h, flags(self.decoder_variables), DROPOUT, h, self.prescalers)
        self.static_context_variable_selection = GatedResidualNetwork(h, h, h, DROPOUT)
        self.static_context_initial_hidden_lstm = GatedResidualNetwork(h, h, h, DROPOUT)
        self.static_context_initial_cell_lstm = GatedResidualNetwork(h, h, h, DROPOUT)
        self.static_context_enrichment = GatedResidualNetwork(h, h, h, DROPOUT)
        self.lstm_encoder = nn.LSTM(h, h, num_layers=LSTM_LAYERS, batch_first=True)
        self.lstm_decoder = nn.LSTM(h, h, num_layers=LSTM_LAYERS, batch_first=True)
        self.post_lstm_gate_encoder = GatedLinearUnit(h, dropout=DROPOUT)
        self.post_lstm_gate_decoder = self.post_lstm_gate_encoder
        self.post_lstm_add_norm_encoder = AddNorm(h, trainable_add=False)
        self.post_lstm_add_norm_decoder = self.post_lstm_add_norm_encoder
        self.static_enrichment = GatedResidualNetwork(h, h, h, DROPOUT, context_size=h)
        self.multihead_attn = InterpretableMultiHeadAttention(n_head=HEADS, d_model=h, dropout=DROPOUT)
        self.post_attn_gate_norm = GateAddNorm(h, dropout=DROPOUT, trainable_add=False)
        self.pos_wise_ff = GatedResidualNetwork(h, h, h, dropout=DROPOUT)
        self.pre_output_gate_norm = GateAddNorm(h, dropout=None, trainable_add=False)
        self.output_layer = nn.Linear(h, len(QUANTILES))

    @staticmethod
    def expand_static_context(context, timesteps):
        return context[:, None].expand(-1, timesteps, -1)

    @staticmethod
    def get_attention_mask(batch: int) -> torch.Tensor:
        attend_step = torch.arange(DEC)
        predict_step = torch.arange(DEC)[:, None]
        decoder_mask = (attend_step >= predict_step).unsqueeze(0).expand(batch, -1, -1)
        encoder_mask = torch.zeros(batch, DEC, ENC, dtype=torch.bool)  # every encoder length is full
        return torch.cat((encoder_mask, decoder_mask), dim=2)

    def forward(self, x_cat: torch.Tensor, x_cont: torch.Tensor, target_scale: torch.Tensor) -> torch.Tensor:
        timesteps = x_cont.size(1)
        input_vectors = {n: self.input_embeddings[n](x_cat[..., i]) for i, n in enumerate(self.categoricals)}
        input_vectors.update({n: x_cont[..., i].unsqueeze(-1) for i, n in enumerate(self.reals)})

        static_embedding, _ = self.static_variable_selection({n: input_vectors[n][:, 0] for n in self.static_variables})
        static_context_vs = self.expand_static_context(self.static_context_variable_selection(static_embedding),
                                                       timesteps)  # fmt: skip
        emb_enc, _ = self.encoder_variable_selection({n: input_vectors[n][:, :ENC] for n in self.encoder_variables},
                                                     static_context_vs[:, :ENC])  # fmt: skip
        emb_dec, _ = self.decoder_variable_selection({n: input_vectors[n][:, ENC:] for n in self.decoder_variables},
                                                     static_context_vs[:, ENC:])  # fmt: skip

        input_hidden = self.static_context_initial_hidden_lstm(static_embedding).expand(LSTM_LAYERS, -1, -1)
        input_cell = self.static_context_initial_cell_lstm(static_embedding).expand(LSTM_LAYERS, -1, -1)
        encoder_output, (hidden, cell) = self.lstm_encoder(emb_enc, (input_hidden.contiguous(),
                                                                     input_cell.contiguous()))  # fmt: skip
        decoder_output, _ = self.lstm_decoder(emb_dec, (hidden, cell))

        lstm_output_encoder = self.post_lstm_add_norm_encoder(self.post_lstm_gate_encoder(encoder_output), emb_enc)
        lstm_output_decoder = self.post_lstm_add_norm_decoder(self.post_lstm_gate_decoder(decoder_output), emb_dec)
        lstm_output = torch.cat([lstm_output_encoder, lstm_output_decoder], dim=1)

        static_context_enrichment = self.static_context_enrichment(static_embedding)
        attn_input = self.static_enrichment(lstm_output, self.expand_static_context(static_context_enrichment,
                                                                                    timesteps))  # fmt: skip
        attn_output, _ = self.multihead_attn(q=attn_input[:, ENC:], k=attn_input, v=attn_input,
                                             mask=self.get_attention_mask(x_cont.size(0)))  # fmt: skip
        attn_output = self.post_attn_gate_norm(attn_output, attn_input[:, ENC:])
        output = self.pos_wise_ff(attn_output)
        output = self.pre_output_gate_norm(output, lstm_output[:, ENC:])
        output = self.output_layer(output)
        # transform_output: the GroupNormalizer's inverse, (center, scale) per series
        return output * target_scale[:, 1, None, None] + target_scale[:, 0, None, None]


# --------------------------------------------------------------------------- metrics/quantile.py


def quantile_loss(y_pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """QuantileLoss.loss, reduced by the mean as MultiHorizonMetric does."""
    losses = []
    for i, q in enumerate(QUANTILES):
        errors = target - y_pred[..., i]
        losses.append(torch.max((q - 1) * errors, q * errors).unsqueeze(-1))
    return (2 * torch.cat(losses, dim=-1)).mean()


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    values, category, dow = make_data(seed)
    if variant == "no_target_normalizer":
        center, scale = np.zeros(N_SERIES, np.float32), np.ones(N_SERIES, np.float32)
    else:  # GroupNormalizer(groups=["series"]), fit on the training span
        center, scale = values[:, :TRAIN_DAYS].mean(1), values[:, :TRAIN_DAYS].std(1)
    channel_axis = variant == "quantile_target_broadcast"  # the bug: y batched as [B, 1, DEC]
    train_starts = [(s, d) for s in range(N_SERIES) for d in range(TRAIN_DAYS - ENC - DEC + 1)]
    test_starts = [(s, TRAIN_DAYS - ENC + 7 * w) for s in range(N_SERIES) for w in range(TEST_WEEKS)]
    val_starts = [(s, TRAIN_DAYS - ENC - DEC) for s in range(N_SERIES)]  # the last training week
    test_x, test_y = windows(values, category, dow, test_starts, center, scale)
    val_x, val_y = windows(values, category, dow, val_starts, center, scale, channel_axis)

    model = TemporalFusionTransformer({"series": N_SERIES, "category": N_CAT, "day_of_week": 7})
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    loss_fn = quantile_loss
    def batch_at(rows):
        return windows(values, category, dow, [train_starts[r] for r in rows], center, scale, channel_axis)

    first = batch_at(rng.permutation(len(train_starts))[:BATCH])
    nx.preflight(model, first, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    train_loss = float("nan")
    for _epoch in range(EPOCHS):
        model.train()
        order = rng.permutation(len(train_starts))
        losses = []
        for b in range(BATCHES_PER_EPOCH):
            x, y = batch_at(order[b * BATCH : (b + 1) * BATCH])
            optimizer.zero_grad()
            loss = loss_fn(model(*x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
        train_loss = float(np.mean(losses))
        model.eval()
        with torch.no_grad():
            val_loss = loss_fn(model(*val_x), val_y)
        mon.log(val_loss, split="val")

    nx.finish(mon, model, first, loss_fn, optimizer=optimizer)
    model.eval()
    with torch.no_grad():
        pred = model(*test_x)
        p50 = pred[..., QUANTILES.index(0.5)]
        nmae = (p50 - test_y).abs().sum() / test_y.abs().sum()
        test_ql = quantile_loss(pred, test_y)  # measure only: the target in its right shape
    return {"test_nmae": float(nmae), "test_quantile_loss": float(test_ql), "val_loss": float(val_loss),
            "train_loss": train_loss}  # fmt: skip
