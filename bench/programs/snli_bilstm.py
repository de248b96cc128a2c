"""Port of pytorch/examples ``snli``: a shared-embedding BiLSTM encoder + MLP classifier for NLI.

Source: github.com/pytorch/examples, ``snli/model.py``, ``snli/train.py`` and
``snli/util.py`` at commit 349c08e95acda442978e83400648afb3e3764036 (BSD-3-Clause,
Copyright (c) 2017 PyTorch contributors; the last commit before the example moved to
``legacy/snli``). Written anew from the facts of those files; no code copied.

Kept: ``Bottle``/``Linear`` (a Linear applied to a (seq, batch, features) tensor through a
view to 2-D and back); ``Encoder``: ``nn.LSTM(input_size=d_proj, hidden_size=d_hidden,
num_layers=1, dropout=0 (one layer), bidirectional=True)``, time-major input, zero
``(h0, c0)`` of shape ``(n_cells, batch, d_hidden)`` made with ``new_zeros``, the output
the last layer's two final states ``ht[-2:]`` transposed and flattened to ``(batch, 2 *
d_hidden)``; ``SNLIClassifier``: one ``nn.Embedding`` shared by premise and hypothesis,
the ``projection`` Linear + ReLU on both, the same encoder on both, ``out`` = three
[Linear(4 * d_hidden, 4 * d_hidden), the shared ReLU, the shared Dropout(dp_ratio)] then
Linear(4 * d_hidden, d_out) over ``cat([premise, hypothesis], 1)``. ``train.py``:
torchtext's ``Field`` vocabularies (inputs: ``<unk>`` 0, ``<pad>`` 1, then by frequency,
built over train, dev and test; answers: ``sequential=False``, built over train, so
``<unk>`` takes index 0 and ``d_out`` is 4), ``BucketIterator`` batches (shuffled, sorted
by premise then hypothesis length within a pool, padded with ``<pad>``, time-major);
``nn.CrossEntropyLoss``, ``Adam(lr=1e-3)``; per batch ``model.train(); opt.zero_grad()``,
forward, the running train accuracy ``n_correct / n_total``, loss, ``backward``,
``opt.step()``; every ``dev_every`` iterations ``model.eval()``, the dev set under
``torch.no_grad()``, ``dev_acc = 100 * n_dev_correct / len(dev)`` and ``dev_loss`` the
last dev batch's loss (as written), the best dev accuracy's snapshot kept (here a copy
in memory, not ``torch.save``). Defaults kept: ``dp_ratio`` 0.2, birnn, projection, one
layer.
Shrunk: generated premise/hypothesis pairs instead of SNLI (see ``pairs``: 16 content
words and "not"; an entailed hypothesis repeats premise words, a contradiction repeats
them with "not", a neutral one is mostly new words, with or without "not");
4,000 training, 1,000 dev and 1,000 test pairs; whitespace tokens instead of spaCy;
``d_embed`` 32 instead of 100, ``d_proj`` 32 instead of 300, ``d_hidden`` 48 instead of
300; batch 64 instead of 128; 8 epochs instead of 50; ``dev_every`` 31 instead of 1000
(twice an epoch); no GloVe (a download): run as ``--word_vectors '' --train_embed``, so
the embedding is randomly initialised and trained (with the default ``fix_emb`` it would be
a frozen random table); the model's ``forward`` takes the batch's two fields
(``premise``, ``hypothesis``) as arguments instead of the torchtext ``Batch``; no
snapshot files, no progress printing.
Measure only (not in the program): the last dev accuracy (as the program computes it,
in percent /100) and the test accuracy of the last model.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
as ``((premise, hypothesis), label)`` with ``criterion`` and the optimizer;
``nndx.Monitor(model, opt, loss_fn=criterion)`` around the epochs, the loss called as
``mon.loss_fn``, every batch's loss logged with the running train accuracy, each dev
evaluation logged as ``split="val"`` with its accuracy; then ``nndx.probe(...,
monitor=mon)`` on the first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import collections
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.optim as O  # noqa: N812 - the source's alias

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "snli_bilstm"
SOURCE = Source("pytorch/examples", "snli/train.py", "349c08e95acda442978e83400648afb3e3764036", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: d_embed/d_proj 32, d_hidden 48, 8 epochs)"),
        Variant(
            "view_not_transpose",
            "the batches are padded batch-first (pad_sequence(batch_first=True)) and turned time-major with "
            ".view(seq_len, batch) instead of .t(): each LSTM 'time step' mixes tokens of different sentences",
            (C.WRONG_RESHAPE,),
            ("https://github.com/Jingkang50/OpenPSG/issues/56",
             "https://github.com/TobiasLee/Chinese-Hip-pop-Generation/pull/8",
             "https://github.com/Cadene/vqa.pytorch/issues/40",
             "https://github.com/salesforce/cove/issues/10"),
            Measure("dev_acc", "last dev accuracy at least 0.1 below the healthy run's: 0.42 against 0.68 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
        Variant(
            "missing_zero_grad",
            "the line `model.train(); opt.zero_grad()` loses its zero_grad: every backward adds to the "
            "gradients of all batches before it",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/FreedomIntelligence/TextClassificationBenchmark/issues/20",
             "https://github.com/wenet-e2e/wekws/issues/72",
             "https://github.com/fchollet/deep-learning-with-python-notebooks/issues/293",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            Measure("dev_acc", "last dev accuracy at least 0.1 below the healthy run's: 0.45 (best 0.65, "
                    "unstable) against 0.68 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

CONFIG = {"epochs": 8, "batch_size": 64, "d_embed": 32, "d_proj": 32, "d_hidden": 48, "n_layers": 1, "lr": 1e-3,
          "dev_every": 31, "dp_ratio": 0.2, "birnn": True, "projection": True, "fix_emb": False}  # fmt: skip
N_TRAIN, N_DEV, N_TEST, N_WORDS = 4000, 1000, 1000, 16
LABELS = ("entailment", "contradiction", "neutral")


# --------------------------------------------------------------------------- the data (SNLI stand-in)


def pairs(n: int, rng: np.random.Generator) -> list[tuple[list[str], list[str], str]]:
    """(premise tokens, hypothesis tokens, label)."""
    words = [f"w{i:02d}" for i in range(N_WORDS)]
    out = []
    for _ in range(n):
        premise = list(rng.choice(words, size=int(rng.integers(5, 9)), replace=False))
        label = LABELS[int(rng.integers(0, 3))]
        k = int(rng.integers(2, 4))
        if label == "neutral":
            outside = [w for w in words if w not in premise]
            new = list(rng.choice(outside, size=k, replace=False))
            hyp = new + ([premise[int(rng.integers(0, len(premise)))]] if rng.random() < 0.5 else [])
            rng.shuffle(hyp)
            if rng.random() < 0.5:
                hyp.insert(int(rng.integers(0, len(hyp) + 1)), "not")
        else:
            idx = sorted(rng.choice(len(premise), size=k, replace=False))
            hyp = [premise[i] for i in idx]
            if label == "contradiction":
                hyp.insert(int(rng.integers(0, len(hyp) + 1)), "not")
        out.append(([str(w) for w in premise], [str(w) for w in hyp], label))
    return out


class Vocab:
    """torchtext's ``Vocab``: the specials first, then tokens by frequency (ties alphabetical)."""

    def __init__(self, sequences, specials: tuple[str, ...]) -> None:
        counts = collections.Counter(tok for seq in sequences for tok in seq)
        for s in specials:
            counts.pop(s, None)
        self.itos = list(specials) + [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)


