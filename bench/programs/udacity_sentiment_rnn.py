"""Port of udacity/deep-learning-v2-pytorch: the sentiment RNN. Reviews are lower-cased,
stripped of punctuation, split into words, mapped to integers by frequency (``vocab_to_int``
from 1, 0 kept for padding), zero-length reviews dropped, left-padded / truncated by
``pad_features``; an ``SentimentRNN`` (embedding, 2-layer LSTM with ``batch_first=True`` and
``dropout=drop_prob``, ``nn.Dropout(0.3)``, Linear to one output, ``nn.Sigmoid``; the output of
the last time step) is trained with ``nn.BCELoss`` and Adam, the hidden state re-wrapped each
batch as ``h = tuple([each.data for each in h])``, ``clip_grad_norm_(net.parameters(), 5)``, a
validation pass every ``print_every`` steps (``net.eval()`` ... ``net.train()``), then the test
loss and accuracy (``torch.round`` of the sigmoid output).

Source: github.com/udacity/deep-learning-v2-pytorch, ``sentiment-rnn/Sentiment_RNN_Solution.ipynb``
at commit c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written anew
from the facts of that notebook; no code copied.

Kept: the text pipeline (punctuation removal, ``Counter`` vocabulary sorted by count,
``reviews_ints``, ``encoded_labels`` from "positive"/"negative", the zero-length filter,
``pad_features`` padding on the left), the 0.8 / 0.1 / 0.1 split in order, ``TensorDataset`` +
shuffling ``DataLoader``s of ``batch_size`` 50, the model, ``init_hidden`` (``weight.new(...).zero_()``),
``lr`` 0.001, ``clip`` 5, the training loop (``net.train()`` once before it, the hidden
state initialised once per epoch and carried across batches as ``.data``, ``net.zero_grad()``,
``criterion(output.squeeze(), labels.float())``), the validation loop and the test loop.
Shrunk: 1,000 synthetic reviews made offline (a 120-word neutral vocabulary plus 6 positive and 6
negative words; a review's label is "positive" when it holds 1-3 positive words, "negative" when it
holds 1-3 negative words; 6-39 neutral words around them)
instead of the 25,000 IMDB reviews; ``seq_length`` 40 instead of 200; ``embedding_dim`` 32 and
``hidden_dim`` 32 instead of 400 and 256; ``epochs`` 12 instead of 4 (16 batches an epoch instead
of 400); ``print_every`` 8 instead of 100; CPU; no ``predict`` on typed reviews.
Measure only (not in the program): the mean training loss of the last epoch (train mode) is
recorded beside the notebook's test loss and accuracy, and their difference (the generalisation gap).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch as
``((inputs, init_hidden), labels)`` with the notebook's loss line as ``loss_fn`` and the Adam;
``nndx.Monitor(net, optimizer)`` around the loop, each training loss logged where the notebook
prints, the validation loss logged with ``split="val"``; ``nndx.probe(..., monitor=mon)`` +
``diagnose`` after training on the same batch.
"""

from __future__ import annotations

from collections import Counter
from string import punctuation

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_sentiment_rnn"
SOURCE = Source("udacity/deep-learning-v2-pytorch", "sentiment-rnn/Sentiment_RNN_Solution.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 1,000 synthetic reviews, seq_length 40, widths 32)"),
        Variant(
            "no_train_after_validation",
            "net.train() is left out after the validation pass (net.eval() is never undone): from the first "
            "validation on, the LSTM's inter-layer dropout and the Dropout(0.3) are off for the rest of training",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/fartashf/vsepp/issues/4",
             "https://github.com/MILVLG/mcan-vqa/issues/26"),
            Measure("generalization_gap", "test loss minus the last epoch's mean training loss at least 1.3x the "
                    "healthy run's (dropout off: the net fits its training reviews tighter and generalises worse)",
                    lambda healthy, buggy: buggy > 1.3 * healthy),
        ),
        Variant(
            "sigmoid_into_bce_with_logits",
            "the criterion is switched to nn.BCEWithLogitsLoss while the model still ends in nn.Sigmoid: the "
            "sigmoid is applied twice, so the loss sees probabilities in [0.5, 0.73] and cannot go below ~0.31/0.69",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/Turoad/lanedet/issues/32",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/NVIDIA-Merlin/models/pull/1175"),
            Measure("test_loss", "test loss at least 0.2 above the healthy run's",
                    lambda healthy, buggy: buggy > healthy + 0.2),
        ),
    )
}

