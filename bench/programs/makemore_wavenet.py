"""Port of makemore part 5 (Andrej Karpathy's "Neural Networks: Zero to Hero", lecture 6,
"Building a WaveNet"): the hierarchical character-level language model built from the
notebook's own ``Embedding``, ``FlattenConsecutive``, ``Linear``, ``BatchNorm1d``, ``Tanh``
and ``Sequential`` layers, trained by a hand-written SGD update with a step-down of the lr.

Source: github.com/karpathy/nn-zero-to-hero, ``lectures/makemore/makemore_part5_cnn1.ipynb``
at commit 73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde (MIT, Copyright (c) 2022 Andrej
Karpathy). Written anew from the facts of that notebook; no code copied.

Kept: the vocabulary ('.' is index 0, the sorted letters 1..); the words shuffled with
``random.seed(42)``; ``build_dataset`` with ``block_size = 8`` (the context starts as eight
'.', each character of ``w + '.'`` is a target, the context cropped and appended) and the
80/10/10 train/dev/test split; ``torch.manual_seed(42)``; the layers: ``Linear``
(``randn(fan_in, fan_out) / fan_in**0.5``, ``self.out = x @ weight`` then ``self.out +=
bias`` in place when there is a bias), ``BatchNorm1d`` (batch mean and unbiased variance
over dim 0 for 2-D input and over dims (0, 1) for 3-D input, ``keepdim``, ``eps=1e-5``,
``gamma``/``beta``, running mean/var with ``momentum=0.1`` rebuilt under ``torch.no_grad()``
while training, used when ``training`` is False), ``Tanh``, ``Embedding``
(``randn(num_embeddings, embedding_dim)``, indexed), ``FlattenConsecutive(n)``
(``view(B, T//n, C*n)``, squeezing a time axis of 1) and ``Sequential`` (each layer in
turn, ``parameters()`` the concatenation of the layers' lists), every layer keeping its
output in ``self.out``; the hierarchical network ``Embedding(vocab, n_embd)`` then three
``FlattenConsecutive(2) -> Linear(bias=False) -> BatchNorm1d -> Tanh`` blocks and
``Linear(n_hidden, vocab)``, its weight scaled by 0.1 under ``torch.no_grad()`` ("last
layer make less confident"); ``parameters = model.parameters()`` with ``requires_grad =
True`` set on each; the loop: ``ix = torch.randint(0, Xtr.shape[0], (batch_size,))``,
``batch_size = 32``, ``logits = model(Xb)``, ``F.cross_entropy``, ``p.grad = None`` for
every parameter, ``loss.backward()``, ``lr = 0.1`` then ``0.01`` for the last quarter of
the steps (the notebook's 150,000 of 200,000), ``p.data += -lr * p.grad``, a print every
so often and ``lossi`` of log10 losses; after training every layer's ``training = False``
and ``split_loss`` on train and val (one forward of the whole split under
``torch.no_grad()``, ``F.cross_entropy``).
Shrunk: 4,000 made-up names (``bench.programs.data.names``: 2 to 4 syllables, up to 12
letters) instead of ``names.txt``'s 32,033; ``n_embd = 16``, ``n_hidden = 64`` instead of 24
and 128; 3,000 steps instead of 200,000 (the lr step-down after 2,250); no plots, no sampling.
Changed for nndx to hook it (as in the makemore part 3 port): the notebook's layer classes
are ``torch.nn.Module`` subclasses (their ``__call__`` body becomes ``forward``;
``weight``, ``bias``, ``gamma``, ``beta`` are ``nn.Parameter``s, the running mean and var
plain tensor attributes rebound as in the notebook; ``Sequential`` holds its layers in an
``nn.ModuleList`` and still returns the parameter *list* the notebook iterates twice). The
parameter list, the hand-written update and the ``training`` flags are the notebook's.
Measure only (not in the program): the notebook's own ``split_loss('train')`` and
``split_loss('val')``; the uniform guess over the vocabulary is its ``log(vocab_size)``.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first minibatch
``(Xb, Yb)`` with ``F.cross_entropy`` (no optimizer: the update is written by hand);
``nndx.Monitor(model, None)`` around the loop, each step's loss logged where the notebook
appends to ``lossi``; after the evaluation cell the val loss logged as ``split="val"``,
then ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "makemore_wavenet"
SOURCE = Source("karpathy/nn-zero-to-hero", "lectures/makemore/makemore_part5_cnn1.ipynb",
                "73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's hierarchical (WaveNet-like) network as published (shrunk: 4,000 names, "
                           "3,000 steps, n_embd 16, n_hidden 64)"),
        Variant(
            "context_shifted_before_append",
            "build_dataset crops and appends the character to the context before appending the context to X "
            "(the two lines swapped): every input's last position is its own target, so inputs and targets are "
            "off by one and the model learns to copy; the loss falls far below the healthy run's and the model "
            "predicts nothing",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/ayaka14732/bart-base-jax/pull/6",
             "https://github.com/tamangmilan/llama3/pull/1",
             "https://github.com/songlab-cal/tape/issues/32"),
            Measure("val_loss", "split_loss('val') at least 0.5 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.5),
        ),
        Variant(
            "grad_not_reset",
            "the 'for p in parameters: p.grad = None' lines left out of the hand-written loop: every backward "
            "adds to the gradients of all the steps before, and p.data += -lr * p.grad applies their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/karpathy/micrograd/issues/78",
             "https://github.com/jcjohnson/pytorch-examples/issues/31",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("val_loss", "split_loss('val') at least 0.1 above the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
    )
}

BLOCK_SIZE, N_EMBD, N_HIDDEN, BATCH_SIZE = 8, 16, 64, 32
N_WORDS, MAX_STEPS, DECAY_AT, PRINT_EVERY = 4000, 3000, 2250, 500


# --------------------------------------------------------------------------- the notebook's layers


class Linear(nn.Module):
    def __init__(self, fan_in: int, fan_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn((fan_in, fan_out)) / fan_in**0.5)  # note: kaiming init
        self.bias = nn.Parameter(torch.zeros(fan_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.out = x @ self.weight
        if self.bias is not None:
            self.out += self.bias
        return self.out


class BatchNorm1d(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.training = True
        # parameters (trained with backprop)
        self.gamma = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        # buffers (trained with a running 'momentum update')
        self.running_mean = torch.zeros(dim)
        self.running_var = torch.ones(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            if x.ndim == 2:
                dim = 0
            elif x.ndim == 3:
                dim = (0, 1)
            xmean = x.mean(dim, keepdim=True)  # batch mean
            xvar = x.var(dim, keepdim=True)  # batch variance
        else:
            xmean = self.running_mean
            xvar = self.running_var
        xhat = (x - xmean) / torch.sqrt(xvar + self.eps)  # normalize to unit variance
        self.out = self.gamma * xhat + self.beta
        if self.training:
            with torch.no_grad():
                self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * xmean
                self.running_var = (1 - self.momentum) * self.running_var + self.momentum * xvar
        return self.out


class Tanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.out = torch.tanh(x)
        return self.out


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn((num_embeddings, embedding_dim)))

    def forward(self, IX: torch.Tensor) -> torch.Tensor:
        self.out = self.weight[IX]
        return self.out


class FlattenConsecutive(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        x = x.view(B, T // self.n, C * self.n)
        if x.shape[1] == 1:
            x = x.squeeze(1)
        self.out = x
        return self.out


class Sequential(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        self.out = x
        return self.out

    def parameters(self, recurse: bool = True):  # the notebook's: a list, iterated more than once
        return [p for layer in self.layers for p in layer.parameters()]


# --------------------------------------------------------------------------- the notebook


def build_dataset(words: list[str], stoi: dict[str, int], shifted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    X, Y = [], []
    for w in words:
        context = [0] * BLOCK_SIZE
        for ch in w + ".":
            ix = stoi[ch]
            if shifted:  # the bug: the context already holds the target
                context = context[1:] + [ix]
            X.append(context)
            Y.append(ix)
            if not shifted:
                context = context[1:] + [ix]  # crop and append
    return torch.tensor(X), torch.tensor(Y)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    words = data.names(N_WORDS, seed=0)
    chars = sorted(list(set("".join(words))))
    stoi = {s: i + 1 for i, s in enumerate(chars)}
    stoi["."] = 0
    vocab_size = len(stoi)

    random.seed(42 + seed)
    random.shuffle(words)
    n1, n2 = int(0.8 * len(words)), int(0.9 * len(words))
    shifted = variant == "context_shifted_before_append"
    Xtr, Ytr = build_dataset(words[:n1], stoi, shifted)
    Xdev, Ydev = build_dataset(words[n1:n2], stoi, shifted)

    torch.manual_seed(42 + seed)
    model = Sequential([
        Embedding(vocab_size, N_EMBD),
        FlattenConsecutive(2), Linear(N_EMBD * 2, N_HIDDEN, bias=False), BatchNorm1d(N_HIDDEN), Tanh(),
        FlattenConsecutive(2), Linear(N_HIDDEN * 2, N_HIDDEN, bias=False), BatchNorm1d(N_HIDDEN),
        Tanh(),
        FlattenConsecutive(2), Linear(N_HIDDEN * 2, N_HIDDEN, bias=False), BatchNorm1d(N_HIDDEN),
        Tanh(),
        Linear(N_HIDDEN, vocab_size),
    ])  # fmt: skip
    with torch.no_grad():
        model.layers[-1].weight *= 0.1  # last layer make less confident
    parameters = model.parameters()
    for p in parameters:
        p.requires_grad = True

    # the first minibatch, drawn without touching the training RNG
    probe_ix = torch.randint(0, Xtr.shape[0], (BATCH_SIZE,), generator=torch.Generator().manual_seed(seed))
    probe_batch = (Xtr[probe_ix], Ytr[probe_ix])
    nx.preflight(model, probe_batch, F.cross_entropy)
    mon = nx.monitor(model, None, every=10)  # no optimizer: the update is written by hand

    lossi = []
    for i in range(MAX_STEPS):
        # minibatch construct
        ix = torch.randint(0, Xtr.shape[0], (BATCH_SIZE,))
        Xb, Yb = Xtr[ix], Ytr[ix]
        # forward pass
        logits = model(Xb)
        loss = F.cross_entropy(logits, Yb)
        # backward pass
        if variant != "grad_not_reset":
            for p in parameters:
                p.grad = None
        loss.backward()
        # update: simple SGD
        lr = 0.1 if i < DECAY_AT else 0.01  # step learning rate decay
        for p in parameters:
            p.data += -lr * p.grad
        # track stats
        if i % PRINT_EVERY == 0:
            pass  # print(f'{i:7d}/{MAX_STEPS:7d}: {loss.item():.4f}')
        lossi.append(loss.log10().item())
        nx.timed(lambda: mon.log(loss))  # noqa: B023

    # put layers into eval mode (needed for batchnorm especially)
    for layer in model.layers:
        layer.training = False

    @torch.no_grad()
    def split_loss(split: str) -> float:
        x, y = {"train": (Xtr, Ytr), "val": (Xdev, Ydev)}[split]
        logits = model(x)
        return F.cross_entropy(logits, y).item()

    train_loss, val_loss = split_loss("train"), split_loss("val")
    nx.timed(lambda: mon.log(val_loss, split="val"))
    nx.finish(mon, model, probe_batch, F.cross_entropy)
    return {"train_loss": train_loss, "val_loss": val_loss, "final_log10_loss": sum(lossi[-100:]) / 100,
            "uniform_loss": math.log(vocab_size)}  # fmt: skip
