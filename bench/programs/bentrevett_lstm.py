"""Port of bentrevett/pytorch-sentiment-analysis, the LSTM notebook: a bidirectional two-layer
LSTM over packed padded sequences classifies movie reviews as positive or negative.

Source: github.com/bentrevett/pytorch-sentiment-analysis, ``2 - Recurrent Neural Networks.ipynb``
(the current repository's LSTM notebook; there is no ``2_lstm.ipynb`` at this commit) at commit
329f654b2cfaed22fee432569ebd7a2674584f79 (MIT, Copyright (c) 2017 Ben Trevett). Written anew from
the facts of that notebook; no code copied.

Kept: tokens -> ``vocab`` built from the training split with ``min_freq`` and the specials
``["<unk>", "<pad>"]`` (``<unk>`` the default index), numericalised ids, ``length`` per example;
``train_test_split(test_size=0.25)`` of the train data into train/valid; ``get_collate_fn``
(``pad_sequence(..., padding_value=pad_index, batch_first=True)``, lengths and labels stacked)
and ``get_data_loader`` (train shuffled, valid/test not); the ``LSTM`` module (``nn.Embedding``
with ``padding_idx=pad_index``, ``nn.LSTM(n_layers, bidirectional, dropout, batch_first=True)``,
dropout on the embeddings, ``pack_padded_sequence(embedded, length, batch_first=True,
enforce_sorted=False)``, ``pad_packed_sequence`` of the output (unused, as in the notebook), the
final hidden states ``cat([hidden[-1], hidden[-2]])`` through dropout into ``nn.Linear``);
``initialize_weights`` (xavier-normal Linear, orthogonal LSTM weights, zero biases);
``nn.CrossEntropyLoss`` over ``output_dim = 2`` classes; ``optim.Adam(lr=5e-4)``;
``get_accuracy``; ``train`` (``model.train()``, forward, loss, accuracy, ``zero_grad``,
``backward``, ``step``) and ``evaluate`` (``model.eval()``, ``torch.no_grad()``); the epoch loop
that keeps the state with the best valid loss and evaluates it on the test set.
Replaced / shrunk: IMDB -> synthetic reviews: words ``w0..w59`` of which 15 are "positive" and
15 "negative"; each review has 6-40 words (uniform), the label is 1 when it holds more
positive than negative words (ties redrawn); 2,400 train (-> 1,800 train / 600 valid) and 600
test reviews; no tokenizer (the reviews are already word lists); ``max_length`` 256 kept (never
reached); no GloVe vectors (random init kept from ``initialize_weights`` + the embedding's own
init); ``embedding_dim`` 32 and ``hidden_dim`` 32 instead of 300/300; ``batch_size`` 64 instead
of 512; 10 epochs as in the notebook; ``min_freq`` 2 instead of 5; CPU; the best state kept in memory
instead of ``lstm.pt``; no plots, no ``predict_sentiment``.

nndx, as the author would add it (README): a preflight ``nndx.probe`` on the first training
batch ``((ids, length), label)`` with the ``CrossEntropyLoss`` and the Adam optimizer;
``nndx.Monitor(model, optimizer, every=10)`` around the epoch loop, each batch's loss logged in
``train``, each epoch's valid loss and accuracy logged with ``split="val"``; after training,
``nndx.probe(..., monitor=mon)`` on the same batch.
"""

from __future__ import annotations

import collections
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bentrevett_lstm"
SOURCE = Source(
    "bentrevett/pytorch-sentiment-analysis", "2 - Recurrent Neural Networks.ipynb",
    "329f654b2cfaed22fee432569ebd7a2674584f79", "MIT",
)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: synthetic reviews, 32-wide embeddings and LSTM)"),
        Variant(
            "sorted_ids_unsorted_labels",
            "the collate function sorts each batch's sequences by length (descending) so that "
            "pack_padded_sequence can run with enforce_sorted=True, but stacks the labels in the original order: "
            "every review is trained against another review's label",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/bentrevett/pytorch-sentiment-analysis/issues/37",
             "https://github.com/fartashf/vsepp/pull/36",
             "https://github.com/pytorch/pytorch/issues/3584"),
            Measure("test_acc", "test accuracy of the best-valid state at least 15 points below the healthy run's "
                    "(healthy 0.933 on seed 0)",
                    lambda healthy, buggy: buggy < healthy - 0.15),
        ),
        Variant(
            "evaluate_without_eval",
            "evaluate() does not call model.eval(): the embedding and hidden-state dropout (p=0.5) stays on while "
            "the valid and test sets are scored, so the kept checkpoint and the reported test numbers are those of "
            "a randomly thinned network",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://stackoverflow.com/questions/60018578/what-does-model-eval-do-in-pytorch",
             "https://discuss.pytorch.org/t/model-eval-vs-with-torch-no-grad/19615"),
            Measure("test_loss", "test loss of the best-valid state at least 1.3x the healthy run's: "
                    "0.418 against 0.248 healthy on seed 0 (test accuracy 0.803 against 0.933)",
                    lambda healthy, buggy: buggy > 1.3 * healthy),
        ),
    )
}

