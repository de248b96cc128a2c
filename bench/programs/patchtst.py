"""Port of yuqinie98/PatchTST's supervised PatchTST (Nie et al., "A Time Series is Worth 64
Words"): each channel on its own, instance-normalised by RevIN, cut into overlapping
patches, each patch projected to a token, a Transformer encoder with BatchNorm and
residual attention over the patches, a flatten head to the horizon, RevIN undone; MSE,
Adam and a OneCycle LR schedule stepped every batch.

Source: github.com/yuqinie98/PatchTST, ``PatchTST_supervised/run_longExp.py``,
``PatchTST_supervised/exp/exp_main.py``, ``PatchTST_supervised/models/PatchTST.py``,
``PatchTST_supervised/layers/PatchTST_backbone.py``,
``PatchTST_supervised/layers/PatchTST_layers.py``, ``PatchTST_supervised/layers/RevIN.py``,
``PatchTST_supervised/data_provider/data_factory.py``,
``PatchTST_supervised/data_provider/data_loader.py`` and
``PatchTST_supervised/utils/tools.py`` at commit 204c21efe0b39603ad6e2ca640ef5896646ab1a9
(Apache-2.0, Copyright 2023 Yuqi Nie et al.). Written anew from the facts of those files; no
code copied.

Kept: ``Model`` with ``decomposition=0``, ``individual=0``, ``revin=1``, ``affine=0``,
``subtract_last=0``, ``padding_patch='end'`` (the run_longExp defaults) and the class
defaults (``norm='BatchNorm'``, ``attn_dropout=0``, ``act='gelu'``, ``res_attention=True``,
``pre_norm=False``, ``pe='zeros'`` with ``learn_pe=True``, ``head_type='flatten'``):
``PatchTST_backbone`` (RevIN ``'norm'`` on ``[B, L, C]``: the mean and the biased std over
time, both detached, eps 1e-5; ``ReplicationPad1d((0, stride))``; ``unfold(-1, patch_len,
stride)``; ``patch_num = (seq_len - patch_len) // stride + 1 + 1``), ``TSTiEncoder``
(``W_P = Linear(patch_len, d_model)``, the batch and channel axes folded together, the
learned position table ``uniform(-0.02, 0.02)`` of ``[patch_num, d_model]``, dropout),
``TSTEncoder`` of ``TSTEncoderLayer`` s passing the pre-softmax scores on (``_MultiheadAttention``:
``W_Q``/``W_K``/``W_V`` with bias, ``_ScaledDotProductAttention`` with the fixed
``head_dim ** -0.5`` scale held as a parameter without gradient, the previous layer's
scores added, softmax, ``to_out`` Linear + dropout; residual dropout and
``Transpose``-``BatchNorm1d``-``Transpose`` after attention and after the
Linear-GELU-Dropout-Linear feed-forward), ``Flatten_Head`` (``Flatten(start_dim=-2)``,
``Linear(d_model * patch_num, pred_len)``, dropout), RevIN ``'denorm'``, and
``Model.forward``'s ``permute`` s. ``Dataset_ETT_hour``'s borders (train, then val and
test each starting ``seq_len`` before their span), the ``StandardScaler`` fitted on the
train span, ``__getitem__`` (``seq_x``, then ``label_len`` + ``pred_len`` steps as
``seq_y``, timeF marks); ``data_provider`` (train and val shuffled with ``drop_last=True``,
the test loader unshuffled with ``drop_last=True`` as this commit has it); ``Exp_Main``:
``Adam(lr)``, ``nn.MSELoss()``, ``lr_scheduler.OneCycleLR(steps_per_epoch=len(train_loader),
pct_start, epochs=train_epochs, max_lr=learning_rate)``, the epoch loop (``model.train()``;
per batch ``zero_grad``, ``outputs = model(batch_x)`` as for every 'TST' model, ``f_dim =
0``, the last ``pred_len`` steps, loss, ``backward``, ``step``, then for ``lradj == 'TST'``
``adjust_learning_rate`` (which sets the lr the scheduler last gave) and
``scheduler.step()``), ``vali`` on the val and test loaders (``model.eval()``,
``torch.no_grad()``, then ``model.train()``), ``EarlyStopping`` (the best validation loss's
weights kept in memory instead of ``checkpoint.pth``; ``patience`` left at its default,
100, so it never stops here), the best weights reloaded, then ``test`` (``model.eval()``,
MSE/MAE over the test loader). The ETTh1 script's model: ``n_heads 4``, ``d_model 16``,
``d_ff 128``, ``dropout 0.3``, ``fc_dropout 0.3`` (unused by the flatten head),
``head_dropout 0``, ``patch_len 16``, ``stride 8``, ``pred_len 96`` (the first of its four
runs), ``label_len 48`` (the default), ``enc_in 7``, ``features M``; with ``--lradj 'TST'``
and ``--pct_start 0.4`` as the ETTm1 script passes them (the ETTh1 script leaves ``lradj``
at type3, adjusted per epoch).
Shrunk: a synthetic 7-column hourly series (the dlinear port's: six "load" columns with a
slowly wandering shared level, daily and weekly cycles and AR(1) noise, each on its own
scale, and an "OT" column that follows them slowly) stands in for ETTh1.csv (no download),
3/1/1 months (2,160/720/720 hours) instead of ETTh1's 12/4/4; ``seq_len`` 96
(run_longExp's default) instead of the script's 336 (12 patches instead of 42);
``e_layers`` 2 instead of 3; ``batch_size`` 32 (the electricity script's) instead of 128;
``train_epochs`` 5 instead of 100 (305 steps instead of 6,400) and ``learning_rate`` 0.002
instead of 0.0001 so that the OneCycle schedule fits them; ``itr`` 1. No plots, result
files or ``predict``.
Measure only (not in the program): ``naive_mse``, the last input value repeated over the
horizon, on the same test windows.

nndx, as the author would add it: a preflight ``nndx.probe`` on one shuffled training batch
as the loop builds it (``batch_x``, the last ``pred_len`` steps of ``batch_y``) with
``criterion`` and the optimizer, the train and val windows and their horizons as ``data``;
``nndx.Monitor(model, model_optim, loss_fn=criterion)`` around the epochs, the loss called
as ``mon.loss_fn``, each batch's loss logged and each epoch's ``vali_loss`` logged as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader

from bench.programs.dlinear import Dataset_ETT_hour, make_series
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "patchtst"
SOURCE = Source("yuqinie98/PatchTST", "PatchTST_supervised/exp/exp_main.py", "204c21efe0b39603ad6e2ca640ef5896646ab1a9",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the ETTh1 script's PatchTST with lradj TST (pct_start 0.4, as the ETTm1 script), shrunk"),
        Variant(
            "onecycle_per_epoch",
            "scheduler.step() (with its adjust_learning_rate call) moved from the batch loop to the end of the "
            "epoch: OneCycleLR, built with steps_per_epoch=len(train_loader), advances 5 of its 305 steps, so "
            "the lr stays near max_lr / 25 for the whole run",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/pytorch/pytorch/issues/65417",
             "https://github.com/ultralytics/yolov5/issues/7485",
             "https://github.com/ageron/handson-mlp/issues/28"),
            Measure("test_mse", "test MSE 1.05x the healthy run's or more (the final train loss is higher too)",
                    lambda healthy, buggy: not buggy < 1.05 * healthy),
        ),
        Variant(
            "zero_grad_per_epoch",
            "model_optim.zero_grad() called once before each epoch's batch loop instead of before every batch: "
            "each step's gradient is the sum of every batch's so far in the epoch",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/KasperGroesLudvigsen/influenza_transformer/issues/13",
             "https://github.com/wz0919/waypoint-predictor/issues/4"),
            Measure("test_mse", "test MSE 1.1x the healthy run's or more",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
    )
}

ARGS = {
    "seq_len": 96, "label_len": 48, "pred_len": 96, "enc_in": 7, "e_layers": 2, "n_heads": 4, "d_model": 16,
    "d_ff": 128, "dropout": 0.3, "fc_dropout": 0.3, "head_dropout": 0.0, "patch_len": 16, "stride": 8,
    "padding_patch": "end", "revin": 1, "affine": 0, "subtract_last": 0, "decomposition": 0, "individual": 0,
    "batch_size": 32, "learning_rate": 0.002, "train_epochs": 5, "patience": 100, "lradj": "TST",
    "pct_start": 0.4,
}  # fmt: skip
BORDERS = (3 * 30 * 24, 1 * 30 * 24, 1 * 30 * 24)  # train, val, test hours


# --------------------------------------------------------------------------- layers/RevIN.py


class RevIN(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, subtract_last: bool = False) -> None:
        super().__init__()
        self.num_features, self.eps, self.affine, self.subtract_last = num_features, eps, affine, subtract_last
        if self.affine:
            self.affine_weight = nn.Parameter(torch.ones(num_features))
            self.affine_bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: Tensor, mode: str) -> Tensor:
        if mode == "norm":
            self._get_statistics(x)
            return self._normalize(x)
        if mode == "denorm":
            return self._denormalize(x)
        raise NotImplementedError(mode)

    def _get_statistics(self, x: Tensor) -> None:
        dims = tuple(range(1, x.ndim - 1))
        if self.subtract_last:
            self.last = x[:, -1, :].unsqueeze(1)
        else:
            self.mean = torch.mean(x, dim=dims, keepdim=True).detach()
        self.stdev = torch.sqrt(torch.var(x, dim=dims, keepdim=True, unbiased=False) + self.eps).detach()

    def _normalize(self, x: Tensor) -> Tensor:
        x = (x - (self.last if self.subtract_last else self.mean)) / self.stdev
        if self.affine:
            x = x * self.affine_weight + self.affine_bias
        return x

    def _denormalize(self, x: Tensor) -> Tensor:
        if self.affine:
            x = (x - self.affine_bias) / (self.affine_weight + self.eps * self.eps)
        x = x * self.stdev
        return x + (self.last if self.subtract_last else self.mean)


# --------------------------------------------------------------------------- layers/PatchTST_layers.py


class Transpose(nn.Module):
    def __init__(self, *dims: int) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: Tensor) -> Tensor:
        return x.transpose(*self.dims)


def positional_encoding(q_len: int, d_model: int) -> nn.Parameter:
    """pe='zeros', learn_pe=True: a learned table drawn from U(-0.02, 0.02)."""
    w_pos = torch.empty(q_len, d_model)
    nn.init.uniform_(w_pos, -0.02, 0.02)
    return nn.Parameter(w_pos, requires_grad=True)


# --------------------------------------------------------------------------- layers/PatchTST_backbone.py


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, attn_dropout: float = 0.0, res_attention: bool = False,
                 lsa: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.res_attention = res_attention
        self.scale = nn.Parameter(torch.tensor((d_model // n_heads) ** -0.5), requires_grad=lsa)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, prev: Tensor | None = None):
        attn_scores = torch.matmul(q, k) * self.scale  # [bs, heads, q_len, q_len]; k is [bs, heads, d_k, q_len]
        if prev is not None:
            attn_scores = attn_scores + prev
        attn_weights = self.attn_dropout(F.softmax(attn_scores, dim=-1))
        output = torch.matmul(attn_weights, v)
        return output, attn_weights, attn_scores


class MultiheadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, res_attention: bool = False, attn_dropout: float = 0.0,
                 proj_dropout: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        d_k = d_v = d_model // n_heads
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.W_Q = nn.Linear(d_model, d_k * n_heads, bias=True)
        self.W_K = nn.Linear(d_model, d_k * n_heads, bias=True)
        self.W_V = nn.Linear(d_model, d_v * n_heads, bias=True)
        self.res_attention = res_attention
        self.sdp_attn = ScaledDotProductAttention(d_model, n_heads, attn_dropout=attn_dropout,
                                                  res_attention=res_attention)  # fmt: skip
        self.to_out = nn.Sequential(nn.Linear(n_heads * d_v, d_model), nn.Dropout(proj_dropout))

    def forward(self, Q: Tensor, prev: Tensor | None = None):
        bs = Q.size(0)
        q_s = self.W_Q(Q).view(bs, -1, self.n_heads, self.d_k).transpose(1, 2)
        k_s = self.W_K(Q).view(bs, -1, self.n_heads, self.d_k).permute(0, 2, 3, 1)
        v_s = self.W_V(Q).view(bs, -1, self.n_heads, self.d_v).transpose(1, 2)
        output, attn_weights, attn_scores = self.sdp_attn(q_s, k_s, v_s, prev=prev)
        output = output.transpose(1, 2).contiguous().view(bs, -1, self.n_heads * self.d_v)
        return self.to_out(output), attn_weights, attn_scores


class TSTEncoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, attn_dropout: float, dropout: float,
                 res_attention: bool) -> None:  # fmt: skip
        super().__init__()
        self.res_attention = res_attention
        self.self_attn = MultiheadAttention(d_model, n_heads, res_attention=res_attention, attn_dropout=attn_dropout,
                                            proj_dropout=dropout)  # fmt: skip
        self.dropout_attn = nn.Dropout(dropout)
        self.norm_attn = nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff, bias=True), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(d_ff, d_model, bias=True))  # fmt: skip
        self.dropout_ffn = nn.Dropout(dropout)
        self.norm_ffn = nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))

    def forward(self, src: Tensor, prev: Tensor | None = None):
        src2, _attn, scores = self.self_attn(src, prev)
        src = self.norm_attn(src + self.dropout_attn(src2))
        src = self.norm_ffn(src + self.dropout_ffn(self.ff(src)))
        return src, scores


class TSTEncoder(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, attn_dropout: float, dropout: float,
                 res_attention: bool, n_layers: int) -> None:  # fmt: skip
        super().__init__()
        self.layers = nn.ModuleList([TSTEncoderLayer(d_model, n_heads, d_ff, attn_dropout, dropout, res_attention)
                                     for _ in range(n_layers)])  # fmt: skip

    def forward(self, src: Tensor) -> Tensor:
        output, scores = src, None
        for mod in self.layers:
            output, scores = mod(output, prev=scores)
        return output


class TSTiEncoder(nn.Module):
    """Channel-independent: every channel of every sample is one sequence of patches."""

    def __init__(self, patch_num: int, patch_len: int, n_layers: int, d_model: int, n_heads: int, d_ff: int,
                 attn_dropout: float, dropout: float, res_attention: bool) -> None:  # fmt: skip
        super().__init__()
        self.W_P = nn.Linear(patch_len, d_model)
        self.W_pos = positional_encoding(patch_num, d_model)
        self.dropout = nn.Dropout(dropout)
        self.encoder = TSTEncoder(d_model, n_heads, d_ff, attn_dropout, dropout, res_attention, n_layers)

    def forward(self, x: Tensor) -> Tensor:  # x: [bs, nvars, patch_len, patch_num]
        n_vars = x.shape[1]
        x = self.W_P(x.permute(0, 1, 3, 2))  # [bs, nvars, patch_num, d_model]
        u = torch.reshape(x, (x.shape[0] * x.shape[1], x.shape[2], x.shape[3]))
        u = self.dropout(u + self.W_pos)
        z = self.encoder(u)
        z = torch.reshape(z, (-1, n_vars, z.shape[-2], z.shape[-1]))
        return z.permute(0, 1, 3, 2)  # [bs, nvars, d_model, patch_num]


class FlattenHead(nn.Module):
    def __init__(self, nf: int, target_window: int, head_dropout: float = 0.0) -> None:
        super().__init__()
        self.flatten = nn.Flatten(start_dim=-2)
        self.linear = nn.Linear(nf, target_window)
        self.dropout = nn.Dropout(head_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.linear(self.flatten(x)))


class PatchTSTBackbone(nn.Module):
    def __init__(self, c_in: int, context_window: int, target_window: int, patch_len: int, stride: int,
                 n_layers: int, d_model: int, n_heads: int, d_ff: int, attn_dropout: float, dropout: float,
                 head_dropout: float, padding_patch: str | None, revin: bool, affine: bool,
                 subtract_last: bool, res_attention: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.revin = revin
        if revin:
            self.revin_layer = RevIN(c_in, affine=affine, subtract_last=subtract_last)
        self.patch_len, self.stride, self.padding_patch = patch_len, stride, padding_patch
        patch_num = int((context_window - patch_len) / stride + 1)
        if padding_patch == "end":
            self.padding_patch_layer = nn.ReplicationPad1d((0, stride))
            patch_num += 1
        self.backbone = TSTiEncoder(patch_num, patch_len, n_layers, d_model, n_heads, d_ff, attn_dropout, dropout,
                                    res_attention)  # fmt: skip
        self.head = FlattenHead(d_model * patch_num, target_window, head_dropout=head_dropout)

    def forward(self, z: Tensor) -> Tensor:  # z: [bs, nvars, seq_len]
        if self.revin:
            z = self.revin_layer(z.permute(0, 2, 1), "norm").permute(0, 2, 1)
        if self.padding_patch == "end":
            z = self.padding_patch_layer(z)
        z = z.unfold(dimension=-1, size=self.patch_len, step=self.stride)  # [bs, nvars, patch_num, patch_len]
        z = self.head(self.backbone(z.permute(0, 1, 3, 2)))  # [bs, nvars, target_window]
        if self.revin:
            z = self.revin_layer(z.permute(0, 2, 1), "denorm").permute(0, 2, 1)
        return z


# --------------------------------------------------------------------------- models/PatchTST.py


class PatchTST(nn.Module):
    def __init__(self, args: dict) -> None:
        super().__init__()
        assert not args["decomposition"] and not args["individual"]
        self.model = PatchTSTBackbone(
            c_in=args["enc_in"], context_window=args["seq_len"], target_window=args["pred_len"],
            patch_len=args["patch_len"], stride=args["stride"], n_layers=args["e_layers"], d_model=args["d_model"],
            n_heads=args["n_heads"], d_ff=args["d_ff"], attn_dropout=0.0, dropout=args["dropout"],
            head_dropout=args["head_dropout"], padding_patch=args["padding_patch"], revin=bool(args["revin"]),
            affine=bool(args["affine"]), subtract_last=bool(args["subtract_last"]),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:  # x: [Batch, Input length, Channel]
        return self.model(x.permute(0, 2, 1)).permute(0, 2, 1)


# --------------------------------------------------------------------------- data_provider


def data_provider(values, marks, flag: str, seed: int) -> tuple[Dataset_ETT_hour, DataLoader]:
    size = (ARGS["seq_len"], ARGS["label_len"], ARGS["pred_len"])
    data_set = Dataset_ETT_hour(values, marks, flag, size, borders=BORDERS)
    shuffle_flag, drop_last = (False, True) if flag == "test" else (True, True)
    generator = torch.Generator().manual_seed(seed + {"train": 1, "val": 2, "test": 3}[flag])
    loader = DataLoader(data_set, batch_size=ARGS["batch_size"], shuffle=shuffle_flag, drop_last=drop_last,
                        generator=generator)  # fmt: skip
    return data_set, loader


# --------------------------------------------------------------------------- exp/exp_main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(2021 + seed)
    np.random.seed(2021 + seed)
    values, marks = make_series(seed, hours=sum(BORDERS))
    train_data, train_loader = data_provider(values, marks, "train", seed)
    vali_data, vali_loader = data_provider(values, marks, "val", seed)
    test_data, test_loader = data_provider(values, marks, "test", seed)

    model = PatchTST(args).float()
    model_optim = torch.optim.Adam(model.parameters(), lr=args["learning_rate"])
    criterion = nn.MSELoss()
    train_steps = len(train_loader)
    scheduler = lr_scheduler.OneCycleLR(optimizer=model_optim, steps_per_epoch=train_steps,
                                        pct_start=args["pct_start"], epochs=args["train_epochs"],
                                        max_lr=args["learning_rate"])  # fmt: skip
    pred_len, f_dim = args["pred_len"], 0  # features 'M'

    def adjust_learning_rate() -> None:  # utils/tools.py, lradj 'TST': the scheduler's last lr
        for param_group in model_optim.param_groups:
            param_group["lr"] = scheduler.get_last_lr()[0]

    def stacked(ds: Dataset_ETT_hour) -> tuple[Tensor, Tensor]:
        items = [ds[i] for i in range(len(ds))]
        x = torch.from_numpy(np.stack([it[0] for it in items]))
        y = torch.from_numpy(np.stack([it[1][-pred_len:] for it in items]))
        return x, y

    probe_x, probe_y, _, _ = next(iter(DataLoader(train_data, batch_size=args["batch_size"], shuffle=True,
                                                  generator=torch.Generator().manual_seed(seed + 7))))  # fmt: skip
    probe_batch = (probe_x.float(), probe_y[:, -pred_len:, f_dim:].float())
    splits = (*stacked(train_data), *stacked(vali_data))
    nx.preflight(model, probe_batch, criterion, optimizer=model_optim, data=splits)
    mon = nx.monitor(model, model_optim, every=5, loss_fn=criterion)

    def vali(loader: DataLoader) -> float:
        total_loss = []
        model.eval()
        with torch.no_grad():
            for batch_x, batch_y, _batch_x_mark, _batch_y_mark in loader:
                outputs = model(batch_x.float())[:, -pred_len:, f_dim:]
                total_loss.append(criterion(outputs, batch_y[:, -pred_len:, f_dim:].float()).item())
        model.train()
        return float(np.average(total_loss))

    best_score, best_state = None, None
    train_loss = vali_loss = test_loss = float("nan")
    for _epoch in range(args["train_epochs"]):
        losses = []
        model.train()
        if variant == "zero_grad_per_epoch":  # the bug: gradients cleared once an epoch
            model_optim.zero_grad()
        for batch_x, batch_y, _batch_x_mark, _batch_y_mark in train_loader:
            if variant != "zero_grad_per_epoch":
                model_optim.zero_grad()
            outputs = model(batch_x.float())[:, -pred_len:, f_dim:]
            loss = mon.loss_fn(outputs, batch_y[:, -pred_len:, f_dim:].float())
            losses.append(loss.item())
            loss.backward()
            model_optim.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            if variant != "onecycle_per_epoch":
                adjust_learning_rate()
                scheduler.step()
        if variant == "onecycle_per_epoch":  # the bug: the per-batch schedule stepped once an epoch
            adjust_learning_rate()
            scheduler.step()
        train_loss = float(np.average(losses))
        vali_loss = vali(vali_loader)
        test_loss = vali(test_loader)
        nx.timed(lambda: mon.log(vali_loss, split="val"))  # noqa: B023
        if best_score is None or -vali_loss >= best_score:  # EarlyStopping (patience 100: never stops here)
            best_score, best_state = -vali_loss, copy.deepcopy(model.state_dict())

    nx.finish(mon, model, probe_batch, criterion, optimizer=model_optim, data=splits)
    model.load_state_dict(best_state)

    # test(): the program's own MSE/MAE; naive_mse is the measure's
    model.eval()
    preds, trues, naive = [], [], []
    with torch.no_grad():
        for batch_x, batch_y, _batch_x_mark, _batch_y_mark in test_loader:
            preds.append(model(batch_x.float())[:, -pred_len:, f_dim:].numpy())
            trues.append(batch_y[:, -pred_len:, f_dim:].numpy())
            naive.append(np.repeat(batch_x[:, -1:, f_dim:].numpy(), pred_len, axis=1))
    preds, trues, naive = (np.concatenate(a) for a in (preds, trues, naive))
    mse, mae = float(np.mean((preds - trues) ** 2)), float(np.mean(np.abs(preds - trues)))
    naive_mse = float(np.mean((naive - trues) ** 2))
    return {"test_mse": mse, "test_mae": mae, "naive_mse": naive_mse, "test_vs_naive": mse / naive_mse,
            "train_loss": train_loss, "vali_loss": vali_loss, "test_loss": test_loss,
            "final_lr": float(model_optim.param_groups[0]["lr"])}  # fmt: skip