N_REVIEWS = 1000
POSITIVE = ["great", "good", "loved", "best", "wonderful", "excellent"]
NEGATIVE = ["bad", "worst", "terrible", "awful", "boring", "waste"]


def synthetic_reviews(seed: int) -> tuple[str, str]:
    """reviews.txt / labels.txt stand-ins: one review a line, punctuation and case as in prose."""
    rng = np.random.default_rng(seed + 1234)
    neutral = [f"word{i}" for i in range(120)]
    reviews, labels = [], []
    for _ in range(N_REVIEWS):
        length = int(rng.integers(6, 40))
        words = list(rng.choice(neutral, length))
        positive = bool(rng.random() < 0.5)
        n_pos, n_neg = (int(rng.integers(1, 4)), 0) if positive else (0, int(rng.integers(1, 4)))
        for w in list(rng.choice(POSITIVE, n_pos)) + list(rng.choice(NEGATIVE, n_neg)):
            words.insert(int(rng.integers(0, len(words) + 1)), str(w))
        text = " ".join(words)
        text = text[0].upper() + text[1:] + rng.choice([".", "!", "..."])
        reviews.append(text.replace(" word1 ", ", word1 "))
        labels.append("positive" if n_pos > n_neg else "negative")
    return "\n".join(reviews), "\n".join(labels)


def pad_features(reviews_ints, seq_length):
    features = np.zeros((len(reviews_ints), seq_length), dtype=int)
    for i, row in enumerate(reviews_ints):
        features[i, -len(row):] = np.array(row)[:seq_length]
    return features


