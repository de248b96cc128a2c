"""Port of rasbt/deeplearning-models ``rnn_lstm_packed_imdb.ipynb``: an LSTM sentiment classifier
over a word embedding, fed with ``pack_padded_sequence`` on batches sorted by length, its last
hidden state through one linear unit, ``binary_cross_entropy_with_logits``, Adam, and the
notebook's ``compute_binary_accuracy``.

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/rnn/rnn_lstm_packed_imdb.ipynb`` at
commit 18e046926551378cd691fd871dda0f21dcd272ab (MIT, Copyright (c) 2019-2022 Sebastian
Raschka). Written anew from the facts of that notebook; no code copied.

Kept: ``RNN(input_dim, embedding_dim, hidden_dim, output_dim)``: ``nn.Embedding`` ->
``pack_padded_sequence(embedded, text_length)`` (time-major ``[sentence len, batch]``, lengths
sorted descending, as ``BucketIterator(sort_within_batch=True)`` gives them) -> ``nn.LSTM``
(one layer, time-major) -> ``self.fc(hidden.squeeze(0)).view(-1)`` with ``OUTPUT_DIM = 1``;
``torch.manual_seed(RANDOM_SEED)`` before the model; ``torch.optim.Adam(model.parameters(),
lr=LEARNING_RATE)``; the loop per epoch: ``model.train()``, per batch ``logits = model(text,
text_lengths)``, ``cost = F.binary_cross_entropy_with_logits(logits, label)``,
``optimizer.zero_grad()`` (after the forward, as the notebook has it), ``cost.backward()``,
``optimizer.step()``; after each epoch ``compute_binary_accuracy`` on the train and the valid
loader (``model.eval()``, no grad, ``(torch.sigmoid(logits) > 0.5).long()`` against
``label.long()``, in percent); the test accuracy at the end. Labels float (``LabelField(dtype=
torch.float)``); the vocabulary's index 0 is ``<unk>`` and 1 is ``<pad>`` (padding value 1),
as torchtext builds it; the train set split 80/20 into train and valid.
Replaced: IMDB + spaCy + torchtext by synthetic reviews (``reviews`` below): a 400-word
vocabulary in which 40 words lean positive and 40 lean negative, each review 8-48 tokens long,
mostly neutral words with about one token in six drawn from its class's sentiment words (and a
few from the other class's), balanced labels; ``BucketIterator`` by a stand-in with its
behaviour: the train iterator shuffles, sorts pools of examples by length, cuts batches,
shuffles the batches and sorts each batch by length, descending (``sort_within_batch``); the
valid/test iterators sort the whole split by length, descending, without shuffling.
Shrunk: 2,000 train / 500 valid / 600 test reviews instead of 20,000 / 5,000 / 25,000;
vocabulary 400 instead of 20,002; ``EMBEDDING_DIM`` 32 and ``HIDDEN_DIM`` 64 instead of 128 and
256; ``BATCH_SIZE`` 64 instead of 128; 8 epochs instead of 15; ``LEARNING_RATE`` 1e-3 instead of
1e-4 (the notebook's 2,340 steps at 1e-4 become 256 here; at 1e-4 the shrunk run does not leave
chance); CPU; no ``predict_sentiment`` (it needs spaCy).
Measure only (not in the program): nothing; the variants are measured by the notebook's test
accuracy.

nndx, as the author would add it: the model takes ``(text, text_lengths)``, so the batch is
``((text, text_lengths), label)`` with ``F.binary_cross_entropy_with_logits`` as the loss; a
preflight ``nndx.probe`` on the first training batch with the optimizer; ``nndx.Monitor(model,
optimizer)`` around the epochs, every batch's cost logged; after training ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "raschka_lstm_packed"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/rnn/rnn_lstm_packed_imdb.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: synthetic reviews, 400 words, 8 epochs)"),
        Variant(
            "labels_not_sorted_with_text",
            "the train iterator's sort_within_batch reorders text and lengths by length, descending, for "
            "pack_padded_sequence but leaves the labels in the batch's order before the sort, so a review is "
            "trained on another review's label (the valid/test iterators, sorted as a whole, are unaffected)",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/pytorch/pytorch/issues/3584",
             "https://github.com/pytorch/pytorch/issues/2615",
             "https://github.com/pytorch/pytorch/issues/4927"),
            Measure("test_acc", "test accuracy at least 15 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
        Variant(
            "sigmoid_before_bce_with_logits",
            "forward returns torch.sigmoid(self.fc(...)).view(-1) while the loss is still "
            "F.binary_cross_entropy_with_logits and compute_binary_accuracy still applies torch.sigmoid: the loss "
            "sees sigmoid twice (outputs squeezed into [0.5, 0.73]) and every prediction is sigmoid(p) > 0.5",
            (C.WRONG_OUTPUT_ACTIVATION, C.DOUBLE_SOFTMAX),
            ("https://github.com/Lightning-AI/pytorch-lightning/issues/18272",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/yudi-mars/daisyRec/pull/15"),
            Measure("test_acc", "test accuracy at least 15 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 15.0),
        ),
    )
}

RANDOM_SEED = 123
VOCABULARY_SIZE = 400
LEARNING_RATE = 1e-3
BATCH_SIZE = 64
NUM_EPOCHS = 8
EMBEDDING_DIM = 32
HIDDEN_DIM = 64
OUTPUT_DIM = 1
UNK, PAD = 0, 1


# --------------------------------------------------------------------------- the data (IMDB's stand-in)


def reviews(n: int, seed: int) -> tuple[list[list[int]], list[float]]:
    """Token-id lists (ids 2..VOCABULARY_SIZE+1, as after ``build_vocab``) and 0/1 labels."""
    rng = np.random.default_rng(seed)
    first = 2
    positive = np.arange(first, first + 40)
    negative = np.arange(first + 40, first + 80)
    neutral = np.arange(first + 80, first + VOCABULARY_SIZE)
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(2))
        length = int(rng.integers(8, 49))
        own, other = (positive, negative) if label == 1 else (negative, positive)
        kind = rng.random(length)
        tokens = np.where(kind < 0.16, rng.choice(own, length),
                          np.where(kind < 0.20, rng.choice(other, length), rng.choice(neutral, length)))
        texts.append(tokens.tolist())
        labels.append(float(label))
    return texts, labels


class Batch:
    def __init__(self, text: torch.Tensor, lengths: torch.Tensor, label: torch.Tensor) -> None:
        self.text = (text, lengths)
        self.label = label


class BucketIterator:
    """torchtext's legacy ``BucketIterator`` with ``sort_within_batch=True``, as far as the notebook
    relies on it: time-major padded text (pad 1), lengths descending within each batch."""

    def __init__(self, texts, labels, batch_size: int, train: bool, sort_labels: bool = True) -> None:
        self.texts, self.labels, self.batch_size, self.train = texts, labels, batch_size, train
        self.sort_labels = sort_labels

    def __len__(self) -> int:
        return (len(self.texts) + self.batch_size - 1) // self.batch_size

    def _batches(self) -> list[list[int]]:
        n, b = len(self.texts), self.batch_size
        if not self.train:  # sort=True: the whole split by length, no shuffle
            order = sorted(range(n), key=lambda i: -len(self.texts[i]))
            return [order[i:i + b] for i in range(0, n, b)]
        perm = torch.randperm(n).tolist()
        pool = 100 * b
        batches = []
        for p in range(0, n, pool):  # bucket: sort each pool by length, then cut batches
            chunk = sorted(perm[p:p + pool], key=lambda i: len(self.texts[i]))
            batches += [chunk[i:i + b] for i in range(0, len(chunk), b)]
        return [batches[i] for i in torch.randperm(len(batches)).tolist()]

    def __iter__(self):
        for idx in self._batches():
            lengths = torch.tensor([len(self.texts[i]) for i in idx])
            text = torch.full((int(lengths.max()), len(idx)), PAD, dtype=torch.long)
            for j, i in enumerate(idx):
                text[: len(self.texts[i]), j] = torch.tensor(self.texts[i])
            label = torch.tensor([self.labels[i] for i in idx], dtype=torch.float)
            # sort_within_batch: descending lengths for pack_padded_sequence
            order = torch.argsort(lengths, descending=True, stable=True)
            text, lengths = text[:, order], lengths[order]
            if self.sort_labels:
                label = label[order]
            yield Batch(text, lengths, label)


# --------------------------------------------------------------------------- the model


class RNN(nn.Module):
    def __init__(self, input_dim: int, embedding_dim: int, hidden_dim: int, output_dim: int,
                 sigmoid_out: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.embedding = nn.Embedding(input_dim, embedding_dim)
        self.rnn = nn.LSTM(embedding_dim, hidden_dim)
        self.fc = nn.Linear(hidden_dim, output_dim)
        self.sigmoid_out = sigmoid_out

    def forward(self, text: torch.Tensor, text_length: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(text)
        packed = torch.nn.utils.rnn.pack_padded_sequence(embedded, text_length)
        packed_output, (hidden, cell) = self.rnn(packed)
        if self.sigmoid_out:
            return torch.sigmoid(self.fc(hidden.squeeze(0)).view(-1))
        return self.fc(hidden.squeeze(0)).view(-1)


def compute_binary_accuracy(model: nn.Module, data_loader, device) -> float:
    model.eval()
    correct_pred, num_examples = 0, 0
    with torch.no_grad():
        for batch_idx, batch_data in enumerate(data_loader):
            text, text_lengths = batch_data.text
            logits = model(text, text_lengths)
            predicted_labels = (torch.sigmoid(logits) > 0.5).long()
            num_examples += batch_data.label.size(0)
            correct_pred += (predicted_labels == batch_data.label.long()).sum()
        return float(correct_pred.float() / num_examples * 100)


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(RANDOM_SEED + seed)
    texts, labels = reviews(2500, seed=seed)
    test_texts, test_labels = reviews(600, seed=seed + 1000)
    split = int(0.8 * len(texts))
    train_loader = BucketIterator(texts[:split], labels[:split], BATCH_SIZE, train=True,
                                  sort_labels=variant != "labels_not_sorted_with_text")  # fmt: skip
    valid_loader = BucketIterator(texts[split:], labels[split:], BATCH_SIZE, train=False)
    test_loader = BucketIterator(test_texts, test_labels, BATCH_SIZE, train=False)
    device = torch.device("cpu")

    input_dim = VOCABULARY_SIZE + 2
    torch.manual_seed(RANDOM_SEED + seed)
    model = RNN(input_dim, EMBEDDING_DIM, HIDDEN_DIM, OUTPUT_DIM,
                sigmoid_out=variant == "sigmoid_before_bce_with_logits")  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first = next(iter(train_loader))
    probe_batch = (first.text, first.label)
    loss_fn = F.binary_cross_entropy_with_logits
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)

    mon = nx.monitor(model, optimizer)
    costs = []
    for epoch in range(NUM_EPOCHS):
        model.train()
        for batch_idx, batch_data in enumerate(train_loader):
            text, text_lengths = batch_data.text
            logits = model(text, text_lengths)
            cost = F.binary_cross_entropy_with_logits(logits, batch_data.label)
            optimizer.zero_grad()
            cost.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(cost))
            costs.append(cost.item())
        with torch.set_grad_enabled(False):
            train_acc = compute_binary_accuracy(model, train_loader, device)
            valid_acc = compute_binary_accuracy(model, valid_loader, device)
    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    test_acc = compute_binary_accuracy(model, test_loader, device)
    return {"test_acc": test_acc, "valid_acc": valid_acc, "train_acc": train_acc,
            "first_epoch_cost": float(np.mean(costs[:len(train_loader)])),
            "last_epoch_cost": float(np.mean(costs[-len(train_loader):]))}  # fmt: skip