def bucket_batches(examples: list[tuple[torch.Tensor, torch.Tensor, int]], batch_size: int, shuffle: bool,
                   rng: np.random.Generator, pad: int, batch_first_view: bool):  # fmt: skip
    """``BucketIterator``: shuffled pools of 100 batches, sorted within by (premise length,
    hypothesis length), cut into batches (shuffled), padded with ``pad``, time-major."""
    order = rng.permutation(len(examples)).tolist() if shuffle else list(range(len(examples)))
    batches = []
    pool = 100 * batch_size
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: (len(examples[i][0]), len(examples[i][1])))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    for idx in batches:
        premise = [examples[i][0] for i in idx]
        hypothesis = [examples[i][1] for i in idx]
        label = torch.tensor([examples[i][2] for i in idx])
        if batch_first_view:  # the bug: padded (batch, seq), then viewed as (seq, batch)
            p = nn.utils.rnn.pad_sequence(premise, batch_first=True, padding_value=pad)
            h = nn.utils.rnn.pad_sequence(hypothesis, batch_first=True, padding_value=pad)
            yield p.view(p.size(1), p.size(0)), h.view(h.size(1), h.size(0)), label
        else:
            yield (nn.utils.rnn.pad_sequence(premise, padding_value=pad),
                   nn.utils.rnn.pad_sequence(hypothesis, padding_value=pad), label)  # fmt: skip


# --------------------------------------------------------------------------- model.py


