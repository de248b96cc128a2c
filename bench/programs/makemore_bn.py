"""Port of makemore part 3 (Andrej Karpathy's "Neural Networks: Zero to Hero", lecture 4):
the character-level MLP language model with a hand-written BatchNorm, trained by a
hand-written SGD update (``p.data += -lr * p.grad``), no optimizer object.

Source: github.com/karpathy/nn-zero-to-hero, ``lectures/makemore/makemore_part3_bn.ipynb``
at commit 73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde (MIT, Copyright (c) 2022 Andrej
Karpathy). Written anew from the facts of that notebook; no code copied.

Kept: the notebook's summary program (the "SUMMARY + PYTORCHIFYING" cells): the vocabulary
('.' is index 0, the letters 1..), ``build_dataset`` (a context of ``block_size = 3``
previous characters, starting as three '.', the next character as the target, the
context cropped and appended), the words shuffled with ``random.seed(42)`` and split
80/10/10 into train/dev/test; the embedding table ``C = randn(vocab_size, n_embd)``; the
hand-written layers ``Linear`` (``randn(fan_in, fan_out) / fan_in**0.5``, ``x @ weight``,
no bias here), ``BatchNorm1d`` (batch mean and unbiased variance over dim 0 with
``keepdim``, ``(x - mean) / sqrt(var + eps)``, ``gamma``/``beta``, ``eps=1e-5``, running
mean/var updated with ``momentum=0.1`` under ``torch.no_grad()`` while training, used
when ``training`` is False) and ``Tanh``, each keeping its output in ``self.out``;
``n_embd = 10``, ``n_hidden = 100``: five ``Linear -> BatchNorm1d -> Tanh`` blocks, then
``Linear(n_hidden, vocab_size) -> BatchNorm1d(vocab_size)``; the last BatchNorm's gamma
scaled by 0.1 ("make less confident"), the other Linear weights by the gain 1.0; one
``torch.Generator`` seeded 2147483647 for the initialisation and for drawing the
minibatch indices; the loop: ``ix = randint(0, len(Xtr), (batch_size,))``,
``batch_size = 32``, forward, ``F.cross_entropy``, ``p.grad = None`` for every parameter,
``loss.backward()``, ``p.data += -lr * p.grad`` with ``lr = 0.1``, then ``0.01`` for
the last quarter of the steps (the notebook's 150,000 of 200,000), ``lossi`` of
log10 losses; after training every layer's ``training = False`` and ``split_loss`` on
the train and dev splits (one forward of the whole split under ``torch.no_grad()``).
The debugging lines the notebook marks "AFTER_DEBUG: would take out" (``retain_grad``
on the layer outputs, the ``break`` after 1,000 steps) are taken out, as it says, and
the plots and update-to-data ratios (``ud``) are not kept.
Shrunk: 4,000 made-up names (``bench.programs.data.names``: 2 to 4 syllables) instead of
``names.txt``'s 32,033; 4,000 steps instead of 200,000 (the lr decay after 3,000).
Changed for nndx to hook it (see below): the notebook's layer classes are written as
``torch.nn.Module`` subclasses (their ``__call__`` body becomes ``forward``; ``weight``,
``gamma``, ``beta`` and ``C`` are ``nn.Parameter``s, the running mean and variance
registered buffers) and gathered in one ``MLP`` module whose ``forward`` is the
notebook's forward pass (``emb = C[Xb]``, ``view``, the layers); the training loop
calls it. The parameter list, the manual update and the ``training`` flags are the
notebook's.
Healthy: ``split_loss('val')`` 2.12/2.12/2.11 on seeds 0-2 (train 2.09; the uniform
guess over the 20 tokens is 3.00).
Measure only (not in the program): nothing beyond the notebook's own printed numbers
(``split_loss('train')``, ``split_loss('val')``).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first minibatch
``(Xb, Yb)`` with ``F.cross_entropy`` (no optimizer: the update is by hand);
``nndx.Monitor(model, None)`` (its manual-loop mode) around the loop, each step's loss
logged; after the evaluation cell the dev loss logged as ``split="val"``, then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "makemore_bn"
SOURCE = Source("karpathy/nn-zero-to-hero", "lectures/makemore/makemore_part3_bn.ipynb",
                "73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's summary program as published (shrunk: 4,000 names, 4,000 steps)"),
        Variant(
            "grad_not_reset",
            "the 'for p in parameters: p.grad = None' lines left out of the hand-written loop: every backward "
            "adds to the gradients of all the steps before, and p.data += -lr * p.grad applies their sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/karpathy/micrograd/issues/78",
             "https://github.com/jcjohnson/pytorch-examples/issues/31",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/160"),
            Measure("val_loss", "split_loss('val') at least 0.3 nats above the healthy run's: 6.03/6.06/7.18 "
                    "against 2.12/2.12/2.11 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
        Variant(
            "batch_of_two",
            "batch_size = 2 instead of 32 with the hand-written BatchNorm1d kept: each unit is normalised by the "
            "mean and variance of two rows (+-1/sqrt(2) whatever the input), and a pair of (nearly) equal rows has "
            "a variance of (about) zero, so the gradient through 1/sqrt(var + eps) is multiplied by up to "
            "1/sqrt(1e-5) at every BatchNorm: the weights grow to ~1e13 while the loss looks normal, then overflow",
            (C.BATCH_TOO_SMALL,),
            ("https://github.com/karpathy/makemore/issues/22",
             "https://github.com/keras-team/keras/issues/8983",
             "https://github.com/microsoft/CNTK/issues/905"),
            Measure("val_loss", "split_loss('val') at least 0.3 nats above the healthy run's (or NaN): NaN on "
                    "seeds 0-2 (the training loss turns NaN at steps 128/187/188) against 2.12/2.12/2.11 healthy",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

N_WORDS = 4000
block_size = 3  # context length: how many characters do we take to predict the next one?
n_embd = 10  # the dimensionality of the character embedding vectors
n_hidden = 100  # the number of neurons in the hidden layer of the MLP
max_steps = 4000
decay_at = 3000  # the notebook's 150,000 of 200,000
batch_size = 32


# --------------------------------------------------------------------------- the notebook's layers


class Linear(nn.Module):
    def __init__(self, fan_in: int, fan_out: int, g: torch.Generator, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn((fan_in, fan_out), generator=g) / fan_in**0.5)
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
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            xmean = x.mean(0, keepdim=True)  # batch mean
            xvar = x.var(0, keepdim=True)  # batch variance
        else:
            xmean = self.running_mean
            xvar = self.running_var
        xhat = (x - xmean) / torch.sqrt(xvar + self.eps)  # normalize to unit variance
        self.out = self.gamma * xhat + self.beta
        if self.training:  # update the buffers
            with torch.no_grad():
                self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * xmean
                self.running_var = (1 - self.momentum) * self.running_var + self.momentum * xvar
        return self.out


class Tanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.out = torch.tanh(x)
        return self.out


class MLP(nn.Module):
    """The notebook's forward pass, gathered in one module for nndx to hook."""

    def __init__(self, vocab_size: int, g: torch.Generator) -> None:
        super().__init__()
        self.C = nn.Parameter(torch.randn((vocab_size, n_embd), generator=g))
        self.layers = nn.ModuleList([
            Linear(n_embd * block_size, n_hidden, g, bias=False), BatchNorm1d(n_hidden), Tanh(),
            Linear(n_hidden, n_hidden, g, bias=False), BatchNorm1d(n_hidden), Tanh(),
            Linear(n_hidden, n_hidden, g, bias=False), BatchNorm1d(n_hidden), Tanh(),
            Linear(n_hidden, n_hidden, g, bias=False), BatchNorm1d(n_hidden), Tanh(),
            Linear(n_hidden, n_hidden, g, bias=False), BatchNorm1d(n_hidden), Tanh(),
            Linear(n_hidden, vocab_size, g, bias=False), BatchNorm1d(vocab_size),
        ])  # fmt: skip

    def forward(self, Xb: torch.Tensor) -> torch.Tensor:
        emb = self.C[Xb]  # embed the characters into vectors
        x = emb.view(emb.shape[0], -1)  # concatenate the vectors
        for layer in self.layers:
            x = layer(x)
        return x


