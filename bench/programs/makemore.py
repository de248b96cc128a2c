"""Port of makemore, the character-level name generator (its Bengio-style MLP model).

Source: github.com/karpathy/makemore, ``makemore.py`` at commit
988aa59e4d8fefa526d06f3b453ad116258398d4 (MIT, Copyright (c) 2022 Andrej Karpathy).
Written anew from the facts of that file; no code copied.

Kept (``--type mlp``): ``CharDataset`` (token 0 as start/stop, x = [0, word], y = [word,
0, -1 ...] with -1 masked by ``ignore_index``); the MLP model: an ``Embedding`` with one
extra <BLANK> token, the previous ``block_size`` characters gathered by
``torch.roll`` + blanking, concatenated into ``Linear`` -> ``nn.Tanh`` -> ``Linear``;
``forward(idx, targets)`` returning ``(logits, loss)`` with ``F.cross_entropy(...,
ignore_index=-1)``; AdamW(lr=5e-4, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8);
random batches drawn with replacement (``InfiniteDataLoader``); the loop's order
(forward, ``model.zero_grad(set_to_none=True)``, backward, step); ``evaluate`` under
``@torch.inference_mode`` and ``model.eval()``.
Shrunk: 2,000 generated names instead of ``names.txt``, n_embd 16 and n_embd2 64
instead of 64/64, batch 32, 1,500 steps, lr 2e-3 instead of 5e-4 (the original trains
for as long as it is left running; 1,500 steps at 5e-4 leave a healthy run far from
converged), evaluation every 500 steps.

nndx, as the author would add it: a preflight ``nndx.probe`` with the batch as
``((X, Y), Y)`` and the model's own loss (``lambda out, y: out[1]``), ``nndx.Monitor``
around the loop, the step's loss logged, the test loss as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "makemore"
SOURCE = Source("karpathy/makemore", "makemore.py", "988aa59e4d8fefa526d06f3b453ad116258398d4", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (--type mlp)"),
        Variant(
            "naive_init",
            "every weight drawn from N(0, 1) (torch.randn, as the makemore lecture's first MLP): the tanh layer "
            "saturates and the first logits are confidently wrong",
            (C.SATURATED_ACTIVATIONS, C.BAD_INIT),
            ("https://breno.bearblog.dev/the-weights-in-a-study-on-fixing-the-saturated-function",
             "https://aiml-notes.pages.dev/tutorials/18---Activations-and-Initialization-Deep-Dive",
             "https://clawdemy.org/lessons/build-nns-from-scratch/stabilize-training-activations-gradients-batchnorm/lesson/"),
            Measure("saturated_at_init",
                    "share of tanh outputs beyond 0.99 at initialisation, over 0.5 and 10x the healthy run's",
                    lambda healthy, buggy: buggy > max(0.5, 10 * healthy)),
        ),
    )
}


@dataclass
class ModelConfig:
    block_size: int
    vocab_size: int
    n_embd: int = 16
    n_embd2: int = 64


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.block_size = config.block_size
        self.vocab_size = config.vocab_size
        self.wte = nn.Embedding(config.vocab_size + 1, config.n_embd)  # +1: the <BLANK> token
        self.mlp = nn.Sequential(
            nn.Linear(self.block_size * config.n_embd, config.n_embd2),
            nn.Tanh(),
            nn.Linear(config.n_embd2, self.vocab_size),
        )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        embs = []
        for _ in range(self.block_size):
            embs.append(self.wte(idx))
            idx = torch.roll(idx, 1, 1)
            idx[:, 0] = self.vocab_size  # <BLANK> before the start
        logits = self.mlp(torch.cat(embs, -1))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


class CharDataset:
    def __init__(self, words: list[str], chars: list[str], max_word_length: int) -> None:
        self.words, self.max_word_length = words, max_word_length
        self.stoi = {ch: i + 1 for i, ch in enumerate(chars)}
        self.vocab_size = len(chars) + 1

    def encode(self, word: str) -> torch.Tensor:
        return torch.tensor([self.stoi[w] for w in word], dtype=torch.long)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (x, y) pair of ``__getitem__``, stacked."""
        xs, ys = [], []
        for word in self.words:
            ix = self.encode(word)
            x = torch.zeros(self.max_word_length + 1, dtype=torch.long)
            y = torch.zeros(self.max_word_length + 1, dtype=torch.long)
            x[1 : 1 + len(ix)] = ix
            y[: len(ix)] = ix
            y[len(ix) + 1 :] = -1  # masked in the loss
            xs.append(x)
            ys.append(y)
        return torch.stack(xs), torch.stack(ys)


def saturated_share(model: MLP, X: torch.Tensor) -> float:
    """Share of the tanh layer's outputs beyond 0.99 in magnitude (the lecture's plot)."""
    outputs = []
    handle = model.mlp[1].register_forward_hook(lambda _m, _i, out: outputs.append(out.detach()))
    try:
        with torch.no_grad():
            model(X)
    finally:
        handle.remove()
    return float((outputs[0].abs() > 0.99).float().mean())


def train(variant: str, nx: Nndx, seed: int = 0, max_steps: int = 1500, batch_size: int = 32) -> dict[str, float]:
    torch.manual_seed(3407 + seed)
    words = data.names(2000, seed=seed)
    chars = sorted(set("".join(words)))
    max_word_length = max(len(w) for w in words)
    perm = torch.randperm(len(words)).tolist()
    test_words = [words[i] for i in perm[-200:]]
    train_words = [words[i] for i in perm[:-200]]
    train_set = CharDataset(train_words, chars, max_word_length)
    test_set = CharDataset(test_words, chars, max_word_length)
    train_X, train_Y = train_set.tensors()
    test_X, test_Y = test_set.tensors()

    model = MLP(ModelConfig(block_size=max_word_length + 1, vocab_size=train_set.vocab_size))
    if variant == "naive_init":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p))
    saturated = saturated_share(model, train_X[:256])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)
    sampler = torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def evaluate(X: torch.Tensor, Y: torch.Tensor) -> float:
        model.eval()
        losses = [model(X[i : i + 100], Y[i : i + 100])[1].item() for i in range(0, len(X), 100)]
        model.train()
        return sum(losses) / len(losses)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(train_X), (batch_size,), generator=sampler)
        return train_X[ix], train_Y[ix]

    X, Y = next_batch()
    probe_batch = ((X, Y), Y)
    nx.preflight(model, probe_batch, lambda output, _targets: output[1], optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    first_loss = None
    for step in range(max_steps):
        if step:
            X, Y = next_batch()
        logits, loss = model(X, Y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mon.log(loss)
        first_loss = loss.item() if first_loss is None else first_loss
        if step > 0 and step % 500 == 0:
            mon.log(evaluate(test_X, test_Y), split="val")
    test_loss = evaluate(test_X, test_Y)
    mon.log(test_loss, split="val")

    nx.finish(mon, model, probe_batch, lambda output, _targets: output[1], optimizer=optimizer)
    return {"test_loss": test_loss, "first_loss": first_loss, "saturated_at_init": saturated}