N_WORDS, N_SENTIMENT = 60, 15
N_TRAIN, N_TEST = 2400, 600
MIN_LEN, MAX_LEN = 6, 40


def make_reviews(n: int, rng: np.random.Generator) -> tuple[list[list[str]], list[int]]:
    """Reviews as word lists; label 1 when there are more positive than negative words."""
    texts, labels = [], []
    while len(texts) < n:
        length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        words = rng.integers(0, N_WORDS, size=length)
        pos = int(((words >= 0) & (words < N_SENTIMENT)).sum())
        neg = int(((words >= N_SENTIMENT) & (words < 2 * N_SENTIMENT)).sum())
        if pos == neg:
            continue
        texts.append([f"w{w}" for w in words])
        labels.append(int(pos > neg))
    return texts, labels


class LSTM(nn.Module):
    def __init__(self, vocab_size, embedding_dim, hidden_dim, output_dim, n_layers, bidirectional, dropout_rate,
                 pad_index):  # fmt: skip
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, n_layers, bidirectional=bidirectional, dropout=dropout_rate,
                            batch_first=True)  # fmt: skip
        self.fc = nn.Linear(hidden_dim * 2 if bidirectional else hidden_dim, output_dim)
        self.dropout = nn.Dropout(dropout_rate)
        self.enforce_sorted = False

    def forward(self, ids, length):
        embedded = self.dropout(self.embedding(ids))
        packed_embedded = nn.utils.rnn.pack_padded_sequence(embedded, length, batch_first=True,
                                                            enforce_sorted=self.enforce_sorted)
        packed_output, (hidden, cell) = self.lstm(packed_embedded)
        output, output_length = nn.utils.rnn.pad_packed_sequence(packed_output)
        if self.lstm.bidirectional:
            hidden = self.dropout(torch.cat([hidden[-1], hidden[-2]], dim=-1))
        else:
            hidden = self.dropout(hidden[-1])
        prediction = self.fc(hidden)
        return prediction


def initialize_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.xavier_normal_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LSTM):
        for name, param in m.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            elif "weight" in name:
                nn.init.orthogonal_(param)