class Bottle(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        if len(input.size()) <= 2:
            return super().forward(input)
        size = input.size()[:2]
        out = super().forward(input.view(size[0] * size[1], -1))
        return out.view(size[0], size[1], -1)


class Linear(Bottle, nn.Linear):
    pass


class Encoder(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        input_size = config["d_proj"] if config["projection"] else config["d_embed"]
        dropout = 0 if config["n_layers"] == 1 else config["dp_ratio"]
        self.rnn = nn.LSTM(input_size=input_size, hidden_size=config["d_hidden"], num_layers=config["n_layers"],
                           dropout=dropout, bidirectional=config["birnn"])  # fmt: skip

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        batch_size = inputs.size()[1]
        state_shape = self.config["n_cells"], batch_size, self.config["d_hidden"]
        h0 = c0 = inputs.new_zeros(state_shape)
        outputs, (ht, ct) = self.rnn(inputs, (h0, c0))
        if not self.config["birnn"]:
            return ht[-1]
        return ht[-2:].transpose(0, 1).contiguous().view(batch_size, -1)


class SNLIClassifier(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config["n_embed"], config["d_embed"])
        self.projection = Linear(config["d_embed"], config["d_proj"])
        self.encoder = Encoder(config)
        self.dropout = nn.Dropout(p=config["dp_ratio"])
        self.relu = nn.ReLU()
        seq_in_size = 2 * config["d_hidden"]
        if config["birnn"]:
            seq_in_size *= 2
        lin_config = [seq_in_size] * 2
        self.out = nn.Sequential(
            Linear(*lin_config), self.relu, self.dropout,
            Linear(*lin_config), self.relu, self.dropout,
            Linear(*lin_config), self.relu, self.dropout,
            Linear(seq_in_size, config["d_out"]),
        )  # fmt: skip

    def forward(self, premise: torch.Tensor, hypothesis: torch.Tensor) -> torch.Tensor:
        prem_embed = self.embed(premise)
        hypo_embed = self.embed(hypothesis)
        if self.config["fix_emb"]:
            prem_embed, hypo_embed = prem_embed.detach(), hypo_embed.detach()
        if self.config["projection"]:
            prem_embed = self.relu(self.projection(prem_embed))
            hypo_embed = self.relu(self.projection(hypo_embed))
        premise_enc = self.encoder(prem_embed)
        hypothesis_enc = self.encoder(hypo_embed)
        return self.out(torch.cat([premise_enc, hypothesis_enc], 1))


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_raw, dev_raw, test_raw = pairs(N_TRAIN, rng), pairs(N_DEV, rng), pairs(N_TEST, rng)
    inputs = Vocab([seq for split in (train_raw, dev_raw, test_raw) for p, h, _ in split for seq in (p, h)],
                   ("<unk>", "<pad>"))  # fmt: skip
    answers = Vocab([[label] for _, _, label in train_raw], ("<unk>",))
    pad = inputs.stoi["<pad>"]

    def numericalize(split):
        return [(torch.tensor([inputs.stoi[t] for t in p]), torch.tensor([inputs.stoi[t] for t in h]),
                 answers.stoi[label]) for p, h, label in split]  # fmt: skip

    train_set, dev_set, test_set = numericalize(train_raw), numericalize(dev_raw), numericalize(test_raw)
    view_bug = variant == "view_not_transpose"
    batch_rng = np.random.default_rng(seed + 1)

    config = dict(CONFIG)
    config["n_embed"], config["d_out"] = len(inputs), len(answers)
    config["n_cells"] = config["n_layers"] * (2 if config["birnn"] else 1)
    model = SNLIClassifier(config)
    criterion = nn.CrossEntropyLoss()
    opt = O.Adam(model.parameters(), lr=config["lr"])

    first = next(bucket_batches(train_set[: config["batch_size"]], config["batch_size"], False, batch_rng, pad,
                                view_bug))  # fmt: skip
    probe_batch = ((first[0], first[1]), first[2])
    nx.preflight(model, probe_batch, criterion, optimizer=opt)
    mon = nx.monitor(model, opt, every=5, loss_fn=criterion)

    def accuracy(split) -> tuple[float, float]:
        model.eval()
        n_correct, loss = 0, float("nan")
        with torch.no_grad():
            for premise, hypothesis, label in bucket_batches(split, config["batch_size"], False, batch_rng, pad,
                                                             view_bug):  # fmt: skip
                answer = model(premise, hypothesis)
                n_correct += (torch.max(answer, 1)[1].view(label.size()) == label).sum().item()
                loss = criterion(answer, label).item()
        return n_correct / len(split), loss

    iterations, best_dev_acc, best = 0, -1.0, None
    dev_acc = dev_loss = train_acc = float("nan")
    for _epoch in range(config["epochs"]):
        n_correct, n_total = 0, 0
        for premise, hypothesis, label in bucket_batches(train_set, config["batch_size"], True, batch_rng, pad,
                                                         view_bug):  # fmt: skip
            model.train()
            if variant != "missing_zero_grad":
                opt.zero_grad()
            iterations += 1
            answer = model(premise, hypothesis)
            n_correct += (torch.max(answer, 1)[1].view(label.size()) == label).sum().item()
            n_total += label.size(0)
            train_acc = 100.0 * n_correct / n_total
            loss = mon.loss_fn(answer, label)
            loss.backward()
            opt.step()
            nx.timed(lambda: mon.log(loss, accuracy=train_acc / 100.0))  # noqa: B023
            if iterations % config["dev_every"] == 0:
                dev_acc, dev_loss = accuracy(dev_set)
                nx.timed(lambda: mon.log(dev_loss, split="val", accuracy=dev_acc))  # noqa: B023
                if dev_acc > best_dev_acc:
                    best_dev_acc, best = dev_acc, copy.deepcopy(model.state_dict())

    test_acc, _ = accuracy(test_set)
    nx.finish(mon, model, probe_batch, criterion, optimizer=opt)
    return {"dev_acc": dev_acc, "dev_loss": dev_loss, "best_dev_acc": best_dev_acc, "test_acc": test_acc,
            "train_acc": train_acc / 100.0}  # fmt: skip
