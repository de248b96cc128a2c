"""Port of the PyTorch tutorial "Text classification with the torchtext library".

Source: github.com/pytorch/tutorials, ``beginner_source/text_sentiment_ngrams_tutorial.py``
at commit 5130967035247c8343376ee69f49d6e10d61eaca (BSD-3-Clause, Copyright (c) 2017-2022
Pytorch contributors). Written anew from the facts of that file; no code copied.

Kept: ``TextClassificationModel`` = ``nn.EmbeddingBag(vocab_size, embed_dim)`` (mode
"mean", no padding) + ``nn.Linear(embed_dim, num_class)``, weights uniform in +-0.5 and
the bias zero; ``forward(text, offsets)`` on one 1-D tensor of the batch's token ids
concatenated, with ``offsets`` the start of each text (``collate_batch``: ``[0]`` + the
lengths, the last dropped, ``cumsum``); ``label_pipeline`` = ``int(x) - 1`` (labels 1..4
stored); ``emsize = 64``, 4 classes, ``BATCH_SIZE = 64``; ``CrossEntropyLoss``,
``SGD(lr=5)``, ``clip_grad_norm_(model.parameters(), 0.1)`` before each step,
``StepLR(optimizer, 1.0, gamma=0.1)`` stepped only in an epoch whose validation accuracy
fell below the best so far; a 0.95 / 0.05 ``random_split`` of the training set into
train and valid, ``DataLoader(shuffle=True)`` on both; ``model.train()`` in ``train``,
``model.eval()`` + ``torch.no_grad()`` in ``evaluate``; test accuracy at the end.
Shrunk: a synthetic 4-class "news" corpus instead of AG_NEWS (no download): token ids
over a vocabulary of 3,000, each text 12-59 tokens long, most tokens drawn from one
Zipf background shared by all classes and 15% from its class's own 200 topical ids
(Dirichlet weights), so the classes overlap as news topics do; 4,000 training texts (stored
class by class, as corpora split into per-class files come) instead of 120,000, 760
test texts instead of 7,600; 10 epochs as in the original.

nndx, as the author would add it: the model is called as ``model(text, offsets)``, so the
probes get the first training batch as ``((text, offsets), label)`` (the README's tuple of
inputs); a preflight ``nndx.probe`` on it, ``nndx.Monitor(model, optimizer)`` around the
loop with the criterion called through ``mon.loss_fn``, each batch's loss logged and the
validation loss (``evaluate`` computes it and drops it; here it is averaged) logged with
the validation accuracy as ``split="val"``, then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``. No ``data=``: the inputs are variable-length token lists, not arrays.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "text_classification"
SOURCE = Source("pytorch/tutorials", "beginner_source/text_sentiment_ngrams_tutorial.py",
                "5130967035247c8343376ee69f49d6e10d61eaca", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (random_split, shuffled DataLoaders, StepLR stepped on a "
                "validation drop)"),
        Variant(
            "scheduler_per_batch",
            "scheduler.step() moved into the batch loop of train(): StepLR(1.0, gamma=0.1) divides the LR by 10 "
            "after every batch",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/ivadomed/ivadomed/pull/55", "https://github.com/pytorch/vision/issues/1261",
             "https://github.com/pytorch/pytorch/issues/3814"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.25/0.26/0.22 buggy "
                    "against 0.93/0.91/0.93 healthy on seeds 0-2 (the LR is 0.0 from the 4th batch on)",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
        Variant(
            "unshuffled_by_class",
            "the training DataLoader iterates the train split in the corpus's storage order (class by class) with "
            "shuffle=False, as the tutorial's first DataLoader over the raw iterator does: every batch holds one "
            "class, every epoch ends on the last class",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/PaddlePaddle/models/pull/589", "https://github.com/QData/TextAttack/issues/628"),
            Measure("test_accuracy", "test accuracy at least 0.2 below the healthy run's: 0.25/0.24/0.26 buggy "
                    "against 0.93/0.91/0.93 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.2),
        ),
    )
}

VOCAB_SIZE, NUM_CLASS, EMSIZE = 3000, 4, 64
TOPICAL, TOPICAL_SHARE = 200, 0.15
N_TRAIN, N_TEST = 4000, 760
EPOCHS, LR, BATCH_SIZE = 10, 5.0, 64


# --------------------------------------------------------------------------- data


def news_corpus(seed: int) -> tuple[list[tuple[int, list[int]]], list[tuple[int, list[int]]]]:
    """(train, test) as AG_NEWS yields them: (label in 1..4, token ids). The training set
    is stored class by class; the test set in random order."""
    rng = np.random.default_rng(seed)
    background = 1.0 / np.arange(1, VOCAB_SIZE)
    background /= background.sum()
    topics = [(rng.choice(np.arange(100, VOCAB_SIZE), size=TOPICAL, replace=False),
               rng.dirichlet(np.full(TOPICAL, 0.5))) for _ in range(NUM_CLASS)]  # fmt: skip

    def text(label: int) -> list[int]:
        length = int(rng.integers(12, 60))
        tokens = 1 + rng.choice(VOCAB_SIZE - 1, size=length, p=background)  # id 0 is "<unk>"
        topical = rng.random(length) < TOPICAL_SHARE
        words, weights = topics[label - 1]
        tokens[topical] = rng.choice(words, size=int(topical.sum()), p=weights)
        return tokens.tolist()

    per_class = N_TRAIN // NUM_CLASS
    train = [(label, text(label)) for label in range(1, NUM_CLASS + 1) for _ in range(per_class)]
    test = [(int(label), text(int(label))) for label in rng.integers(1, NUM_CLASS + 1, size=N_TEST)]
    return train, test


def label_pipeline(x: int) -> int:
    return int(x) - 1


def collate_batch(batch: list[tuple[int, list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    label_list, text_list, offsets = [], [], [0]
    for _label, _text in batch:
        label_list.append(label_pipeline(_label))
        processed_text = torch.tensor(_text, dtype=torch.int64)
        text_list.append(processed_text)
        offsets.append(processed_text.size(0))
    return (torch.tensor(label_list, dtype=torch.int64), torch.cat(text_list),
            torch.tensor(offsets[:-1]).cumsum(dim=0))  # fmt: skip


def batches(dataset: list, shuffle: bool, generator: torch.Generator):
    """``DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=..., collate_fn=collate_batch)``."""
    order = torch.randperm(len(dataset), generator=generator).tolist() if shuffle else range(len(dataset))
    order = list(order)
    for i in range(0, len(order), BATCH_SIZE):
        yield collate_batch([dataset[j] for j in order[i : i + BATCH_SIZE]])


# --------------------------------------------------------------------------- the model


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int, num_class: int) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=False)
        self.fc = nn.Linear(embed_dim, num_class)
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(text, offsets))


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train_dataset, test_dataset = news_corpus(seed)
    num_train = int(len(train_dataset) * 0.95)
    split = torch.randperm(len(train_dataset), generator=generator).tolist()  # random_split
    split_train_ = [train_dataset[i] for i in split[:num_train]]
    split_valid_ = [train_dataset[i] for i in split[num_train:]]
    shuffle_train = True
    if variant == "unshuffled_by_class":  # the storage order, not random_split's
        split_train_ = [train_dataset[i] for i in sorted(split[:num_train])]
        shuffle_train = False

    model = TextClassificationModel(VOCAB_SIZE, EMSIZE, NUM_CLASS)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.1)

    label, text, offsets = next(batches(split_train_, shuffle_train, torch.Generator().manual_seed(seed + 1)))
    probe_batch = ((text, offsets), label)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    def train_epoch() -> float:
        model.train()
        losses = []
        for label, text, offsets in batches(split_train_, shuffle_train, generator):
            optimizer.zero_grad()
            predicted_label = model(text, offsets)
            loss = mon.loss_fn(predicted_label, label)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
            if variant == "scheduler_per_batch":
                scheduler.step()
        return sum(losses) / len(losses)

    def evaluate(dataset: list) -> tuple[float, float]:
        model.eval()
        total_acc, total_count, total_loss, n_batches = 0, 0, 0.0, 0
        with torch.no_grad():
            for label, text, offsets in batches(dataset, True, generator):
                predicted_label = model(text, offsets)
                total_loss += criterion(predicted_label, label).item()
                n_batches += 1
                total_acc += (predicted_label.argmax(1) == label).sum().item()
                total_count += label.size(0)
        return total_acc / total_count, total_loss / n_batches

    total_accu = None
    epoch_losses = []
    for _epoch in range(1, EPOCHS + 1):
        epoch_losses.append(train_epoch())
        accu_val, loss_val = evaluate(split_valid_)
        mon.log(loss_val, split="val", accuracy=accu_val)
        if variant != "scheduler_per_batch":
            if total_accu is not None and total_accu > accu_val:
                scheduler.step()
            else:
                total_accu = accu_val
    accu_test, _ = evaluate(test_dataset)

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    return {
        "first_epoch_loss": epoch_losses[0],
        "final_train_loss": epoch_losses[-1],
        "valid_accuracy": accu_val,
        "test_accuracy": accu_test,
        "final_lr": optimizer.param_groups[0]["lr"],
    }
