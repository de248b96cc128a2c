"""Port of srviest/char-cnn-text-classification-pytorch: Zhang et al.'s character-level CNN.

Source: github.com/srviest/char-cnn-text-classification-pytorch, ``train.py``,
``model.py``, ``data_loader.py`` and ``alphabet.json`` at commit
f269894ad40ef4d716b76b24db20379f102cae37 (Apache-2.0). Written anew from the facts of
those files; no code copied.

Kept: ``AGNEWs``: each csv row's label (1-based) and its other fields joined by spaces,
lowercased; the alphabet read from ``alphabet.json`` and joined into one string (its 70
entries, the duplicated ``-`` included, so ``find`` never reaches the second one);
``oneHotEncode``: a ``(len(alphabet), l0)`` zero matrix, the text read *reversed*, the
row ``alphabet.find(char)`` set to 1 at each position, characters outside the alphabet
left as zero columns. ``CharCNN``: ``conv1`` Conv1d(num_features, 256, 7) + ReLU +
MaxPool1d(3, 3), ``conv2`` Conv1d(256, 256, 7) + ReLU + MaxPool1d(3, 3), ``conv3`` ..
``conv6`` Conv1d(256, 256, 3) + ReLU, ``conv6`` followed by MaxPool1d(3, 3), flatten,
``fc1``/``fc2`` Linear + ReLU + Dropout(0.5), ``fc3`` Linear to 4 classes,
``LogSoftmax``; PyTorch's default init. ``train``: ``optim.Adam(lr=args.lr)`` (the
default optimizer; ``dynamic_lr`` is off by default and never applies to Adam, so no
schedule), ``make_data_loader``: ``DataLoader(batch_size=32, drop_last=True,
shuffle=True)`` for both splits; per batch ``target.sub_(1)``, forward, ``F.nll_loss``,
``zero_grad``/``backward``, ``clip_grad_norm(params, max_norm=400)``, ``step``; the
batch accuracy as the progress line computes it (corrects / batch_size); ``eval`` after
every epoch: ``model.eval()``, the summed ``nll_loss`` over the dev set and its accuracy,
then ``model.train()``; the best dev accuracy kept (its checkpoint: a copy in memory, not
``torch.save``).
Shrunk: a generated 4-class corpus instead of AG News (see ``corpus``: each class has its
own character trigrams, about half of a text's words are built from them, the rest are
shared filler; capitals and punctuation; the training "csv" written class by class, as a
dump of a labelled corpus often is); 2,000 training and 800 dev texts instead of 120,000
/ 7,600; ``l0`` 177 characters instead of 1014 (the shortest that leaves conv6 a length
to pool: the flattened output is 3 x width instead of 34 x 256); conv width 32 instead of
256, fc width 128 instead of 1024; Adam lr 1e-3 instead of 1e-4 (62 batches an epoch
instead of 3,750); 6 epochs instead of 200; the one-hot encoding of a text computed once
and kept (the source recomputes the same tensor on every read); no ``val_interval``
evaluations inside an epoch, no checkpoint files, no result.csv, no ``print_f_score``.
Measure only (not in the program): the last epoch's dev accuracy as ``eval`` computes it.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(one-hot inputs, 0-based targets) with ``F.nll_loss`` and the optimizer;
``nndx.Monitor(model, optimizer, loss_fn=F.nll_loss)`` around the epochs, the loss called
as ``mon.loss_fn``, each batch's loss logged with its accuracy, each ``eval`` logged as
``split="val"`` with its accuracy; then ``nndx.probe(..., monitor=mon)`` on the first
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "char_cnn"
SOURCE = Source("srviest/char-cnn-text-classification-pytorch", "train.py",
                "f269894ad40ef4d716b76b24db20379f102cae37", "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: l0 177, width 32/128, 6 epochs)"),
        Variant(
            "lr_too_high",
            "--lr 0.05 for Adam instead of the shrunk default 1e-3 (the issue threads' users raising the LR "
            "of the 9-layer char-CNN): the ReLUs die / the model settles on one class",
            (C.LR_TOO_HIGH,),
            ("https://github.com/srviest/char-cnn-text-classification-pytorch/issues/5",
             "https://github.com/mhjabreel/CharCNN/issues/3",
             "https://github.com/mhjabreel/CharCNN/issues/9",
             "https://github.com/vietnh1009/Character-level-cnn-pytorch/issues/1"),
            Measure("dev_acc", "last dev accuracy at least 0.2 below the healthy run's: 0.25 (chance) against "
                    "0.99 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "unshuffled_class_sorted",
            "make_data_loader with shuffle=False on a csv written class by class: every batch holds one "
            "class and each epoch ends on the last class",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/facebookresearch/fastText/issues/74",
             "https://github.com/keras-team/keras/issues/6955",
             "https://github.com/xuyxu/Deep-Clustering-Network/issues/2"),
            Measure("dev_acc", "last dev accuracy at least 0.2 below the healthy run's: 0.24 (chance) against "
                    "0.99 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

ALPHABET = ("abcdefghijklmnopqrstuvwxyz0123456789-,;.!?:'\"\\/|_@#$%^&*~`+-=<>()[]{}\n")  # alphabet.json, joined
L0, WIDTH, FC, N_CLASSES = 177, 32, 128, 4
OWN_SHARE = 0.5
ARGS = {"lr": 1e-3, "epochs": 6, "batch_size": 32, "max_norm": 400, "dropout": 0.5}
N_TRAIN, N_DEV = 2000, 800
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# --------------------------------------------------------------------------- the data (the AG News csv stand-in)


def corpus(seed: int) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(train rows, dev rows) as the csv reader yields them: (label in 1..4, text). Each
    class has 6 syllables of its own (character trigrams) and 30 words made of them; a
    text is shared filler words with about half of its words from its class's
    vocabulary. The training csv is written class by class; the dev csv in random order."""
    rng = np.random.default_rng(seed)

    def word(lo: int, hi: int) -> str:
        return "".join(rng.choice(list(LETTERS), size=int(rng.integers(lo, hi + 1))))

    filler = [word(2, 7) for _ in range(300)]
    syllables = [[word(3, 3) for _ in range(6)] for _ in range(N_CLASSES)]
    own = [["".join(rng.choice(syl, size=int(rng.integers(1, 3)))) + word(0, 2) for _ in range(30)]
           for syl in syllables]  # fmt: skip

    def text(label: int) -> str:
        words = [own[label - 1][int(rng.integers(0, 30))] if rng.random() < OWN_SHARE
                 else filler[int(rng.integers(0, len(filler)))] for _ in range(40)]  # fmt: skip
        words = [w.capitalize() if rng.random() < 0.15 else w for w in words]
        out = words[0]
        for w in words[1:]:
            piece = (", " if rng.random() < 0.08 else " ") + w
            if len(out) + len(piece) + 1 > L0:
                break
            out += piece
        return out + "."

    per_class = N_TRAIN // N_CLASSES
    train = [(label, text(label)) for label in range(1, N_CLASSES + 1) for _ in range(per_class)]
    dev = [(int(label), text(int(label))) for label in rng.integers(1, N_CLASSES + 1, size=N_DEV)]
    return train, dev


