"""Port of makemore part 4 (Andrej Karpathy's "Neural Networks: Zero to Hero", lecture 5,
"Becoming a Backprop Ninja"): the character-level MLP (embedding table ``C``, ``W1``/``b1``, a
BatchNorm written out by hand, tanh, ``W2``/``b2``, cross-entropy) trained with the notebook's
own hand-derived backward pass and a hand-written SGD update (exercise 4, "putting it all
together"), no ``loss.backward()`` in the loop.

Source: github.com/karpathy/nn-zero-to-hero, ``lectures/makemore/makemore_part4_backprop.ipynb``
at commit 73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde (MIT, Copyright (c) 2022 Andrej Karpathy).
Written anew from the facts of that notebook; no code copied.

Kept: the vocabulary ('.' is index 0, the sorted letters 1..); ``random.seed(42)`` and
``random.shuffle(words)``; ``build_dataset`` with ``block_size = 3`` (the context starts as three
'.', each character of ``w + '.'`` is a target, the context cropped and appended) and the
80/10/10 train/dev/test split; ``g = torch.Generator().manual_seed(2147483647)``; the
initialisation of exercise 4 in its order (``C`` from ``randn`` with ``g``; ``W1`` ``randn *
(5/3) / (n_embd * block_size)**0.5``; ``b1`` ``randn * 0.1``; ``W2`` and ``b2`` ``randn * 0.1``;
``bngain`` ``randn * 0.1 + 1`` and ``bnbias`` ``randn * 0.1`` from the global generator);
``parameters = [C, W1, b1, W2, b2, bngain, bnbias]`` with ``requires_grad = True``; the loop
under ``torch.no_grad()``: ``ix = torch.randint(0, Xtr.shape[0], (batch_size,), generator=g)``,
``batch_size = 32``, the forward (``emb = C[Xb]``, ``embcat = emb.view(emb.shape[0], -1)``,
``hprebn = embcat @ W1 + b1``, ``bnmean = hprebn.mean(0, keepdim=True)``, ``bnvar =
hprebn.var(0, keepdim=True, unbiased=True)``, ``bnvar_inv = (bnvar + 1e-5)**-0.5``, ``bnraw =
(hprebn - bnmean) * bnvar_inv``, ``hpreact = bngain * bnraw + bnbias``, ``h = tanh(hpreact)``,
``logits = h @ W2 + b2``, ``loss = F.cross_entropy(logits, Yb)``), ``p.grad = None`` for every
parameter, the manual backprop (``dlogits = softmax(logits) ; dlogits[range(n), Yb] -= 1 ;
dlogits /= n``; ``dh = dlogits @ W2.T``, ``dW2 = h.T @ dlogits``, ``db2 = dlogits.sum(0)``;
``dhpreact = (1.0 - h**2) * dh``; ``dbngain``, ``dbnbias`` and the one-line batchnorm backward
``dhprebn = bngain*bnvar_inv/n * (n*dhpreact - dhpreact.sum(0) - n/(n-1)*bnraw*(dhpreact*bnraw).sum(0))``;
``dembcat = dhprebn @ W1.T``, ``dW1 = embcat.T @ dhprebn``, ``db1 = dhprebn.sum(0)``;
``demb = dembcat.view(emb.shape)`` and ``dC`` filled by the double Python loop ``dC[ix] +=
demb[k, j]``), ``grads = [dC, dW1, db1, dW2, db2, dbngain, dbnbias]``; the update ``p.data +=
-lr * grad`` with ``lr = 0.1`` then ``0.01`` for the second half of the steps (the notebook's
100,000 of 200,000); ``lossi`` of log10 losses; after training the batchnorm calibration over
the whole training set (``bnmean``/``bnvar`` of ``embcat @ W1 + b1``) and ``split_loss`` on
train and val (one forward of the split under ``torch.no_grad()`` with the calibrated
statistics, ``F.cross_entropy``).
Shrunk: 3,000 made-up names (``bench.programs.data.names``: 2 to 4 syllables, up to 12
letters) instead of ``names.txt``'s 32,033; ``n_hidden = 64`` (the notebook's exercise-1 width)
instead of exercise 4's 200; 4,000 steps instead of 200,000 (the lr step-down after 2,000); no
plots, no sampling, no prints. ``seed`` is added to the notebook's generator seeds (seed 0 is
the notebook's).
Changed for nndx to hook it: the seven tensors live in one ``torch.nn.Module``
(``BackpropMLP``) as ``nn.Parameter`` s, its ``forward`` is the loop's forward pass (the
intermediates kept as attributes, as the notebook keeps them as variables, for the manual
backward to read) and returns the logits; the loop calls ``model(Xb)`` where the notebook
wrote the forward inline. ``parameters`` is still the notebook's list of the seven tensors.
Measure only (not in the program): ``grad_maxdiff``: after training, on the last batch, the
hand-written gradients against ``torch.autograd`` (the notebook's own ``cmp`` check, its cell
"useful for checking your gradients"), the largest absolute difference over the seven tensors
divided by the largest autograd gradient; and the train/val/test losses.

nndx, as the author would add it: a preflight ``nndx.probe(model, (Xb, Yb), F.cross_entropy)``
on the first minibatch (no optimizer: the update is written by hand); ``nndx.Monitor(model,
None, every=10)`` around the loop, each step's loss logged where the notebook appends to
``lossi``; after the calibration and ``split_loss``, the val loss logged as ``split="val"``,
then ``nndx.probe(..., monitor=mon)`` on the same first minibatch and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data as corpus
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "makemore_backprop_ninja"
SOURCE = Source("karpathy/nn-zero-to-hero", "lectures/makemore/makemore_part4_backprop.ipynb",
                "73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "exercise 4 as published (shrunk: 3,000 made-up names, n_hidden 64, 4,000 steps)"),
        Variant(
            "dC_row_index_add",
            "the embedding gradient's inner loop over the context is vectorised as dC[Xb[k]] += demb[k]: "
            "advanced-index += keeps one write per repeated index, so a context with a repeated character "
            "('...', '..e') adds only one of its rows' gradients to that character's embedding",
            (C.BROKEN_BACKWARD,),
            ("https://github.com/karpathy/nn-zero-to-hero/issues/57",
             "https://discuss.pytorch.org/t/indexing-with-repeating-indices-numpy-add-at/10223"),
            Measure("grad_maxdiff", "hand-written gradients differ from autograd's by over 1e-3 of the largest "
                    "gradient (the notebook's cmp check): 0.14 against below 1e-6 healthy on seed 0 (the val loss "
                    "barely moves: 2.1339 against 2.1337)",
                    lambda healthy, buggy: buggy > 1e-3 and buggy > 100 * healthy),
        ),
        Variant(
            "tanh_grad_on_preactivation",
            "the tanh backward is written dhpreact = (1.0 - hpreact**2) * dh: the derivative 1 - tanh(x)**2 "
            "evaluated with the pre-activation in place of the tanh output, negative wherever |hpreact| > 1",
            (C.BROKEN_BACKWARD,),
            ("https://discuss.pytorch.org/t/pytorch-autograd-not-matching-with-computed-derivatives/187917",
             "https://github.com/davidrmiller/neural2d/issues/40",
             "https://github.com/dennybritz/nn-from-scratch/pull/3"),
            Measure("val_loss", "val loss at least 0.05 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.05),
        ),
    )
}

N_WORDS, BLOCK_SIZE, N_EMBD, N_HIDDEN = 3000, 3, 10, 64
MAX_STEPS, DECAY_AT, BATCH_SIZE = 4000, 2000, 32


def build_dataset(words: list[str], stoi: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    X, Y = [], []
    for w in words:
        context = [0] * BLOCK_SIZE
        for ch in w + ".":
            ix = stoi[ch]
            X.append(context)
            Y.append(ix)
            context = context[1:] + [ix]
    return torch.tensor(X), torch.tensor(Y)


class BackpropMLP(nn.Module):
    """The notebook's seven tensors and its forward pass; intermediates kept for the manual backward."""

    def __init__(self, vocab_size: int, g: torch.Generator) -> None:
        super().__init__()
        self.C = nn.Parameter(torch.randn((vocab_size, N_EMBD), generator=g))
        # Layer 1
        self.W1 = nn.Parameter(torch.randn((N_EMBD * BLOCK_SIZE, N_HIDDEN), generator=g) * (5 / 3) / ((N_EMBD * BLOCK_SIZE) ** 0.5))
        self.b1 = nn.Parameter(torch.randn(N_HIDDEN, generator=g) * 0.1)
        # Layer 2
        self.W2 = nn.Parameter(torch.randn((N_HIDDEN, vocab_size), generator=g) * 0.1)
        self.b2 = nn.Parameter(torch.randn(vocab_size, generator=g) * 0.1)
        # BatchNorm parameters
        self.bngain = nn.Parameter(torch.randn((1, N_HIDDEN)) * 0.1 + 1.0)
        self.bnbias = nn.Parameter(torch.randn((1, N_HIDDEN)) * 0.1)

    def forward(self, Xb: torch.Tensor) -> torch.Tensor:
        self.emb = self.C[Xb]  # embed the characters into vectors
        self.embcat = self.emb.view(self.emb.shape[0], -1)  # concatenate the vectors
        # Linear layer
        self.hprebn = self.embcat @ self.W1 + self.b1  # hidden layer pre-activation
        # BatchNorm layer
        self.bnmean = self.hprebn.mean(0, keepdim=True)
        self.bnvar = self.hprebn.var(0, keepdim=True, unbiased=True)
        self.bnvar_inv = (self.bnvar + 1e-5) ** -0.5
        self.bnraw = (self.hprebn - self.bnmean) * self.bnvar_inv
        self.hpreact = self.bngain * self.bnraw + self.bnbias
        # Non-linearity
        self.h = torch.tanh(self.hpreact)  # hidden layer
        return self.h @ self.W2 + self.b2  # output layer


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    row_index_add = variant == "dC_row_index_add"
    tanh_on_pre = variant == "tanh_grad_on_preactivation"
    torch.manual_seed(seed)

    words = corpus.names(N_WORDS, seed=seed)
    chars = sorted(list(set("".join(words))))
    stoi = {s: i + 1 for i, s in enumerate(chars)}
    stoi["."] = 0
    vocab_size = len(stoi)

    random.seed(42)
    random.shuffle(words)
    n1, n2 = int(0.8 * len(words)), int(0.9 * len(words))
    Xtr, Ytr = build_dataset(words[:n1], stoi)
    Xdev, Ydev = build_dataset(words[n1:n2], stoi)
    Xte, Yte = build_dataset(words[n2:], stoi)

    g = torch.Generator().manual_seed(2147483647 + seed)
    model = BackpropMLP(vocab_size, g)
    C_, W1, b1, W2, b2, bngain, bnbias = (model.C, model.W1, model.b1, model.W2, model.b2, model.bngain,
                                          model.bnbias)  # fmt: skip
    parameters = [C_, W1, b1, W2, b2, bngain, bnbias]
    for p in parameters:
        p.requires_grad = True

    batch_size = BATCH_SIZE
    n = batch_size

    def backprop(Xb: torch.Tensor, Yb: torch.Tensor, logits: torch.Tensor) -> list[torch.Tensor]:
        emb, embcat, bnraw, bnvar_inv, hpreact, h = (model.emb, model.embcat, model.bnraw, model.bnvar_inv,
                                                     model.hpreact, model.h)  # fmt: skip
        dlogits = F.softmax(logits, 1)
        dlogits[range(n), Yb] -= 1
        dlogits /= n
        # 2nd layer backprop
        dh = dlogits @ W2.T
        dW2 = h.T @ dlogits
        db2 = dlogits.sum(0)
        # tanh
        dhpreact = (1.0 - hpreact**2) * dh if tanh_on_pre else (1.0 - h**2) * dh
        # batchnorm backprop
        dbngain = (bnraw * dhpreact).sum(0, keepdim=True)
        dbnbias = dhpreact.sum(0, keepdim=True)
        dhprebn = bngain * bnvar_inv / n * (n * dhpreact - dhpreact.sum(0) - n / (n - 1) * bnraw * (dhpreact * bnraw).sum(0))
        # 1st layer
        dembcat = dhprebn @ W1.T
        dW1 = embcat.T @ dhprebn
        db1 = dhprebn.sum(0)
        # embedding
        demb = dembcat.view(emb.shape)
        dC = torch.zeros_like(C_)
        for k in range(Xb.shape[0]):
            if row_index_add:
                dC[Xb[k]] += demb[k]
                continue
            for j in range(Xb.shape[1]):
                ix = Xb[k, j]
                dC[ix] += demb[k, j]
        return [dC, dW1, db1, dW2, db2, dbngain, dbnbias]

    # the first minibatch, drawn from a copy of g, for nndx's probes
    probe_ix = torch.randint(0, Xtr.shape[0], (batch_size,), generator=torch.Generator().set_state(g.get_state()))
    probe_batch = (Xtr[probe_ix], Ytr[probe_ix])
    nx.preflight(model, probe_batch, F.cross_entropy)
    mon = nx.monitor(model, None, every=10)  # no optimizer: the update is written by hand

    lossi = []
    with torch.no_grad():
        for i in range(MAX_STEPS):
            # minibatch construct
            ix = torch.randint(0, Xtr.shape[0], (batch_size,), generator=g)
            Xb, Yb = Xtr[ix], Ytr[ix]
            # forward pass
            logits = model(Xb)
            loss = F.cross_entropy(logits, Yb)
            # backward pass
            for p in parameters:
                p.grad = None
            grads = backprop(Xb, Yb, logits)
            # update
            lr = 0.1 if i < DECAY_AT else 0.01  # step learning rate decay
            for p, grad in zip(parameters, grads):
                p.data += -lr * grad
            # track stats
            lossi.append(loss.log10().item())
            nx.timed(lambda: mon.log(loss))  # noqa: B023

    # calibrate the batch norm at the end of training
    with torch.no_grad():
        emb = C_[Xtr]
        embcat = emb.view(emb.shape[0], -1)
        hpreact = embcat @ W1 + b1
        bnmean = hpreact.mean(0, keepdim=True)
        bnvar = hpreact.var(0, keepdim=True, unbiased=True)

    @torch.no_grad()
    def split_loss(split: str) -> float:
        x, y = {"train": (Xtr, Ytr), "val": (Xdev, Ydev), "test": (Xte, Yte)}[split]
        emb = C_[x]
        embcat = emb.view(emb.shape[0], -1)
        hpreact = embcat @ W1 + b1
        hpreact = bngain * (hpreact - bnmean) * (bnvar + 1e-5) ** -0.5 + bnbias
        h = torch.tanh(hpreact)
        logits = h @ W2 + b2
        return F.cross_entropy(logits, y).item()

    train_loss, val_loss, test_loss = split_loss("train"), split_loss("val"), split_loss("test")
    nx.timed(lambda: mon.log(val_loss, split="val"))
    nx.finish(mon, model, probe_batch, F.cross_entropy)

    # measure only: the notebook's gradient check on the last minibatch
    with torch.no_grad():
        hand = backprop(Xb, Yb, model(Xb))
    with torch.enable_grad():
        auto = torch.autograd.grad(F.cross_entropy(model(Xb), Yb), parameters)
    scale = max(a.abs().max().item() for a in auto)
    grad_maxdiff = max((h_ - a).abs().max().item() for h_, a in zip(hand, auto)) / scale

    last = sum(lossi[-200:]) / 200
    return {"val_loss": val_loss, "train_loss": train_loss, "test_loss": test_loss, "grad_maxdiff": grad_maxdiff,
            "last_log10_loss": last}  # fmt: skip
