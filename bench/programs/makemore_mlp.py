"""Port of karpathy/nn-zero-to-hero's makemore part 2: the Bengio et al. (2003) MLP character-level
language model, trained with plain tensors and a hand-written SGD update.

Source: github.com/karpathy/nn-zero-to-hero, ``lectures/makemore/makemore_part2_mlp.ipynb`` at commit
73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde (MIT, Copyright (c) 2022 Andrej Karpathy). Written anew
from the facts of that notebook; no code copied.

Kept: the vocabulary (``chars = sorted(set(''.join(words)))``, ``stoi`` from 1, ``'.'`` = 0,
27 symbols); ``build_dataset`` (``block_size`` 3, a context of zeros rolled over each word + '.',
``X`` the contexts, ``Y`` the next character); ``random.seed(42)``, ``random.shuffle(words)`` and the
80/10/10 split into ``Xtr``/``Xdev``/``Xte``; ``g = torch.Generator().manual_seed(2147483647)``
and, in that order from ``g``, ``C = randn(27, 10)``, ``W1 = randn(30, 200)``, ``b1 = randn(200)``,
``W2 = randn(200, 27)``, ``b2 = randn(27)`` (unscaled: the notebook's init, which part 3 of the
course later fixes), ``requires_grad = True`` on each; the loop: a minibatch of 32 by
``torch.randint(0, Xtr.shape[0], (32,))``, ``emb = C[Xtr[ix]]``, ``h = tanh(emb.view(-1, 30) @ W1 +
b1)``, ``logits = h @ W2 + b2``, ``F.cross_entropy(logits, Ytr[ix])``, ``p.grad = None`` for every
parameter, ``loss.backward()``, ``lr = 0.1`` then ``0.01`` for the second half, ``p.data += -lr *
p.grad``, ``lossi.append(loss.log10().item())``; the evaluation of the whole train and dev splits
with the same forward and ``F.cross_entropy``.
Shrunk / replaced: names.txt (32,033 names) is replaced by 3,000 names generated here from a small
syllable grammar over all 26 letters (written for this port, deterministic by seed); 6,000 steps
instead of 200,000 with the step-down at 3,000 instead of 100,000; CPU; no plots, no sampling.
nndx needs an ``nn.Module``: the five tensors are the ``nn.Parameter`` s of a small module
(created from ``g`` in the notebook's order) whose ``forward`` is the notebook's forward, and the
loop calls it; ``parameters = [C, W1, b1, W2, b2]`` are those same tensors, updated by hand.
Measure only (not in the program): nothing beyond the notebook's own train/dev losses.

nndx, as the author would add it after reading the README: there is no optimizer, so
``nndx.Monitor(model)`` (optimizer None, ``every=10`` as in the README) around the loop, each
step's loss logged where the notebook appends to ``lossi``; a preflight ``nndx.probe`` on the
first minibatch with ``F.cross_entropy`` and ``data=(Xtr, Ytr, Xdev, Ydev)``; after training
``nndx.probe(..., monitor=mon)`` on the same minibatch and ``nndx.diagnose``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "makemore_mlp"
SOURCE = Source("karpathy/nn-zero-to-hero", "lectures/makemore/makemore_part2_mlp.ipynb",
                "73c3fcc741f0ec104ca850b1fb0df90e7e8d4cde", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 3,000 generated names, 6,000 steps)"),
        Variant(
            "grad_never_reset",
            "the 'for p in parameters: p.grad = None' reset before loss.backward() is left out: every "
            "backward adds to the gradients of all earlier steps, so each hand-written update applies the "
            "running sum of all past minibatch gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://x.com/karpathy/status/1013244313327681536",
             "https://www.youtube.com/watch?v=VMj-3S1tku0",
             "https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch"),
            Measure("dev_loss", "dev loss at least 0.3 nats above the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
        Variant(
            "view_for_transpose",
            "the hidden layer is written column-major, h = tanh(emb.view(30, -1).T @ W1 + b1), taking view(30, -1).T "
            "for the (32, 30) matrix of concatenated embeddings: view reads emb's memory in example-major order, so "
            "each row of the result mixes embedding values of many different examples of the batch",
            (C.WRONG_RESHAPE,),
            ("https://x.com/karpathy/status/1013244313327681536",
             "https://github.com/zhouhaoyi/Informer2020/issues/59",
             "https://github.com/vitrioil/Speech-Separation/issues/4",
             "https://github.com/fawazsammani/knowing-when-to-look-adaptive-attention/issues/6"),
            Measure("dev_loss", "dev loss at least 0.3 nats above the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

N_WORDS, BLOCK_SIZE, N_EMBD, N_HIDDEN, BATCH, STEPS, STEP_DOWN = 3000, 3, 10, 200, 32, 6000, 3000

# --------------------------------------------------------------------------- names.txt, replaced

_ONSETS = ("b", "br", "c", "ch", "d", "f", "g", "gr", "h", "j", "k", "kh", "l", "m", "n", "p", "ph", "qu", "r",
           "s", "sh", "st", "t", "th", "v", "w", "x", "y", "z", "")  # fmt: skip
_VOWELS = ("a", "a", "e", "e", "i", "o", "u", "y", "ai", "ee", "ia", "ie", "ou")
_CODAS = ("", "", "", "n", "l", "r", "s", "th", "x", "z", "ck", "m", "nn", "lle", "tte")
_ENDINGS = ("", "", "a", "ah", "y", "ie", "on", "en", "el", "ia", "o", "us", "ette", "lyn")


def make_names(n: int, seed: int) -> list[str]:
    """Names from a small syllable grammar: 1-3 syllables (onset, vowel, coda), an ending;
    lower case, 2-12 letters, every letter of the alphabet used (the vocabulary is 27)."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < n:
        syllables = rng.choices((1, 2, 3), weights=(3, 6, 2))[0]
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
        word += rng.choice(_ENDINGS)
        if 2 <= len(word) <= 12:
            names.append(word)
    assert len(set("".join(names))) == 26
    return names