class AGNEWs(Dataset):
    def __init__(self, rows: list[tuple[int, str]], l0: int = L0, lowercase: bool = True) -> None:
        self.alphabet, self.l0 = ALPHABET, l0
        self.label = [label for label, _ in rows]
        self.data = [txt.lower() if lowercase else txt for _, txt in rows]
        self.y = torch.LongTensor(self.label)
        self.cache: list[torch.Tensor | None] = [None] * len(self.label)

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, idx: int):
        if self.cache[idx] is None:  # encoded once (the source encodes on every read; same tensor)
            self.cache[idx] = self.oneHotEncode(idx)
        return self.cache[idx], self.y[idx]

    def oneHotEncode(self, idx: int) -> torch.Tensor:  # noqa: N802 - the source's name
        X = torch.zeros(len(self.alphabet), self.l0)  # noqa: N806
        index = [(self.char2Index(char), i) for i, char in enumerate(self.data[idx][::-1])]
        rows, cols = zip(*[(r, c) for r, c in index if r != -1]) if any(r != -1 for r, _ in index) else ((), ())
        X[list(rows), list(cols)] = 1.0
        return X

    def char2Index(self, character: str) -> int:  # noqa: N802
        return self.alphabet.find(character)


# --------------------------------------------------------------------------- model.py


