"""Port of bentrevett/pytorch-sentiment-analysis, notebook 2 (Recurrent Neural Networks): a
2-layer bidirectional LSTM over packed padded sequences classifying reviews as
negative/positive.

Source: github.com/bentrevett/pytorch-sentiment-analysis, ``2 - Recurrent Neural
Networks.ipynb`` at commit 329f654b2cfaed22fee432569ebd7a2674584f79 (the notebook last
changed in 18d56faf7a32c4db5b279817868ba3c1c56bef51; MIT, Copyright (c) 2017 Ben Trevett).
Written anew from the facts of that notebook; no code copied.

Kept: ``tokenize_example`` (tokens cut to ``max_length``, ``length`` their count after the
cut); a 25% validation split of the training set; a vocabulary of the training tokens with
``min_freq`` 5 and the specials ``<unk>`` (the default index) and ``<pad>``, most frequent
first; ``numericalize_example``; ``collate_fn`` padding the ids with ``pad_sequence(...,
padding_value=pad_index, batch_first=True)`` and stacking lengths and labels;
``get_data_loader`` (shuffled for training only); the ``LSTM`` model: ``nn.Embedding(...,
padding_idx=pad_index)``, ``nn.LSTM(n_layers=2, bidirectional=True, dropout=0.5,
batch_first=True)``, ``fc`` from 2 x hidden to ``output_dim`` = the number of labels (2),
``Dropout(0.5)``; ``forward(ids, length)``: dropout of the embeddings,
``pack_padded_sequence(embedded, length, batch_first=True, enforce_sorted=False)``, the LSTM,
``pad_packed_sequence`` (its output unused, as written), ``cat([hidden[-1], hidden[-2]])``
through dropout into ``fc``; ``initialize_weights`` (Xavier-normal Linear weights, zero
biases; orthogonal LSTM weights, zero LSTM biases); ``Adam(lr=5e-4)``;
``nn.CrossEntropyLoss``; ``train`` (``model.train()``, per batch forward, loss,
``get_accuracy``, ``zero_grad``/``backward``/``step``, the epoch's mean loss and accuracy);
``evaluate`` (``model.eval()``, ``torch.no_grad()``, the same means); ``get_accuracy``
(argmax against the label, divided by the batch size); the epoch loop keeping the model
of the lowest validation loss (here a copy in memory instead of ``torch.save``), then the
test set evaluated with that model; ``seed = 1234``.
Shrunk: a generated review corpus (see ``reviews``) instead of IMDB through ``datasets``:
2,000 training reviews (1,500 after the validation split) and 600 test reviews of 8 to 64
tokens instead of 25,000 + 25,000 of up to 256; whitespace tokens instead of torchtext's
``basic_english``; no GloVe vectors (a download): the embedding keeps its N(0, 1) init and
the learning rate is 5e-3 instead of 5e-4 to learn without them; embedding and hidden
dimensions 32 instead of 300; batch size 64 instead of 512; 6 epochs instead of 10; no
``tqdm``, no plots, no ``predict_sentiment``.
Measure only (not in the program): the notebook's own numbers, the test accuracy and the
best validation loss.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
as ``((ids, length), label)`` with ``criterion`` and ``optimizer``; ``nndx.Monitor(model,
optimizer)`` around the epochs, every batch's loss logged with its accuracy, each
``evaluate`` on the validation set logged as ``split="val"`` with its accuracy; then
``nndx.probe(..., monitor=mon)`` on the first batch and ``nndx.diagnose``.
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

NAME = "sentiment_rnn"
SOURCE = Source("bentrevett/pytorch-sentiment-analysis", "2 - Recurrent Neural Networks.ipynb",
                "329f654b2cfaed22fee432569ebd7a2674584f79", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: generated reviews, dims 32, 6 epochs)"),
        Variant(
            "sorted_batch_not_unsorted",
            "forward sorts the batch by length for pack_padded_sequence(enforce_sorted=True), the pre-1.1 "
            "recipe, and returns the predictions in that sorted order without undoing the sort: prediction i "
            "belongs to another review than label i",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/fartashf/vsepp/pull/36", "https://github.com/pytorch/pytorch/issues/2615",
             "https://city.shaform.com/en/2019/01/15/sort-sequences-in-pytorch/"),
            Measure("test_acc", "test accuracy at least 0.15 below the healthy run's: 0.51 against 0.92 on seed 0 "
                    "(the training loss stays at ln 2)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "eval_mode_forgotten",
            "evaluate() without model.eval(): validation and test run with dropout 0.5 on the embeddings and "
            "on the final hidden state (and the best-validation-loss checkpoint is chosen on those noisy numbers)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/issues/399",
             "https://github.com/giotto-ai/giotto-deep/issues/40", "https://github.com/SeanNaren/deepspeech.pytorch/pull/22",
             "https://github.com/BNUCNL/dnnbrain/pull/72"),
            Measure("test_loss", "test loss 1.2x the healthy run's or more: 0.287 against 0.217 on seed 0 "
                    "(test accuracy 0.89 against 0.92)",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
    )
}

SEED = 1234
MAX_LENGTH, MIN_FREQ, TEST_SIZE = 64, 5, 0.25
N_TRAIN, N_TEST, MIN_TOKENS = 2000, 600, 8
EMBEDDING_DIM, HIDDEN_DIM, N_LAYERS, BIDIRECTIONAL, DROPOUT_RATE = 32, 32, 2, True, 0.5
BATCH_SIZE, LR, N_EPOCHS = 64, 5e-3, 6
N_NEUTRAL, N_SENTIMENT = 400, 24


# --------------------------------------------------------------------------- the data (IMDB stand-in)


def reviews(n: int, rng: np.random.Generator) -> list[dict]:
    """Reviews of 8 to 90 words (cut to MAX_LENGTH later): neutral words (Zipf-like) with 20%
    sentiment words ("good*"/"bad*"), of which 80% agree with the review's label; the length
    is drawn independently of the label. Label 1 positive, 0 negative."""
    neutral_p = 1.0 / np.arange(1, N_NEUTRAL + 1) ** 0.8
    neutral_p /= neutral_p.sum()
    sentiment_p = 1.0 / np.arange(1, N_SENTIMENT + 1) ** 0.5
    sentiment_p /= sentiment_p.sum()
    out = []
    for _ in range(n):
        label = int(rng.integers(0, 2))
        words = []
        for _ in range(int(rng.integers(MIN_TOKENS, 91))):
            if rng.random() < 0.2:
                side = label if rng.random() < 0.8 else 1 - label
                words.append(f"{'good' if side else 'bad'}{rng.choice(N_SENTIMENT, p=sentiment_p)}")
            else:
                words.append(f"w{rng.choice(N_NEUTRAL, p=neutral_p)}")
        out.append({"text": " ".join(words), "label": label})
    return out


def tokenize_example(example: dict, max_length: int) -> dict:
    tokens = example["text"].split()[:max_length]  # tokenizer(example["text"])[:max_length]
    return {**example, "tokens": tokens, "length": len(tokens)}


class Vocab:
    """torchtext's build_vocab_from_iterator: specials first, then tokens of at least
    ``min_freq`` by frequency (ties alphabetical); ``set_default_index`` for the unknown."""

    def __init__(self, token_lists: list[list[str]], min_freq: int, specials: list[str]) -> None:
        counter = collections.Counter(t for tokens in token_lists for t in tokens)
        ordered = sorted(sorted(counter.items(), key=lambda kv: kv[0]), key=lambda kv: kv[1], reverse=True)
        self.itos = list(specials) + [t for t, c in ordered if c >= min_freq and t not in specials]
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.default_index: int | None = None

    def __getitem__(self, token: str) -> int:
        return self.stoi[token]

    def __len__(self) -> int:
        return len(self.itos)

    def set_default_index(self, index: int) -> None:
        self.default_index = index

    def lookup_indices(self, tokens: list[str]) -> list[int]:
        return [self.stoi.get(t, self.default_index) for t in tokens]


def get_collate_fn(pad_index: int):
    def collate_fn(batch: list[dict]) -> dict[str, torch.Tensor]:
        batch_ids = nn.utils.rnn.pad_sequence([i["ids"] for i in batch], padding_value=pad_index, batch_first=True)
        batch_length = torch.stack([i["length"] for i in batch])
        batch_label = torch.stack([i["label"] for i in batch])
        return {"ids": batch_ids, "length": batch_length, "label": batch_label}

    return collate_fn


def get_data_loader(dataset: list[dict], batch_size: int, pad_index: int, shuffle: bool = False,
                    generator: torch.Generator | None = None) -> torch.utils.data.DataLoader:  # fmt: skip
    return torch.utils.data.DataLoader(dataset=dataset, batch_size=batch_size, collate_fn=get_collate_fn(pad_index),
                                       shuffle=shuffle, generator=generator)  # fmt: skip


# --------------------------------------------------------------------------- the model


class LSTM(nn.Module):
    def __init__(self, vocab_size: int, embedding_dim: int, hidden_dim: int, output_dim: int, n_layers: int,
                 bidirectional: bool, dropout_rate: float, pad_index: int, sort_in_forward: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, n_layers, bidirectional=bidirectional, dropout=dropout_rate,
                            batch_first=True)  # fmt: skip
        self.fc = nn.Linear(hidden_dim * 2 if bidirectional else hidden_dim, output_dim)
        self.dropout = nn.Dropout(dropout_rate)
        self.sort_in_forward = sort_in_forward

    def forward(self, ids: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        embedded = self.dropout(self.embedding(ids))
        if self.sort_in_forward:  # the bug: sorted for enforce_sorted=True, never put back in order
            length, sorted_idx = length.sort(descending=True)
            embedded = embedded[sorted_idx]
            packed_embedded = nn.utils.rnn.pack_padded_sequence(embedded, length, batch_first=True)
        else:
            packed_embedded = nn.utils.rnn.pack_padded_sequence(embedded, length, batch_first=True,
                                                                enforce_sorted=False)  # fmt: skip
        packed_output, (hidden, cell) = self.lstm(packed_embedded)
        output, output_length = nn.utils.rnn.pad_packed_sequence(packed_output)
        if self.lstm.bidirectional:
            hidden = self.dropout(torch.cat([hidden[-1], hidden[-2]], dim=-1))
        else:
            hidden = self.dropout(hidden[-1])
        return self.fc(hidden)


def initialize_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.xavier_normal_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LSTM):
        for name, param in m.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            elif "weight" in name:
                nn.init.orthogonal_(param)


def get_accuracy(prediction: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    batch_size, _ = prediction.shape
    predicted_classes = prediction.argmax(dim=-1)
    correct_predictions = predicted_classes.eq(label).sum()
    return correct_predictions / batch_size


# --------------------------------------------------------------------------- the notebook


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(SEED + seed)
    torch.manual_seed(SEED + seed)
    rng = np.random.default_rng(SEED + seed)
    train_data = [tokenize_example(e, MAX_LENGTH) for e in reviews(N_TRAIN, rng)]
    test_data = [tokenize_example(e, MAX_LENGTH) for e in reviews(N_TEST, rng)]
    order = rng.permutation(len(train_data))  # train_test_split(test_size=0.25)
    n_valid = int(round(TEST_SIZE * len(train_data)))
    valid_data = [train_data[i] for i in order[:n_valid]]
    train_data = [train_data[i] for i in order[n_valid:]]

    vocab = Vocab([e["tokens"] for e in train_data], MIN_FREQ, ["<unk>", "<pad>"])
    unk_index, pad_index = vocab["<unk>"], vocab["<pad>"]
    vocab.set_default_index(unk_index)

    def numericalize(dataset: list[dict]) -> list[dict]:  # numericalize_example + with_format("torch")
        return [{"ids": torch.tensor(vocab.lookup_indices(e["tokens"]), dtype=torch.long),
                 "label": torch.tensor(e["label"]), "length": torch.tensor(e["length"])} for e in dataset]  # fmt: skip

    train_data, valid_data, test_data = numericalize(train_data), numericalize(valid_data), numericalize(test_data)
    train_data_loader = get_data_loader(train_data, BATCH_SIZE, pad_index, shuffle=True,
                                        generator=torch.Generator().manual_seed(SEED + seed))  # fmt: skip
    valid_data_loader = get_data_loader(valid_data, BATCH_SIZE, pad_index)
    test_data_loader = get_data_loader(test_data, BATCH_SIZE, pad_index)

    output_dim = len({int(e["label"]) for e in train_data})
    model = LSTM(len(vocab), EMBEDDING_DIM, HIDDEN_DIM, output_dim, N_LAYERS, BIDIRECTIONAL, DROPOUT_RATE, pad_index,
                 sort_in_forward=variant == "sorted_batch_not_unsorted")  # fmt: skip
    model.apply(initialize_weights)
    optimizer = optim.Adam(model.parameters(), lr=LR)
    criterion = nn.CrossEntropyLoss()

    first = get_collate_fn(pad_index)(train_data[:BATCH_SIZE])
    probe_batch = ((first["ids"], first["length"]), first["label"])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    def train_epoch(dataloader) -> tuple[float, float]:
        model.train()
        epoch_losses, epoch_accs = [], []
        for batch in dataloader:
            ids, length, label = batch["ids"], batch["length"], batch["label"]
            prediction = model(ids, length)
            loss = criterion(prediction, label)
            accuracy = get_accuracy(prediction, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss, accuracy=accuracy.item()))
            epoch_losses.append(loss.item())
            epoch_accs.append(accuracy.item())
        return float(np.mean(epoch_losses)), float(np.mean(epoch_accs))

    def evaluate(dataloader) -> tuple[float, float]:
        if variant != "eval_mode_forgotten":
            model.eval()
        epoch_losses, epoch_accs = [], []
        with torch.no_grad():
            for batch in dataloader:
                ids, length, label = batch["ids"], batch["length"], batch["label"]
                prediction = model(ids, length)
                loss = criterion(prediction, label)
                accuracy = get_accuracy(prediction, label)
                epoch_losses.append(loss.item())
                epoch_accs.append(accuracy.item())
        return float(np.mean(epoch_losses)), float(np.mean(epoch_accs))

    best_valid_loss = float("inf")
    best_state = None
    metrics: dict[str, list[float]] = collections.defaultdict(list)
    for _epoch in range(N_EPOCHS):
        train_loss, train_acc = train_epoch(train_data_loader)
        valid_loss, valid_acc = evaluate(valid_data_loader)
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_acc))  # noqa: B023
        metrics["train_losses"].append(train_loss)
        metrics["train_accs"].append(train_acc)
        metrics["valid_losses"].append(valid_loss)
        metrics["valid_accs"].append(valid_acc)
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), "lstm.pt")

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
    model.load_state_dict(best_state)
    test_loss, test_acc = evaluate(test_data_loader)
    return {
        "test_acc": test_acc,
        "test_loss": test_loss,
        "best_valid_loss": best_valid_loss,
        "final_valid_acc": metrics["valid_accs"][-1],
        "final_train_loss": metrics["train_losses"][-1],
    }