# --------------------------------------------------------------------------- the notebook


class MLP(nn.Module):
    """The notebook's five tensors as the module's parameters (same generator, same order) and its
    forward pass, so nndx has a module to watch."""

    def __init__(self, g: torch.Generator, vocab: int, view_for_transpose: bool = False) -> None:
        super().__init__()
        self.view_for_transpose = view_for_transpose
        self.C = nn.Parameter(torch.randn((vocab, N_EMBD), generator=g))
        self.W1 = nn.Parameter(torch.randn((BLOCK_SIZE * N_EMBD, N_HIDDEN), generator=g))
        self.b1 = nn.Parameter(torch.randn(N_HIDDEN, generator=g))
        self.W2 = nn.Parameter(torch.randn((N_HIDDEN, vocab), generator=g))
        self.b2 = nn.Parameter(torch.randn(vocab, generator=g))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        emb = self.C[X]  # (32, 3, 10)
        if self.view_for_transpose:
            h = torch.tanh(emb.view(BLOCK_SIZE * N_EMBD, -1).T @ self.W1 + self.b1)  # (32, 200), rows mixed
        else:
            h = torch.tanh(emb.view(-1, BLOCK_SIZE * N_EMBD) @ self.W1 + self.b1)  # (32, 200)
        return h @ self.W2 + self.b2  # (32, 27)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    assert variant in VARIANTS
    words = make_names(N_WORDS, seed)

    chars = sorted(list(set("".join(words))))
    stoi = {s: i + 1 for i, s in enumerate(chars)}
    stoi["."] = 0
    vocab = len(stoi)

    def build_dataset(words: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        X, Y = [], []
        for w in words:
            context = [0] * BLOCK_SIZE
            for ch in w + ".":
                ix = stoi[ch]
                X.append(context)
                Y.append(ix)
                context = context[1:] + [ix]  # crop and append
        return torch.tensor(X), torch.tensor(Y)

    random.seed(42)
    random.shuffle(words)
    n1 = int(0.8 * len(words))
    n2 = int(0.9 * len(words))
    Xtr, Ytr = build_dataset(words[:n1])
    Xdev, Ydev = build_dataset(words[n1:n2])
    Xte, Yte = build_dataset(words[n2:])

    g = torch.Generator().manual_seed(2147483647 + seed)  # for reproducibility
    model = MLP(g, vocab, view_for_transpose=variant == "view_for_transpose")
    C_, W1, b1, W2, b2 = model.C, model.W1, model.b1, model.W2, model.b2
    parameters = [C_, W1, b1, W2, b2]
    for p in parameters:
        p.requires_grad = True

    torch.manual_seed(seed)
    with torch.random.fork_rng():  # the probe's minibatch leaves the loop's random stream alone
        ix0 = torch.randint(0, Xtr.shape[0], (BATCH,))
    probe_batch = (Xtr[ix0], Ytr[ix0])
    splits = (Xtr, Ytr, Xdev, Ydev)
    nx.preflight(model, probe_batch, F.cross_entropy, data=splits)
    mon = nx.monitor(model, None, every=10)

    lossi, stepi = [], []
    for i in range(STEPS):
        # minibatch construct
        ix = torch.randint(0, Xtr.shape[0], (BATCH,))

        # forward pass
        logits = model(Xtr[ix])  # (32, 27)
        loss = F.cross_entropy(logits, Ytr[ix])

        # backward pass
        if variant != "grad_never_reset":
            for p in parameters:
                p.grad = None
        loss.backward()

        # update
        lr = 0.1 if i < STEP_DOWN else 0.01
        for p in parameters:
            p.data += -lr * p.grad

        # track stats
        stepi.append(i)
        lossi.append(loss.log10().item())
        nx.timed(lambda: mon.log(loss))

    nx.finish(mon, model, probe_batch, F.cross_entropy, data=splits)

    with torch.no_grad():
        train_loss = F.cross_entropy(model(Xtr), Ytr).item()
        dev_loss = F.cross_entropy(model(Xdev), Ydev).item()
        test_loss = F.cross_entropy(model(Xte), Yte).item()
        dev_acc = (model(Xdev).argmax(1) == Ydev).float().mean().item()
    last = lossi[-100:]
    return {"train_loss": train_loss, "dev_loss": dev_loss, "test_loss": test_loss, "dev_acc": dev_acc,
            "last_100_log10_loss": sum(last) / len(last)}  # fmt: skip