def get_accuracy(prediction, label):
    batch_size, _ = prediction.shape
    predicted_classes = prediction.argmax(dim=-1)
    correct_predictions = predicted_classes.eq(label).sum()
    accuracy = correct_predictions / batch_size
    return accuracy


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    sort_in_collate = variant == "sorted_ids_unsorted_labels"
    no_eval = variant == "evaluate_without_eval"

    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)

    # datasets.load_dataset("imdb") + tokenize_example (max_length 256)
    max_length = 256
    tr_texts, tr_labels = make_reviews(N_TRAIN, rng)
    te_texts, te_labels = make_reviews(N_TEST, rng)
    train_all = [{"tokens": t[:max_length], "length": len(t[:max_length]), "label": y}
                 for t, y in zip(tr_texts, tr_labels)]  # fmt: skip
    test_data = [{"tokens": t[:max_length], "length": len(t[:max_length]), "label": y}
                 for t, y in zip(te_texts, te_labels)]  # fmt: skip

    # train_test_split(test_size=0.25) (shuffled)
    test_size = 0.25
    perm = rng.permutation(len(train_all))
    n_valid = int(round(test_size * len(train_all)))
    valid_data = [train_all[i] for i in perm[:n_valid]]
    train_data = [train_all[i] for i in perm[n_valid:]]

    # build_vocab_from_iterator(min_freq, specials=["<unk>", "<pad>"]), default index <unk>
    min_freq = 2
    special_tokens = ["<unk>", "<pad>"]
    counts = collections.Counter(tok for ex in train_data for tok in ex["tokens"])
    itos = list(special_tokens) + sorted((t for t, c in counts.items() if c >= min_freq),
                                         key=lambda t: (-counts[t], t))  # fmt: skip
    stoi = {t: i for i, t in enumerate(itos)}
    unk_index, pad_index = stoi["<unk>"], stoi["<pad>"]

    def numericalize_example(example):
        ids = [stoi.get(t, unk_index) for t in example["tokens"]]
        return {"ids": torch.tensor(ids, dtype=torch.long), "length": torch.tensor(example["length"]),
                "label": torch.tensor(example["label"])}  # fmt: skip

    train_data = [numericalize_example(e) for e in train_data]
    valid_data = [numericalize_example(e) for e in valid_data]
    test_data = [numericalize_example(e) for e in test_data]

    def get_collate_fn(pad_index):
        def collate_fn(batch):
            batch_ids = [i["ids"] for i in batch]
            if sort_in_collate:  # the bug: ids (and lengths) sorted for packing, labels left as they were
                batch_ids = sorted(batch_ids, key=len, reverse=True)
            batch_ids = nn.utils.rnn.pad_sequence(batch_ids, padding_value=pad_index, batch_first=True)
            if sort_in_collate:
                batch_length = torch.stack(sorted([i["length"] for i in batch], reverse=True))
            else:
                batch_length = torch.stack([i["length"] for i in batch])
            batch_label = torch.stack([i["label"] for i in batch])
            return {"ids": batch_ids, "length": batch_length, "label": batch_label}

        return collate_fn

    def get_data_loader(dataset, batch_size, pad_index, shuffle=False):
        collate_fn = get_collate_fn(pad_index)
        return torch.utils.data.DataLoader(dataset=dataset, batch_size=batch_size, collate_fn=collate_fn,
                                           shuffle=shuffle)  # fmt: skip

    batch_size = 64
    train_data_loader = get_data_loader(train_data, batch_size, pad_index, shuffle=True)
    valid_data_loader = get_data_loader(valid_data, batch_size, pad_index)
    test_data_loader = get_data_loader(test_data, batch_size, pad_index)

    vocab_size = len(itos)
    embedding_dim = 32
    hidden_dim = 32
    output_dim = len(set(e["label"].item() for e in train_data))
    n_layers = 2
    bidirectional = True
    dropout_rate = 0.5
    model = LSTM(vocab_size, embedding_dim, hidden_dim, output_dim, n_layers, bidirectional, dropout_rate, pad_index)
    model.enforce_sorted = sort_in_collate
    model.apply(initialize_weights)

    lr = 5e-4
    optimizer = optim.Adam(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe = next(iter(train_data_loader))
    probe_batch = ((probe["ids"], probe["length"]), probe["label"])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def train_epoch(dataloader, model, criterion, optimizer):
        model.train()
        epoch_losses, epoch_accs = [], []
        for batch in dataloader:
            ids = batch["ids"]
            length = batch["length"]
            label = batch["label"]
            prediction = model(ids, length)
            loss = criterion(prediction, label)
            accuracy = get_accuracy(prediction, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            epoch_losses.append(loss.item())
            epoch_accs.append(accuracy.item())
        return np.mean(epoch_losses), np.mean(epoch_accs)

    def evaluate(dataloader, model, criterion):
        if not no_eval:
            model.eval()
        epoch_losses, epoch_accs = [], []
        with torch.no_grad():
            for batch in dataloader:
                prediction = model(batch["ids"], batch["length"])
                loss = criterion(prediction, batch["label"])
                accuracy = get_accuracy(prediction, batch["label"])
                epoch_losses.append(loss.item())
                epoch_accs.append(accuracy.item())
        return np.mean(epoch_losses), np.mean(epoch_accs)

    n_epochs = 10
    best_valid_loss = float("inf")
    best_state = copy.deepcopy(model.state_dict())
    metrics = collections.defaultdict(list)
    for _epoch in range(n_epochs):
        train_loss, train_acc = train_epoch(train_data_loader, model, criterion, optimizer)
        valid_loss, valid_acc = evaluate(valid_data_loader, model, criterion)
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_acc))
        metrics["train_losses"].append(train_loss)
        metrics["train_accs"].append(train_acc)
        metrics["valid_losses"].append(valid_loss)
        metrics["valid_accs"].append(valid_acc)
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), "lstm.pt")

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)

    model.load_state_dict(best_state)
    test_loss, test_acc = evaluate(test_data_loader, model, criterion)
    return {"test_loss": float(test_loss), "test_acc": float(test_acc), "best_valid_loss": float(best_valid_loss),
            "final_train_loss": float(metrics["train_losses"][-1]),
            "final_train_acc": float(metrics["train_accs"][-1])}  # fmt: skip
