"""Port of the UvA deep-learning course's Tutorial 6 (Transformers and multi-head attention):
the sequence-reversal task. A one-layer post-norm Transformer encoder, written by hand
(``scaled_dot_product``, ``MultiheadAttention`` with one stacked ``qkv_proj``, ``EncoderBlock``,
sinusoidal ``PositionalEncoding``), reads 16 one-hot digits and predicts, at every position,
the digit of the mirrored position; Adam with the notebook's ``CosineWarmupScheduler`` stepped
every batch, gradient norm clipped at 5.

Source: github.com/phlippe/uvadlc_notebooks,
``docs/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.ipynb`` at commit
0da8037c7abc32f478ff6142acceb72dbcf088ee (MIT, Copyright (c) 2020 Phillip Lippe). Written anew
from the facts of that notebook; no code copied.

Kept: ``scaled_dot_product`` (``q k^T / sqrt(d_k)``, a mask filled with -9e15, softmax over the
last axis); ``expand_mask``; ``MultiheadAttention`` (``qkv_proj = Linear(input_dim, 3 *
embed_dim)``, ``o_proj``, Xavier-uniform weights and zero biases, the projection reshaped to
``(batch, seq, heads, 3 * head_dim)``, permuted to ``(batch, heads, seq, 3 * head_dim)`` and
chunked into q, k, v); ``EncoderBlock`` (post-norm: ``x = norm1(x + dropout(attn(x)))``, an MLP
``Linear -> Dropout -> ReLU(inplace=True) -> Linear`` of width ``2 * model_dim``, ``x =
norm2(x + dropout(mlp(x)))``); ``TransformerEncoder``; ``PositionalEncoding`` (a ``(1, max_len,
d_model)`` sin/cos table, ``max_len`` 5000, a non-persistent buffer, ``x + pe[:, :x.size(1)]``);
``CosineWarmupScheduler`` (an ``_LRScheduler`` whose factor is ``0.5 (1 + cos(pi * it /
max_iters))``, times ``it / warmup`` while ``it <= warmup``); ``TransformerPredictor`` /
``ReversePredictor`` (``input_net = Dropout(input_dropout) -> Linear(input_dim, model_dim)``,
the positional encoding, the encoder, ``output_net = Linear -> LayerNorm -> ReLU(inplace=True)
-> Dropout -> Linear(model_dim, num_classes)``; ``_calculate_loss``: ``F.one_hot`` of the
inputs as floats, ``F.cross_entropy(preds.view(-1, C), labels.view(-1))`` and the token
accuracy); ``ReverseDataset`` (``torch.randint(num_categories, (size, seq_len))``, the labels
the input flipped); the notebook's call (``num_categories`` 10, ``seq_len`` 16, ``model_dim``
32, ``num_heads`` 1, ``num_layers`` 1, dropout 0, ``lr`` 5e-4, ``warmup`` 50, ``max_iters =
max_epochs * len(train_loader)``); the train loader (batch 128, ``shuffle=True``,
``drop_last=True``), the val and test loaders (batch 128). The Lightning ``Trainer`` replaced
by the loop it runs: per batch ``zero_grad``, ``training_step``, ``backward``,
``clip_grad_norm_(parameters, 5)`` (``gradient_clip_val=5``), ``optimizer.step()``,
``lr_scheduler.step()`` (``'interval': 'step'``); per epoch a validation pass in eval mode
(loss and accuracy averaged over the val set, what ``self.log`` aggregates); after fitting,
``trainer.test`` on the val and the test loader with the model as trained (the notebook passes
the model, so its last weights are tested, not the checkpoint).
Shrunk: 20,480 training sequences instead of 50,000 (10 epochs as in the notebook: 1,600 steps
instead of 3,900; ``max_iters`` follows), 2,000 test sequences instead of 10,000; CPU; no pretrained
checkpoint download, no ``ModelCheckpoint`` files, no sanity-check validation, no attention
plots.
Measure only (not in the program): nothing; the variants are measured by the test accuracy and
test loss that ``trainer.test`` reports.

nndx, as the author would add it after reading the README (in the plain loop): the model is
called on one-hot inputs and the loss on the ``(batch, seq, classes)`` predictions, so nndx gets
``loss_fn(preds, labels) = F.cross_entropy(preds.view(-1, C), labels.view(-1))`` and the first
training batch ``(one_hot(inputs), labels)``; a preflight ``nndx.probe`` with the optimizer and
the one-hot train/val sets as ``data``; ``nndx.Monitor(model, optimizer, every=10)`` around the
loop, each step's loss and accuracy logged where ``training_step`` logs them and each epoch's
val loss and accuracy as ``split="val"``; after fitting ``nndx.probe(..., monitor=mon)`` on the
same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.data as data
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "uvadlc_reverse_transformer"
SOURCE = Source("phlippe/uvadlc_notebooks", "docs/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.ipynb",
                "0da8037c7abc32f478ff6142acceb72dbcf088ee", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's reverse task as published (shrunk: 20,480 sequences, 10 epochs, plain loop)"),
        Variant(
            "pe_on_batch_axis",
            "PositionalEncoding written as the PyTorch tutorial's, for (seq, batch, dim) inputs: the table is "
            "(max_len, 1, d_model) and forward adds pe[:x.size(0)], but the model's inputs are batch-first: each "
            "sequence gets one position vector (its index in the batch) broadcast over all 16 positions, so the "
            "encoder cannot tell positions apart",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/AkiRusProd/numpy-transformer/issues/1",
             "https://github.com/songyangco/GETNext/issues/2",
             "https://github.com/tanjimin/C.Origami/issues/42"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "scheduler_per_epoch",
            "the CosineWarmupScheduler stepped once per epoch instead of once per batch (Lightning's default "
            "interval 'epoch', the notebook's 'interval': 'step' left out; in the plain loop the scheduler.step() "
            "moved to the epoch's end): warmup=50 and max_iters count epochs, so the learning rate stays at "
            "0 .. 9/50 of 5e-4 for the whole run",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/ace-step/ACE-Step/pull/198",
             "https://github.com/CUNY-CL/yoyodyne/issues/243",
             "https://github.com/vturrisi/solo-learn/issues/264"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

NUM_CATEGORIES, SEQ_LEN = 10, 16
N_TRAIN, N_VAL, N_TEST = 20480, 1000, 2000
BATCH_SIZE, MAX_EPOCHS, GRADIENT_CLIP_VAL = 128, 10, 5.0
HPARAMS = {"input_dim": NUM_CATEGORIES, "model_dim": 32, "num_heads": 1, "num_classes": NUM_CATEGORIES,
           "num_layers": 1, "dropout": 0.0, "lr": 5e-4, "warmup": 50}  # fmt: skip


# --------------------------------------------------------------------------- attention


def scaled_dot_product(q, k, v, mask=None):
    d_k = q.size()[-1]
    attn_logits = torch.matmul(q, k.transpose(-2, -1))
    attn_logits = attn_logits / math.sqrt(d_k)
    if mask is not None:
        attn_logits = attn_logits.masked_fill(mask == 0, -9e15)
    attention = F.softmax(attn_logits, dim=-1)
    values = torch.matmul(attention, v)
    return values, attention


def expand_mask(mask):
    assert mask.ndim >= 2, "Mask must be at least 2-dimensional with seq_length x seq_length"
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    while mask.ndim < 4:
        mask = mask.unsqueeze(0)
    return mask


class MultiheadAttention(nn.Module):
    def __init__(self, input_dim, embed_dim, num_heads):
        super().__init__()
        assert embed_dim % num_heads == 0, "Embedding dimension must be 0 modulo number of heads."
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv_proj = nn.Linear(input_dim, 3 * embed_dim)
        self.o_proj = nn.Linear(embed_dim, input_dim)
        self._reset_parameters()

    def _reset_parameters(self):
        nn.init.xavier_uniform_(self.qkv_proj.weight)
        self.qkv_proj.bias.data.fill_(0)
        nn.init.xavier_uniform_(self.o_proj.weight)
        self.o_proj.bias.data.fill_(0)

    def forward(self, x, mask=None, return_attention=False):
        batch_size, seq_length, _ = x.size()
        if mask is not None:
            mask = expand_mask(mask)
        qkv = self.qkv_proj(x)
        qkv = qkv.reshape(batch_size, seq_length, self.num_heads, 3 * self.head_dim)
        qkv = qkv.permute(0, 2, 1, 3)  # [Batch, Head, SeqLen, Dims]
        q, k, v = qkv.chunk(3, dim=-1)
        values, attention = scaled_dot_product(q, k, v, mask=mask)
        values = values.permute(0, 2, 1, 3)  # [Batch, SeqLen, Head, Dims]
        values = values.reshape(batch_size, seq_length, self.embed_dim)
        o = self.o_proj(values)
        if return_attention:
            return o, attention
        return o


class EncoderBlock(nn.Module):
    def __init__(self, input_dim, num_heads, dim_feedforward, dropout=0.0):
        super().__init__()
        self.self_attn = MultiheadAttention(input_dim, input_dim, num_heads)
        self.linear_net = nn.Sequential(
            nn.Linear(input_dim, dim_feedforward),
            nn.Dropout(dropout),
            nn.ReLU(inplace=True),
            nn.Linear(dim_feedforward, input_dim),
        )
        self.norm1 = nn.LayerNorm(input_dim)
        self.norm2 = nn.LayerNorm(input_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        attn_out = self.self_attn(x, mask=mask)
        x = x + self.dropout(attn_out)
        x = self.norm1(x)
        linear_out = self.linear_net(x)
        x = x + self.dropout(linear_out)
        x = self.norm2(x)
        return x


class TransformerEncoder(nn.Module):
    def __init__(self, num_layers, **block_args):
        super().__init__()
        self.layers = nn.ModuleList([EncoderBlock(**block_args) for _ in range(num_layers)])

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask=mask)
        return x


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, seq_first_table=False):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.seq_first_table = seq_first_table
        # the bug: the (max_len, 1, d_model) table of a (seq, batch, dim) model
        pe = pe.unsqueeze(1) if seq_first_table else pe.unsqueeze(0)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x):
        if self.seq_first_table:
            return x + self.pe[: x.size(0)]
        return x + self.pe[:, : x.size(1)]


class CosineWarmupScheduler(optim.lr_scheduler._LRScheduler):
    def __init__(self, optimizer, warmup, max_iters):
        self.warmup = warmup
        self.max_num_iters = max_iters
        super().__init__(optimizer)

    def get_lr(self):
        lr_factor = self.get_lr_factor(epoch=self.last_epoch)
        return [base_lr * lr_factor for base_lr in self.base_lrs]

    def get_lr_factor(self, epoch):
        lr_factor = 0.5 * (1 + np.cos(np.pi * epoch / self.max_num_iters))
        if epoch <= self.warmup:
            lr_factor *= epoch * 1.0 / self.warmup
        return lr_factor


# --------------------------------------------------------------------------- the LightningModule, as a module


class ReversePredictor(nn.Module):
    def __init__(self, input_dim, model_dim, num_classes, num_heads, num_layers, lr, warmup, max_iters, dropout=0.0,
                 input_dropout=0.0, seq_first_pe=False):  # fmt: skip
        super().__init__()
        self.hparams = dict(input_dim=input_dim, model_dim=model_dim, num_classes=num_classes, num_heads=num_heads,
                            num_layers=num_layers, lr=lr, warmup=warmup, max_iters=max_iters, dropout=dropout,
                            input_dropout=input_dropout)  # fmt: skip
        self.input_net = nn.Sequential(nn.Dropout(input_dropout), nn.Linear(input_dim, model_dim))
        self.positional_encoding = PositionalEncoding(d_model=model_dim, seq_first_table=seq_first_pe)
        self.transformer = TransformerEncoder(num_layers=num_layers, input_dim=model_dim,
                                              dim_feedforward=2 * model_dim, num_heads=num_heads,
                                              dropout=dropout)  # fmt: skip
        self.output_net = nn.Sequential(
            nn.Linear(model_dim, model_dim),
            nn.LayerNorm(model_dim),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(model_dim, num_classes),
        )

    def forward(self, x, mask=None, add_positional_encoding=True):
        x = self.input_net(x)
        if add_positional_encoding:
            x = self.positional_encoding(x)
        x = self.transformer(x, mask=mask)
        x = self.output_net(x)
        return x

    def configure_optimizers(self):
        optimizer = optim.Adam(self.parameters(), lr=self.hparams["lr"])
        lr_scheduler = CosineWarmupScheduler(optimizer, warmup=self.hparams["warmup"],
                                             max_iters=self.hparams["max_iters"])  # fmt: skip
        return optimizer, lr_scheduler

    def _calculate_loss(self, batch):
        inp_data, labels = batch
        inp_data = F.one_hot(inp_data, num_classes=self.hparams["num_classes"]).float()
        preds = self.forward(inp_data, add_positional_encoding=True)
        loss = F.cross_entropy(preds.view(-1, preds.size(-1)), labels.view(-1))
        acc = (preds.argmax(dim=-1) == labels).float().mean()
        return loss, acc


class ReverseDataset(data.Dataset):
    def __init__(self, num_categories, seq_len, size):
        super().__init__()
        self.num_categories = num_categories
        self.seq_len = seq_len
        self.size = size
        self.data = torch.randint(self.num_categories, size=(self.size, self.seq_len))

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        inp_data = self.data[idx]
        labels = torch.flip(inp_data, dims=(0,))
        return inp_data, labels


def evaluate(model: ReversePredictor, loader: data.DataLoader) -> tuple[float, float]:
    """What ``trainer.validate``/``trainer.test`` report: the batch-size-weighted means of the
    logged loss and accuracy, the model in eval mode, no gradients."""
    model.eval()
    total_loss = total_acc = 0.0
    n = 0
    with torch.no_grad():
        for batch in loader:
            loss, acc = model._calculate_loss(batch)
            total_loss += loss.item() * len(batch[0])
            total_acc += acc.item() * len(batch[0])
            n += len(batch[0])
    model.train()
    return total_loss / n, total_acc / n


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(42 + seed)  # pl.seed_everything(42)
    np.random.seed(42 + seed)
    train_set = ReverseDataset(NUM_CATEGORIES, SEQ_LEN, N_TRAIN)
    val_set = ReverseDataset(NUM_CATEGORIES, SEQ_LEN, N_VAL)
    test_set = ReverseDataset(NUM_CATEGORIES, SEQ_LEN, N_TEST)
    train_loader = data.DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)
    val_loader = data.DataLoader(val_set, batch_size=BATCH_SIZE)
    test_loader = data.DataLoader(test_set, batch_size=BATCH_SIZE)

    model = ReversePredictor(max_iters=MAX_EPOCHS * len(train_loader), seq_first_pe=variant == "pe_on_batch_axis",
                             **HPARAMS)  # fmt: skip
    optimizer, lr_scheduler = model.configure_optimizers()
    per_step = variant != "scheduler_per_epoch"

    def loss_fn(preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(preds.view(-1, preds.size(-1)), labels.view(-1))

    def one_hot(tokens: torch.Tensor) -> torch.Tensor:
        return F.one_hot(tokens, num_classes=NUM_CATEGORIES).float()

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_inp, probe_labels = next(iter(train_loader))
    probe_batch = (one_hot(probe_inp), probe_labels)
    splits = (one_hot(train_set.data), torch.flip(train_set.data, dims=(1,)),
              one_hot(val_set.data), torch.flip(val_set.data, dims=(1,)))  # fmt: skip
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    model.train()
    val_loss = val_acc = float("nan")
    for _epoch in range(MAX_EPOCHS):
        for batch in train_loader:
            optimizer.zero_grad()
            loss, acc = model._calculate_loss(batch)  # training_step
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRADIENT_CLIP_VAL)
            optimizer.step()
            if per_step:  # 'interval': 'step'
                lr_scheduler.step()
            nx.timed(lambda: mon.log(loss, accuracy=acc))  # noqa: B023 - self.log("train_loss"/"train_acc")
        if not per_step:  # the bug: Lightning's default interval, once per epoch
            lr_scheduler.step()
        val_loss, val_acc = evaluate(model, val_loader)
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc))  # noqa: B023

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer, data=splits)

    test_loss, test_acc = evaluate(model, test_loader)
    final_val_loss, final_val_acc = evaluate(model, val_loader)
    return {"test_acc": 100.0 * test_acc, "test_loss": test_loss, "val_acc": 100.0 * final_val_acc,
            "val_loss": final_val_loss, "last_train_loss": loss.item(),
            "last_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