class CharCNN(nn.Module):
    def __init__(self, num_features: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv1d(num_features, WIDTH, kernel_size=7, stride=1), nn.ReLU(),
                                   nn.MaxPool1d(kernel_size=3, stride=3))  # fmt: skip
        self.conv2 = nn.Sequential(nn.Conv1d(WIDTH, WIDTH, kernel_size=7, stride=1), nn.ReLU(),
                                   nn.MaxPool1d(kernel_size=3, stride=3))  # fmt: skip
        self.conv3 = nn.Sequential(nn.Conv1d(WIDTH, WIDTH, kernel_size=3, stride=1), nn.ReLU())
        self.conv4 = nn.Sequential(nn.Conv1d(WIDTH, WIDTH, kernel_size=3, stride=1), nn.ReLU())
        self.conv5 = nn.Sequential(nn.Conv1d(WIDTH, WIDTH, kernel_size=3, stride=1), nn.ReLU())
        self.conv6 = nn.Sequential(nn.Conv1d(WIDTH, WIDTH, kernel_size=3, stride=1), nn.ReLU(),
                                   nn.MaxPool1d(kernel_size=3, stride=3))  # fmt: skip
        self.fc1 = nn.Sequential(nn.Linear(3 * WIDTH, FC), nn.ReLU(), nn.Dropout(p=dropout))
        self.fc2 = nn.Sequential(nn.Linear(FC, FC), nn.ReLU(), nn.Dropout(p=dropout))
        self.fc3 = nn.Linear(FC, N_CLASSES)
        self.log_softmax = nn.LogSoftmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv3(self.conv2(self.conv1(x)))
        x = self.conv6(self.conv5(self.conv4(x)))
        x = x.view(x.size(0), -1)
        x = self.fc3(self.fc2(self.fc1(x)))
        return self.log_softmax(x)


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    if variant == "lr_too_high":
        args["lr"] = 0.05
    torch.manual_seed(seed)
    train_rows, dev_rows = corpus(seed)
    train_dataset, dev_dataset = AGNEWs(train_rows), AGNEWs(dev_rows)
    train_loader = DataLoader(train_dataset, batch_size=args["batch_size"], drop_last=True,
                              shuffle=variant != "unshuffled_class_sorted",
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    dev_loader = DataLoader(dev_dataset, batch_size=args["batch_size"], drop_last=True, shuffle=True,
                            generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip

    model = CharCNN(len(train_dataset.alphabet), args["dropout"])
    optimizer = optim.Adam(model.parameters(), lr=args["lr"])

    # the author's preflight: the first batch the loader would give, targets made 0-based
    first_x = torch.stack([train_dataset[i][0] for i in range(args["batch_size"])])
    first_y = torch.stack([train_dataset[i][1] for i in range(args["batch_size"])]) - 1
    probe_batch = (first_x, first_y)
    nx.preflight(model, probe_batch, F.nll_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=F.nll_loss)

    def evaluate() -> tuple[float, float]:
        model.eval()
        corrects, accumulated_loss, size = 0, 0.0, 0
        with torch.no_grad():
            for inputs, target in dev_loader:
                target = target.clone().sub_(1)
                size += len(target)
                logit = model(inputs)
                accumulated_loss += F.nll_loss(logit, target, reduction="sum").item()
                corrects += int((torch.max(logit, 1)[1].view(target.size()) == target).sum())
        model.train()
        return accumulated_loss / size, corrects / size

    model.train()
    best_acc, best_state = None, None
    val_loss = val_acc = train_loss = float("nan")
    for _epoch in range(1, args["epochs"] + 1):
        for inputs, target in train_loader:
            target.sub_(1)
            logit = model(inputs)
            loss = mon.loss_fn(logit, target)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args["max_norm"])
            optimizer.step()
            corrects = int((torch.max(logit, 1)[1].view(target.size()) == target).sum())
            accuracy = corrects / args["batch_size"]
            nx.timed(lambda: mon.log(loss, accuracy=accuracy))  # noqa: B023
            train_loss = loss.item()
        val_loss, val_acc = evaluate()
        nx.timed(lambda: mon.log(val_loss, split="val", accuracy=val_acc))  # noqa: B023
        if best_acc is None or val_acc > best_acc:
            best_acc, best_state = val_acc, copy.deepcopy(model.state_dict())

    nx.finish(mon, model, probe_batch, F.nll_loss, optimizer=optimizer)
    return {"dev_acc": val_acc, "dev_loss": val_loss, "best_dev_acc": best_acc, "train_loss": train_loss}
