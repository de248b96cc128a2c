"""Port of karpathy/ng-video-lecture's ``bigram.py``: a character-level bigram language model (one
``nn.Embedding(vocab, vocab)`` whose rows are the next character's logits), trained by AdamW on
random windows of a text, its train/val loss estimated every ``eval_interval`` iterations.

Source: github.com/karpathy/ng-video-lecture, ``bigram.py`` at commit
52201428ed7b46804849dea0b3ccf0de9df1a5c3 (MIT, per the repository's README). Written anew from
the facts of that file; no code copied.

Kept: the hyperparameters' names and roles (``batch_size`` 32, ``block_size`` 8,
``learning_rate`` 1e-2, ``eval_interval``, ``eval_iters``); the character vocabulary
(``sorted(set(text))``, ``stoi``/``itos``, ``encode``/``decode``); the first 90% of the encoded
text as train, the rest as val; ``get_batch(split)``: ``torch.randint(len(data) - block_size,
(batch_size,))`` start indices, ``x`` the windows ``data[i:i+block_size]`` and ``y`` the windows
shifted by one, ``data[i+1:i+block_size+1]``; ``estimate_loss()`` under ``@torch.no_grad()``,
``model.eval()``, the mean of ``eval_iters`` batch losses per split, ``model.train()``;
``BigramLanguageModel``: ``token_embedding_table = nn.Embedding(vocab_size, vocab_size)``,
``forward(idx, targets=None)`` returns ``(logits, loss)``, and with targets reshapes
``logits.view(B*T, C)`` and ``targets.view(B*T)`` itself before ``F.cross_entropy``;
``generate`` (multinomial sampling from the last position's softmax); ``torch.manual_seed(1337)``;
``torch.optim.AdamW(model.parameters(), lr=learning_rate)``; the loop: every ``eval_interval``
iterations ``estimate_loss()``, then ``get_batch('train')``, ``logits, loss = model(xb, yb)``,
``optimizer.zero_grad(set_to_none=True)``, ``loss.backward()``, ``optimizer.step()``; a sample
generated at the end.
Shrunk / replaced: a 40,000-character synthetic text (sentences drawn from a small grammar of
names, verbs, objects and places, with punctuation and newlines: a 37-character vocabulary)
instead of tinyshakespeare (65 characters, 1.1M); ``max_iters`` 2,000 instead of 3,000,
``eval_interval`` 200 instead of 300, ``eval_iters`` 50 instead of 200; 200 characters
generated instead of 500; CPU.
Measure only (not in the program): ``true_val_loss``, the trained table's next-character
cross-entropy over every position of the val split, computed with the correct one-step shift
and reshape whatever the variant (the loss the program is meant to minimise); and the
best achievable bigram loss of the val split (counts from the train split) for reference.

nndx, as the author would add it: the model computes its own loss, so a preflight
``nndx.probe`` with the batch given as ``((xb, yb), yb)`` (the model is called on ``(idx,
targets)``) and the model's own loss (``lambda out, y: out[1]``) with the optimizer;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, each iteration's loss logged,
``estimate_loss``'s val loss logged as ``split="val"``; after the loop ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn
from torch.nn import functional as F

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "karpathy_bigram"
SOURCE = Source("karpathy/ng-video-lecture", "bigram.py", "52201428ed7b46804849dea0b3ccf0de9df1a5c3", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "bigram.py as published (shrunk: a 40k-character synthetic text, 2,000 iterations)"),
        Variant(
            "targets_not_shifted",
            "get_batch builds the targets as data[i:i+block_size], the same window as the inputs, instead of "
            "data[i+1:i+block_size+1]: every position is trained to predict the character it reads, so the loss "
            "falls towards zero while the model learns nothing about the next character",
            (C.LABELS_MISALIGNED, C.DATA_LEAKAGE),
            ("https://github.com/huggingface/transformers/issues/3711",
             "https://github.com/songlab-cal/tape/issues/32",
             "https://github.com/ymcui/Chinese-LLaMA-Alpaca/issues/324"),
            Measure("true_val_loss", "next-character val cross-entropy at least 0.5 nat above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "logits_view_bct",
            "the loss is taken as F.cross_entropy(logits.view(B, C, T), targets), reading 'cross_entropy wants "
            "(B, C, T)' as a view instead of a transpose: the memory of the (B, T, C) logits is reinterpreted, so "
            "each (position, class) score is paired with another position's character",
            (C.WRONG_RESHAPE,),
            ("https://github.com/voiler/IMPALA/issues/3",
             "https://github.com/markhliu/DGAI/issues/7",
             "https://github.com/karpathy/ng-video-lecture/pull/10"),
            Measure("true_val_loss", "next-character val cross-entropy at least 0.3 nat above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

# hyperparameters (bigram.py; shrunk where noted in the docstring)
batch_size = 32
block_size = 8
max_iters = 2000
eval_interval = 200
learning_rate = 1e-2
eval_iters = 50
N_CHARS = 40_000


# --------------------------------------------------------------------------- the synthetic corpus


def synthetic_text(n_chars: int, seed: int) -> str:
    """Sentences from a small grammar: 'anna sees the red boat by the river.' and the like."""
    rng = random.Random(seed)
    names = ["anna", "bruno", "clara", "dmitri", "elena", "farid", "greta", "hugo"]
    verbs = ["sees", "takes", "finds", "paints", "loves", "hides", "sells", "wants"]
    adjectives = ["red", "quiet", "old", "small", "bright", "wet", "heavy", "blue"]
    nouns = ["boat", "lamp", "horse", "key", "box", "window", "coat", "bell"]
    places = ["by the river", "in the yard", "at night", "near the gate", "on the hill"]
    out: list[str] = []
    size = 0
    while size < n_chars:
        words = [rng.choice(names), rng.choice(verbs), "the"]
        if rng.random() < 0.6:
            words.append(rng.choice(adjectives))
        words.append(rng.choice(nouns))
        if rng.random() < 0.5:
            words.append(rng.choice(places))
        sentence = " ".join(words)
        end = rng.choice([".", ".", ".", "!", "?"])
        if rng.random() < 0.15:
            sentence = sentence.capitalize()
        line = sentence + end + ("\n" if rng.random() < 0.3 else " ")
        out.append(line)
        size += len(line)
    return "".join(out)[:n_chars]


# --------------------------------------------------------------------------- bigram.py


class BigramLanguageModel(nn.Module):
    def __init__(self, vocab_size: int, loss_layout: str = "flat") -> None:
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, vocab_size)
        self.loss_layout = loss_layout

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.token_embedding_table(idx)  # (B,T,C)
        if targets is None:
            loss = None
        elif self.loss_layout == "view_bct":  # the bug: (B, C, T) by view, not by transpose
            B, T, C = logits.shape
            loss = F.cross_entropy(logits.view(B, C, T), targets)
        else:
            B, T, C = logits.shape
            logits = logits.view(B * T, C)
            targets = targets.view(B * T)
            loss = F.cross_entropy(logits, targets)
        return logits, loss

    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        for _ in range(max_new_tokens):
            logits, loss = self(idx)
            logits = logits[:, -1, :]
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1337 + seed)
    text = synthetic_text(N_CHARS, seed=seed)

    chars = sorted(list(set(text)))
    vocab_size = len(chars)
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    encode = lambda s: [stoi[c] for c in s]  # noqa: E731
    decode = lambda l: "".join([itos[i] for i in l])  # noqa: E731, E741

    data = torch.tensor(encode(text), dtype=torch.long)
    n = int(0.9 * len(data))
    train_data = data[:n]
    val_data = data[n:]
    shift = 0 if variant == "targets_not_shifted" else 1

    def get_batch(split: str):
        data = train_data if split == "train" else val_data
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([data[i : i + block_size] for i in ix])
        y = torch.stack([data[i + shift : i + block_size + shift] for i in ix])
        return x, y

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                logits, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    model = BigramLanguageModel(vocab_size, "view_bct" if variant == "logits_view_bct" else "flat")
    m = model
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        xp, yp = get_batch("train")
    probe_batch = ((xp, yp), yp)
    nx.preflight(model, probe_batch, lambda output, _targets: output[1], optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    losses = {"train": float("nan"), "val": float("nan")}
    for iter in range(max_iters):
        if iter % eval_interval == 0:
            losses = estimate_loss()
            nx.timed(lambda: mon.log(float(losses["val"]), split="val"))  # noqa: B023
        xb, yb = get_batch("train")
        logits, loss = model(xb, yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023

    nx.finish(mon, model, probe_batch, lambda output, _targets: output[1], optimizer=optimizer)

    context = torch.zeros((1, 1), dtype=torch.long)
    sample = decode(m.generate(context, max_new_tokens=200)[0].tolist())

    # measure only: the true next-character loss on the whole val split, and the bigram optimum
    with torch.no_grad():
        table = model.token_embedding_table.weight
        true_val = F.cross_entropy(table[val_data[:-1]], val_data[1:]).item()
        counts = torch.ones(vocab_size, vocab_size)  # add-one smoothing
        counts.index_put_((train_data[:-1], train_data[1:]), torch.ones(len(train_data) - 1), accumulate=True)
        logp = (counts / counts.sum(1, keepdim=True)).log()
        optimum = -logp[val_data[:-1], val_data[1:]].mean().item()
    words = sample.split()
    known = set(text.split())
    return {"true_val_loss": true_val, "bigram_optimum_val_loss": optimum, "train_loss": float(losses["train"]),
            "val_loss": float(losses["val"]), "vocab_size": float(vocab_size),
            "sample_known_word_fraction": sum(w in known for w in words) / max(len(words), 1),
            "uniform_loss": math.log(vocab_size)}  # fmt: skip
