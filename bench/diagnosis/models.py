"""The model code of the families, written the way people write it, with each bug a
switch in the code (``spec.bugs``) rather than a patch applied from outside.

Every model has a final ``head`` layer (frozen-backbone variants freeze everything
else). Hidden activations are ``nn.Module`` layers or plain functions (``F.relu``)
depending on ``functional``, because nndx must see both the same way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .spec import Spec

ACTIVATIONS = {"relu": (nn.ReLU, F.relu), "tanh": (nn.Tanh, torch.tanh), "sigmoid": (nn.Sigmoid, torch.sigmoid),
               "gelu": (nn.GELU, F.gelu)}  # fmt: skip


class _ChainRuleForgotten(torch.autograd.Function):
    """A hand-written ReLU whose backward returns the mask instead of grad * mask."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return (x > 0).to(grad.dtype)  # should be grad * (x > 0)


class MyReLU(nn.Module):
    def forward(self, x):
        return _ChainRuleForgotten.apply(x)


def activation(spec: Spec, kind: str, functional: bool):
    """The hidden activation as a module (registered by the caller) or a plain function;
    None when the code forgot it."""
    if "no_activation" in spec.bugs:
        return None
    if "broken_backward" in spec.bugs:
        return MyReLU() if not functional else _ChainRuleForgotten.apply
    module, function = ACTIVATIONS[spec.act or kind]
    return function if functional else module()


def output_activation(spec: Spec, functional: bool):
    """What the code applies to the logits (None when correct)."""
    for bug, module, function in (("relu_out", nn.ReLU, F.relu), ("sigmoid_out", nn.Sigmoid, torch.sigmoid),
                                  ("softmax_out", lambda: nn.Softmax(dim=-1), lambda t: F.softmax(t, dim=-1))):  # fmt: skip
        if bug in spec.bugs:
            return function if functional else module()
    return None


def apply(fn, x):
    return x if fn is None else fn(x)


def standardize_in_forward(x: torch.Tensor, bugs: frozenset[str]) -> torch.Tensor:
    """Per-batch feature standardisation written in ``forward``: without eps a constant
    feature gives 0/0."""
    if "std_no_eps" in bugs:
        return (x - x.mean(0)) / x.std(0)
    if "std_eps" in bugs:
        return (x - x.mean(0)) / (x.std(0) + 1e-5)
    return x


class Head(nn.Module):
    """The shared end of every classifier/regressor body: detach/dropout bugs, the
    head layer, the logit scale and the output activation."""

    def __init__(self, spec: Spec, width: int, outputs: int, functional: bool) -> None:
        super().__init__()
        self.bugs, self.scale = spec.bugs, spec.logit_scale
        self.head = nn.Linear(width, outputs)
        self.out_act = output_activation(spec, functional)

    def forward(self, h):
        if "detach_body" in self.bugs:
            h = h.detach()  # "train only the head for now", left in
        if "dropout_always" in self.bugs:
            h = F.dropout(h, 0.5)  # F.dropout's training defaults to True: active in eval too
        out = self.head(h)
        if self.scale != 1.0:
            out = out * self.scale
        return apply(self.out_act, out)


class WithHead(nn.Module):
    """A model whose last layer is ``self.out.head``, reachable as ``model.head``."""

    @property
    def head(self) -> nn.Linear:
        return self.out.head


class MLP(WithHead):
    def __init__(self, spec: Spec, inputs: int, outputs: int, width: int, depth: int, kind: str, functional: bool,
                 dropout: float) -> None:  # fmt: skip
        super().__init__()
        self.bugs = spec.bugs
        self.hidden = nn.ModuleList(nn.Linear(inputs if i == 0 else width, width) for i in range(depth))
        self.act = activation(spec, kind, functional)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.out = Head(spec, width, outputs, functional)

    def forward(self, x):
        h = standardize_in_forward(x, self.bugs)
        for i, layer in enumerate(self.hidden):
            h = apply(self.act, layer(h))
            if i == 0 and "inplace" in self.bugs:
                h *= 2.0  # in place on the activation's saved output
            if self.drop is not None:
                h = self.drop(h)
        return self.out(h)