# --------------------------------------------------------------------------- the notebook


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    words = data.names(N_WORDS, seed=seed)  # stands in for names.txt

    # build the vocabulary of characters and mappings to/from integers
    chars = sorted(list(set("".join(words))))
    stoi = {s: i + 1 for i, s in enumerate(chars)}
    stoi["."] = 0
    itos = {i: s for s, i in stoi.items()}
    vocab_size = len(itos)

    def build_dataset(words: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        X, Y = [], []
        for w in words:
            context = [0] * block_size
            for ch in w + ".":
                ix = stoi[ch]
                X.append(context)
                Y.append(ix)
                context = context[1:] + [ix]  # crop and append
        return torch.tensor(X), torch.tensor(Y)

    random.seed(42 + seed)
    random.shuffle(words)
    n1 = int(0.8 * len(words))
    n2 = int(0.9 * len(words))
    Xtr, Ytr = build_dataset(words[:n1])  # 80%
    Xdev, Ydev = build_dataset(words[n1:n2])  # 10%

    g = torch.Generator().manual_seed(2147483647 + seed)  # for reproducibility
    model = MLP(vocab_size, g)
    layers = model.layers
    with torch.no_grad():
        layers[-1].gamma *= 0.1  # last layer: make less confident
        for layer in layers[:-1]:  # all other layers: apply gain
            if isinstance(layer, Linear):
                layer.weight *= 1.0  # 5/3
    parameters = [model.C] + [p for layer in layers for p in layer.parameters()]
    for p in parameters:
        p.requires_grad = True

    bs = 2 if variant == "batch_of_two" else batch_size
    ix = torch.randint(0, Xtr.shape[0], (bs,), generator=g)
    probe_batch = (Xtr[ix], Ytr[ix])
    nx.preflight(model, probe_batch, F.cross_entropy)
    mon = nx.monitor(model, None, every=10)  # no optimizer: the update is written by hand

    lossi = []
    for i in range(max_steps):
        # minibatch construct
        if i:
            ix = torch.randint(0, Xtr.shape[0], (bs,), generator=g)
        Xb, Yb = Xtr[ix], Ytr[ix]  # batch X,Y

        # forward pass
        x = model(Xb)
        loss = F.cross_entropy(x, Yb)  # loss function

        # backward pass
        if variant != "grad_not_reset":
            for p in parameters:
                p.grad = None
        loss.backward()

        # update
        lr = 0.1 if i < decay_at else 0.01  # step learning rate decay
        for p in parameters:
            p.data += -lr * p.grad

        # track stats
        lossi.append(loss.log10().item())
        mon.log(loss)

    @torch.no_grad()  # this decorator disables gradient tracking
    def split_loss(split: str) -> float:
        x, y = {"train": (Xtr, Ytr), "val": (Xdev, Ydev)}[split]
        logits = model(x)
        return F.cross_entropy(logits, y).item()

    # put layers into eval mode
    for layer in layers:
        layer.training = False
    train_loss = split_loss("train")
    val_loss = split_loss("val")
    mon.log(val_loss, split="val")

    nx.finish(mon, model, probe_batch, F.cross_entropy)
    return {"train_loss": train_loss, "val_loss": val_loss, "final_log10_loss": sum(lossi[-100:]) / 100}