class SentimentRNN(nn.Module):
    def __init__(self, vocab_size, output_size, embedding_dim, hidden_dim, n_layers, drop_prob=0.5):
        super(SentimentRNN, self).__init__()
        self.output_size = output_size
        self.n_layers = n_layers
        self.hidden_dim = hidden_dim
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, n_layers, dropout=drop_prob, batch_first=True)
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(hidden_dim, output_size)
        self.sig = nn.Sigmoid()

    def forward(self, x, hidden):
        x = x.long()
        embeds = self.embedding(x)
        lstm_out, hidden = self.lstm(embeds, hidden)
        lstm_out = lstm_out[:, -1, :]  # the last time step's output
        out = self.dropout(lstm_out)
        out = self.fc(out)
        sig_out = self.sig(out)
        return sig_out, hidden

    def init_hidden(self, batch_size):
        weight = next(self.parameters()).data
        return (weight.new(self.n_layers, batch_size, self.hidden_dim).zero_(),
                weight.new(self.n_layers, batch_size, self.hidden_dim).zero_())  # fmt: skip


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    reviews, labels = synthetic_reviews(seed)

    reviews = reviews.lower()
    all_text = "".join([c for c in reviews if c not in punctuation])
    reviews_split = all_text.split("\n")
    all_text = " ".join(reviews_split)
    words = all_text.split()
    counts = Counter(words)
    vocab = sorted(counts, key=counts.get, reverse=True)
    vocab_to_int = {word: ii for ii, word in enumerate(vocab, 1)}
    reviews_ints = [[vocab_to_int[word] for word in review.split()] for review in reviews_split]
    labels_split = labels.split("\n")
    encoded_labels = np.array([1 if label == "positive" else 0 for label in labels_split])
    non_zero_idx = [ii for ii, review in enumerate(reviews_ints) if len(review) != 0]
    reviews_ints = [reviews_ints[ii] for ii in non_zero_idx]
    encoded_labels = np.array([encoded_labels[ii] for ii in non_zero_idx])

    seq_length = 40
    features = pad_features(reviews_ints, seq_length=seq_length)
    split_frac = 0.8
    split_idx = int(len(features) * split_frac)
    train_x, remaining_x = features[:split_idx], features[split_idx:]
    train_y, remaining_y = encoded_labels[:split_idx], encoded_labels[split_idx:]
    test_idx = int(len(remaining_x) * 0.5)
    val_x, test_x = remaining_x[:test_idx], remaining_x[test_idx:]
    val_y, test_y = remaining_y[:test_idx], remaining_y[test_idx:]

    train_data = TensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y))
    valid_data = TensorDataset(torch.from_numpy(val_x), torch.from_numpy(val_y))
    test_data = TensorDataset(torch.from_numpy(test_x), torch.from_numpy(test_y))
    batch_size = 50
    train_loader = DataLoader(train_data, shuffle=True, batch_size=batch_size)
    valid_loader = DataLoader(valid_data, shuffle=True, batch_size=batch_size)
    test_loader = DataLoader(test_data, shuffle=True, batch_size=batch_size)

    vocab_size = len(vocab_to_int) + 1
    net = SentimentRNN(vocab_size, 1, 32, 32, 2)
    lr = 0.001
    criterion = nn.BCEWithLogitsLoss() if variant == "sigmoid_into_bce_with_logits" else nn.BCELoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)

    def loss_fn(out, labels):  # the notebook's loss line, on the (sig_out, hidden) the net returns
        output = out[0] if isinstance(out, tuple) else out
        return criterion(output.squeeze(), labels.float())

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        sample_x, sample_y = next(iter(train_loader))
    probe_batch = ((sample_x, net.init_hidden(batch_size)), sample_y)
    nx.preflight(net, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10)

    epochs = 12
    counter = 0
    print_every = 8
    clip = 5
    net.train()
    epoch_losses = []
    for e in range(epochs):
        h = net.init_hidden(batch_size)
        batch_losses = []
        for inputs, labels in train_loader:
            counter += 1
            h = tuple([each.data for each in h])
            net.zero_grad()
            output, h = net(inputs, h)
            loss = criterion(output.squeeze(), labels.float())
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), clip)
            optimizer.step()
            batch_losses.append(loss.item())
            nx.timed(lambda: mon.log(loss))  # noqa: B023

            if counter % print_every == 0:
                val_h = net.init_hidden(batch_size)
                val_losses = []
                net.eval()
                for v_inputs, v_labels in valid_loader:
                    val_h = tuple([each.data for each in val_h])
                    v_output, val_h = net(v_inputs, val_h)
                    val_loss = criterion(v_output.squeeze(), v_labels.float())
                    val_losses.append(val_loss.item())
                if variant != "no_train_after_validation":
                    net.train()
                nx.timed(lambda: mon.log(float(np.mean(val_losses)), split="val"))  # noqa: B023
        epoch_losses.append(float(np.mean(batch_losses)))

    nx.finish(mon, net, probe_batch, loss_fn, optimizer=optimizer)

    test_losses = []
    num_correct = 0
    h = net.init_hidden(batch_size)
    net.eval()
    for inputs, labels in test_loader:
        h = tuple([each.data for each in h])
        output, h = net(inputs, h)
        test_loss = criterion(output.squeeze(), labels.float())
        test_losses.append(test_loss.item())
        pred = torch.round(output.squeeze())
        correct_tensor = pred.eq(labels.float().view_as(pred))
        num_correct += np.sum(np.squeeze(correct_tensor.numpy()))
    test_acc = num_correct / len(test_loader.dataset)
    return {"test_loss": float(np.mean(test_losses)), "test_acc": float(test_acc),
            "train_loss_last_epoch": epoch_losses[-1], "train_loss_first_epoch": epoch_losses[0],
            "generalization_gap": float(np.mean(test_losses)) - epoch_losses[-1]}  # fmt: skip