class SmallCNN(WithHead):
    """Conv-BN-ReLU-pool ×2, then a linear head (8×8 digits)."""

    def __init__(self, spec: Spec, width: int, functional: bool, dropout: float) -> None:
        super().__init__()
        self.bugs = spec.bugs
        self.conv1, self.bn1 = nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width)
        self.act = activation(spec, "relu", functional)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.out = Head(spec, 2 * width * 4, 10, functional)

    def forward(self, x):
        x = standardize_in_forward(x, self.bugs)
        h = apply(self.act, self.bn1(self.conv1(x)))
        if "inplace" in self.bugs:
            h *= 2.0
        h = self.pool(h)
        h = self.pool(apply(self.act, self.bn2(self.conv2(h))))
        h = torch.flatten(h, 1)
        if self.drop is not None:
            h = self.drop(h)
        return self.out(h)


class Block(nn.Module):
    def __init__(self, spec: Spec, cin: int, cout: int, stride: int, functional: bool) -> None:
        super().__init__()
        self.bugs = spec.bugs
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.act = activation(spec, "relu", functional)
        self.shortcut = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))  # fmt: skip

    def forward(self, x):
        identity = x if self.shortcut is None else self.shortcut(x)
        out = apply(self.act, self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if "inplace" in self.bugs:
            out = apply(self.act, out)
            out += identity  # the activation moved before the in-place residual add
            return out
        out += identity
        return apply(self.act, out)


class ResCNN(WithHead):
    def __init__(self, spec: Spec, width: int, functional: bool, dropout: float) -> None:
        super().__init__()
        self.bugs = spec.bugs
        self.stem, self.stem_bn = nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.act = activation(spec, "relu", functional)
        self.block = Block(spec, width, 2 * width, 2, functional)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.out = Head(spec, 2 * width, 10, functional)

    def forward(self, x):
        x = standardize_in_forward(x, self.bugs)
        h = apply(self.act, self.stem_bn(self.stem(x)))
        h = self.block(h)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        if self.drop is not None:
            h = self.drop(h)
        return self.out(h)


class SeqClassifier(WithHead):
    """LSTM over (batch, time, features) or token ids, the last step to an MLP head.

    ``batch_first`` bug: the LSTM is built time-major but fed batch-major tensors;
    ``time_major_view``: a time-major LSTM fed ``x.view(T, B, F)`` (``time_major`` is the
    correct ``x.transpose(0, 1)``). With ``stateful`` the state is an argument and a
    second output (carried across batches by the loop)."""

    def __init__(self, spec: Spec, inputs: int, width: int, classes: int, functional: bool, dropout: float,
                 vocab: int | None) -> None:  # fmt: skip
        super().__init__()
        self.bugs = spec.bugs
        self.stateful = spec.carry_state is not None
        self.embed = nn.Embedding(vocab, 16) if vocab else None
        self.time_major = bool({"batch_first", "time_major_view", "time_major"} & spec.bugs)
        self.rnn = nn.LSTM(16 if vocab else inputs, width, batch_first=not self.time_major)
        self.fc = nn.Linear(width, width)
        self.act = activation(spec, "relu", functional)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.out = Head(spec, width, classes, functional)

    def forward(self, x, state=None):
        if self.embed is not None:
            x = self.embed(x)
        else:
            x = standardize_in_forward(x, self.bugs)
        if "time_major_view" in self.bugs:
            x = x.view(x.shape[1], x.shape[0], x.shape[2])  # meant: x.transpose(0, 1)
        elif "time_major" in self.bugs:
            x = x.transpose(0, 1)
        seq, state = self.rnn(x, state)
        last = seq[:, -1] if ("batch_first" in self.bugs or not self.time_major) else seq[-1]
        h = apply(self.act, self.fc(last))
        if "inplace" in self.bugs:
            h *= 2.0
        if self.drop is not None:
            h = self.drop(h)
        out = self.out(h)
        return (out, state) if self.stateful else out


class SeqConv(WithHead):
    """A 1-D CNN over (batch, time, channels): two Conv1d layers with a hidden activation,
    max-pooled over time into the head — the temporal-convolution way to classify
    sequences (written after the rules of this benchmark were tuned: a fresh held-out)."""

    def __init__(self, spec: Spec, channels: int, width: int, classes: int, functional: bool, dropout: float) -> None:
        super().__init__()
        self.bugs = spec.bugs
        self.conv1 = nn.Conv1d(channels, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, padding=1)
        self.act = activation(spec, "relu", functional)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.out = Head(spec, width, classes, functional)

    def forward(self, x):
        x = standardize_in_forward(x, self.bugs).transpose(1, 2)  # (batch, channels, time)
        h = apply(self.act, self.conv1(x))
        if "inplace" in self.bugs:
            h *= 2.0
        h = apply(self.act, self.conv2(h))
        h = h.amax(dim=2)
        if self.drop is not None:
            h = self.drop(h)
        return self.out(h)


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: Spec, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.bugs, self.heads = spec.bugs, heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        if "heads_view" in self.bugs:  # meant: .view(B, T, nh, hs).transpose(1, 2)
            q, k, v = (t.reshape(B, self.heads, T, C // self.heads) for t in (q, k, v))
        else:
            q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = self.drop(att.masked_fill(~mask, float("-inf")).softmax(-1))
        y = att @ v
        y = y.reshape(B, T, C) if "heads_view" in self.bugs else y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class TransformerBlock(nn.Module):
    def __init__(self, spec: Spec, width: int, heads: int, dropout: float, functional: bool) -> None:
        super().__init__()
        self.bugs = spec.bugs
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(spec, width, heads, dropout)
        self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.act = activation(spec, "gelu", functional)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.proj(apply(self.act, self.fc(self.ln2(x)))))


class CharLM(WithHead):
    """A nanoGPT-like character model: token + position embeddings, pre-LN blocks with a
    hand-written causal attention, a linear head over the vocabulary."""

    def __init__(self, spec: Spec, vocab: int, block: int, width: int, layers: int, heads: int, dropout: float,
                 functional: bool) -> None:  # fmt: skip
        super().__init__()
        self.bugs = spec.bugs
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(TransformerBlock(spec, width, heads, dropout, functional) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.out = Head(spec, width, vocab, functional)

    def forward(self, idx):
        T = idx.shape[1]
        h = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device)))
        for block in self.blocks:
            h = block(h)
        return self.out(self.ln(h))


class VAE(nn.Module):
    """The PyTorch-examples VAE shape: 64 → h → (mu, logvar) → sample → h → 64 logits."""

    def __init__(self, spec: Spec, width: int, latent: int, functional: bool, dropout: float) -> None:
        super().__init__()
        self.bugs = spec.bugs
        self.fc1, self.mu, self.logvar = nn.Linear(64, width), nn.Linear(width, latent), nn.Linear(width, latent)
        self.fc2, self.head = nn.Linear(latent, width), nn.Linear(width, 64)
        self.act = activation(spec, "relu", functional)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.out_act = output_activation(spec, functional)

    def forward(self, x):
        h = apply(self.act, self.fc1(standardize_in_forward(x, self.bugs)))
        if "inplace" in self.bugs:
            h *= 2.0
        if "dropout_always" in self.bugs:
            h = F.dropout(h, 0.5)
        if self.drop is not None:
            h = self.drop(h)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        if "detach_body" in self.bugs:
            z = z.detach()
        out = self.head(apply(self.act, self.fc2(z)))
        return apply(self.out_act, out), mu, logvar
