"""Port of Atcold/NYU-DLSP20's ``08-seq_classification.ipynb``: a simple RNN and an LSTM classify
sequences by the temporal order of two symbols (Hochreiter & Schmidhuber's experiment 6a).

Source: github.com/Atcold/NYU-DLSP20, ``08-seq_classification.ipynb`` (``SimpleRNN``,
``SimpleLSTM``, ``train``, ``test``, ``train_and_test``) and ``res/sequential_tasks.py``
(``pad_sequences``, ``to_categorical``, ``TemporalOrderExp6aSequence``) at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (CC BY-NC-SA 4.0, Alfredo Canziani). Written anew from
the facts of those files; no code copied.

Kept: the data generator (``TemporalOrderExp6aSequence.get_predefined_generator`` at
``DifficultyLevel.EASY``: lengths 7-8, ``t1`` in 1-2, ``t2`` in 4-5, symbols ``X Y a b c d B
E`` one-hot, the sequence ``B``...``E`` of random distraction symbols with ``X``/``Y`` at
``t1``/``t2``, the class ``Q R S U`` drawn uniformly and one-hot, pre-padded with zeros to
``length_range[1]`` = 9 by ``pad_sequences``; every ``__getitem__`` draws a fresh batch of 32
from the global NumPy stream; ``__len__`` = ``int(1000 / batch_size)`` = 31 batches an epoch;
the generator seeds ``np.random`` with 8382 on construction, train and test generator both);
``SimpleRNN`` (``nn.RNN(input_size, hidden_size, nonlinearity='relu', batch_first=True)``, a
``Linear`` on every step's hidden state) and ``SimpleLSTM`` (``nn.LSTM(..., batch_first=True)``,
the same head); ``hidden_size`` 4; ``CrossEntropyLoss``; ``RMSprop(lr=0.001)``; the notebook's
``train`` (``model.train()``; per batch: ``torch.from_numpy(...).float()`` / ``.long()``,
``output = model(data)``, ``output = output[:, -1, :]`` (the last step: the input is
pre-padded), ``target = target.argmax(dim=1)``, ``loss = criterion(output, target)``,
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``, correct predictions
counted; returns the count and the last batch's loss) and ``test`` (``model.eval()``,
``torch.no_grad()``, the same per batch); ``train_and_test`` (per epoch ``train`` then
``test``, accuracies in percent over ``len(gen) * batch_size``); the notebook's order: the RNN
first, then the LSTM, each with fresh generators, ``torch.manual_seed(1)`` once at the top.
Shrunk: 25 epochs per model instead of the notebook's 100 (its section 6/7 runs; its 10-epoch
runs are where the RNN has not learned yet); no plots, no ``evaluate_model``, no
``get_states_across_time`` visualisation; CPU.
Measure only (not in the program): the mean of the two models' test accuracies in the last
epoch (``test`` on the test generator, as ``train_and_test`` prints it).

nndx, as the author would add it: the models output every step's logits and the loss is taken
on the last step against the class index, so nndx gets ``loss_fn(output, target) =
criterion(output[:, -1, :], target)`` and the first training batch as tensors ``(data,
target.argmax(1))``; per model a preflight ``nndx.probe`` with the optimizer,
``nndx.Monitor(model, optimizer, every=10)`` around ``train_and_test``, every batch's loss
logged where ``train`` computes it and each epoch's test loss and accuracy logged as
``split="val"`` (where ``train_and_test`` records ``history_test``); after training
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``; the author reads the
two models' diagnoses together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_seq_classification"
SOURCE = Source("Atcold/NYU-DLSP20", "08-seq_classification.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (EASY, hidden 4, RMSprop 1e-3; 25 epochs per model)"),
        Variant(
            "batch_first_dropped",
            "nn.RNN / nn.LSTM built without batch_first=True while the generator yields (batch, time, symbol): "
            "the recurrence runs across the 32 sequences of a batch and each time step is a separate 'sample', "
            "so output[:, -1, :] is the last time step (the end symbol E) of each sequence, seen with no memory of "
            "the X/Y it contained",
            (C.WRONG_RESHAPE,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/196",
             "https://github.com/yunjey/pytorch-tutorial/issues/89",
             "https://github.com/pytorch/pytorch/issues/1538"),
            Measure("test_acc", "mean final test accuracy of the two models at least 20 points below the "
                    "healthy run's: 23.8 against 98.9 healthy on seed 0", lambda healthy, buggy: buggy < healthy - 20.0),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "the models' forward ends in torch.softmax over the classes and the result goes to "
            "nn.CrossEntropyLoss, which applies log_softmax again: the loss cannot fall below ~0.74 and its "
            "gradient is squashed",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/NVIDIA/VariantWorks/pull/134",
             "https://github.com/doronharitan/human_activity_recognition_LRCN/issues/4",
             "https://github.com/ariecattan/SciCo/issues/2"),
            Measure("test_loss", "mean final test loss of the two models at least 0.3 above the healthy run's: 0.92 "
                    "against 0.25 healthy on seed 0 (test accuracy 100.0 against 98.9)",
                    lambda healthy, buggy: buggy > healthy + 0.3),
        ),
    )
}

HIDDEN_SIZE = 4
BATCH_SIZE = 32
MAX_EPOCHS = 25
LR = 0.001


# --------------------------------------------------------------------------- res/sequential_tasks.py


def pad_sequences(sequences, maxlen, dtype="int32", value=0.0):
    """Keras' pad_sequences as the notebook's helper has it, for padding='pre', truncating='pre'."""
    sample_shape = np.asarray(sequences[0]).shape[1:]
    x = np.full((len(sequences), maxlen) + sample_shape, value, dtype=dtype)
    for idx, s in enumerate(sequences):
        if not len(s):
            continue
        trunc = np.asarray(s[-maxlen:], dtype=dtype)
        x[idx, -len(trunc):] = trunc
    return x


def to_categorical(y, num_classes, dtype="float32"):
    y = np.array(y, dtype="int")
    input_shape = y.shape
    if input_shape and input_shape[-1] == 1 and len(input_shape) > 1:
        input_shape = tuple(input_shape[:-1])
    y = y.ravel()
    n = y.shape[0]
    categorical = np.zeros((n, num_classes), dtype=dtype)
    categorical[np.arange(n), y] = 1
    return np.reshape(categorical, input_shape + (num_classes,))


class TemporalOrderExp6aSequence:
    def __init__(self, length_range=(100, 111), t1_range=(10, 21), t2_range=(50, 61), batch_size=32, seed=None):
        self.classes = ["Q", "R", "S", "U"]
        self.n_classes = len(self.classes)
        self.relevant_symbols = ["X", "Y"]
        self.distraction_symbols = ["a", "b", "c", "d"]
        self.start_symbol, self.end_symbol = "B", "E"
        self.length_range, self.t1_range, self.t2_range = length_range, t1_range, t2_range
        self.batch_size = batch_size
        if seed is not None:
            np.random.seed(seed)
        all_symbols = self.relevant_symbols + self.distraction_symbols + [self.start_symbol] + [self.end_symbol]
        self.n_symbols = len(all_symbols)
        self.s_to_idx = {s: n for n, s in enumerate(all_symbols)}
        self.c_to_idx = {c: n for n, c in enumerate(self.classes)}

    def generate_pair(self):
        length = np.random.randint(self.length_range[0], self.length_range[1])
        t1 = np.random.randint(self.t1_range[0], self.t1_range[1])
        t2 = np.random.randint(self.t2_range[0], self.t2_range[1])
        x = np.random.choice(self.distraction_symbols, length)
        x[0], x[-1] = self.start_symbol, self.end_symbol
        y = np.random.choice(self.classes)
        first, second = {"Q": (0, 0), "R": (0, 1), "S": (1, 0), "U": (1, 1)}[str(y)]
        x[t1], x[t2] = self.relevant_symbols[first], self.relevant_symbols[second]
        return "".join(x), y

    def encode_x(self, x):
        return to_categorical([self.s_to_idx[s] for s in x], num_classes=self.n_symbols)

    def encode_y(self, y):
        return to_categorical(self.c_to_idx[y], num_classes=self.n_classes)

    def encode_x_batch(self, x_batch):
        return pad_sequences([self.encode_x(x) for x in x_batch], maxlen=self.length_range[1])

    def encode_y_batch(self, y_batch):
        return np.array([self.encode_y(y) for y in y_batch])

    def __len__(self):
        return int(1000.0 / self.batch_size)

    def __getitem__(self, index):
        batch_x, batch_y = [], []
        for _ in range(self.batch_size):
            x, y = self.generate_pair()
            batch_x.append(x)
            batch_y.append(y)
        return self.encode_x_batch(batch_x), self.encode_y_batch(batch_y)

    @staticmethod
    def get_predefined_generator(batch_size=32, seed=8382):
        # DifficultyLevel.EASY
        return TemporalOrderExp6aSequence((7, 9), (1, 3), (4, 6), batch_size, seed)


# --------------------------------------------------------------------------- the notebook


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    batch_first = variant != "batch_first_dropped"
    softmax_out = variant == "softmax_before_cross_entropy"
    torch.manual_seed(1 + seed)

    class SimpleRNN(nn.Module):
        def __init__(self, input_size, hidden_size, output_size):
            super().__init__()
            self.rnn = torch.nn.RNN(input_size, hidden_size, nonlinearity="relu", batch_first=batch_first)
            self.linear = torch.nn.Linear(hidden_size, output_size)

        def forward(self, x):
            h = self.rnn(x)[0]
            x = self.linear(h)
            return torch.softmax(x, dim=-1) if softmax_out else x

    class SimpleLSTM(nn.Module):
        def __init__(self, input_size, hidden_size, output_size):
            super().__init__()
            self.lstm = torch.nn.LSTM(input_size, hidden_size, batch_first=batch_first)
            self.linear = torch.nn.Linear(hidden_size, output_size)

        def forward(self, x):
            h = self.lstm(x)[0]
            x = self.linear(h)
            return torch.softmax(x, dim=-1) if softmax_out else x

    def train_epoch(model, train_data_gen, criterion, optimizer, mon):
        model.train()
        num_correct = 0
        for batch_idx in range(len(train_data_gen)):
            data, target = train_data_gen[batch_idx]
            data, target = torch.from_numpy(data).float(), torch.from_numpy(target).long()
            output = model(data)
            output = output[:, -1, :]
            target = target.argmax(dim=1)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            y_pred = output.argmax(dim=1)
            num_correct += (y_pred == target).sum().item()
        return num_correct, loss.item()

    def test(model, test_data_gen, criterion):
        model.eval()
        num_correct = 0
        with torch.no_grad():
            for batch_idx in range(len(test_data_gen)):
                data, target = test_data_gen[batch_idx]
                data, target = torch.from_numpy(data).float(), torch.from_numpy(target).long()
                output = model(data)
                output = output[:, -1, :]
                target = target.argmax(dim=1)
                loss = criterion(output, target)
                y_pred = output.argmax(dim=1)
                num_correct += (y_pred == target).sum().item()
        return num_correct, loss.item()

    def train_and_test(model, train_data_gen, test_data_gen, criterion, optimizer, max_epochs):
        history_train = {"loss": [], "acc": []}
        history_test = {"loss": [], "acc": []}

        # nndx: the loss on the last step against the class index, and the first training batch
        def loss_fn(output, target):
            return criterion(output[:, -1, :], target)

        with torch.random.fork_rng(), _numpy_state():  # the probe batch leaves the streams alone
            data, target = train_data_gen[0]
        probe_batch = (torch.from_numpy(data).float(), torch.from_numpy(target).long().argmax(dim=1))
        nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
        mon = nx.monitor(model, optimizer, every=10)

        for _ in range(max_epochs):
            num_correct, loss = train_epoch(model, train_data_gen, criterion, optimizer, mon)
            history_train["loss"].append(loss)
            history_train["acc"].append(float(num_correct) / (len(train_data_gen) * train_data_gen.batch_size) * 100)
            num_correct, loss = test(model, test_data_gen, criterion)
            accuracy = float(num_correct) / (len(test_data_gen) * test_data_gen.batch_size) * 100
            history_test["loss"].append(loss)
            history_test["acc"].append(accuracy)
            nx.timed(lambda: mon.log(loss, split="val", accuracy=accuracy / 100))  # noqa: B023

        nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
        return history_train, history_test

    results = {}
    for label, cls in (("rnn", SimpleRNN), ("lstm", SimpleLSTM)):
        train_data_gen = TemporalOrderExp6aSequence.get_predefined_generator(BATCH_SIZE, seed=8382 + seed)
        test_data_gen = TemporalOrderExp6aSequence.get_predefined_generator(BATCH_SIZE, seed=8382 + seed)
        input_size = train_data_gen.n_symbols
        output_size = train_data_gen.n_classes
        model = cls(input_size, HIDDEN_SIZE, output_size)
        criterion = torch.nn.CrossEntropyLoss()
        optimizer = torch.optim.RMSprop(model.parameters(), lr=LR)
        history_train, history_test = train_and_test(model, train_data_gen, test_data_gen, criterion, optimizer,
                                                     MAX_EPOCHS)  # fmt: skip
        results[f"{label}_test_acc"] = history_test["acc"][-1]
        results[f"{label}_test_loss"] = history_test["loss"][-1]
        results[f"{label}_train_acc"] = history_train["acc"][-1]
        results[f"{label}_train_loss"] = history_train["loss"][-1]
    results["test_acc"] = (results["rnn_test_acc"] + results["lstm_test_acc"]) / 2
    results["test_loss"] = (results["rnn_test_loss"] + results["lstm_test_loss"]) / 2
    return results


class _numpy_state:
    """Draws made inside leave NumPy's global stream where it was (the probe batch)."""

    def __enter__(self):
        self.state = np.random.get_state()

    def __exit__(self, *exc):
        np.random.set_state(self.state)
