"""Port of Atcold/NYU-DLSP20's signal-echoing notebook: a one-layer ReLU ``nn.RNN`` (4 hidden units)
and a linear read-out learn to output the binary input stream delayed by ``echo_step`` steps,
trained with truncated backprop through time: the stream is cut into chunks of ``BPTT_T`` steps,
the hidden state is carried from chunk to chunk and detached in place before each step.

Source: github.com/Atcold/NYU-DLSP20, ``09-echo_data.ipynb`` and ``res/sequential_tasks.py``
(``EchoData``) at commit 3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (CC BY-NC-SA 4.0, Alfredo
Canziani and contributors). Written anew from the facts of those files; no code copied.

Kept: ``torch.manual_seed(1)``, ``np.random.seed(3)`` (each plus the run's seed); ``EchoData``:
``np.random.choice(2, size=(batch_size, series_length), p=[0.5, 0.5])`` as the input, the
target ``np.roll(x, echo_step, axis=1)`` with its first ``echo_step`` columns zeroed, both
expanded to ``[batch, series, 1]`` and ``np.split`` into ``series_length // truncated_length``
chunks along time; ``__getitem__(0)`` draws a new series (every epoch sees fresh data, from
the global numpy stream); ``batch_size = 5``, ``echo_step = 3``, ``BPTT_T = 20``; a train and
a test ``EchoData``; ``SimpleRNN``: ``nn.RNN(1, 4, num_layers=1, nonlinearity='relu',
batch_first=True)`` then ``nn.Linear(4, 1)``, ``forward(x, hidden)`` returning ``(x,
hidden)``; ``BCEWithLogitsLoss``; ``RMSprop(lr=0.001)``; ``train()``: ``model.train()``, a
fresh ``hidden = None`` per epoch, per chunk ``torch.from_numpy(...).float()``,
``optimizer.zero_grad()``, ``if hidden is not None: hidden.detach_()``, ``logits, hidden =
model(data, hidden)``, the loss, ``backward``, ``step``, and the notebook's accuracy
(``torch.sigmoid(logits) > 0.5`` against ``target.byte()``, divided by the values in a
chunk); ``test()``: eval mode, a fresh hidden state, no grad, the same accuracy; 5 epochs.
Shrunk: nothing of the training (20,000-step streams, 1,000 chunks an epoch, 5 epochs, as
published: about 10 s on one CPU thread); CPU only, no prints; the notebook's final demo cell
(echoing one random sequence) is not run.

nndx, as the author would add it: the model takes ``(data, hidden)`` and returns ``(logits,
hidden)``, so nndx gets the batch ``((data, None), target)`` (the first chunk of the train
stream, called with ``hidden=None`` as the notebook's first step is) and ``loss_fn(output,
target) = criterion(output[0], target)``; a preflight ``nndx.probe`` with the optimizer;
``nndx.Monitor(model, optimizer, every=10)`` around the epochs, each chunk's loss logged
after ``optimizer.step()``; after the test ``nndx.probe(..., monitor=mon)`` on the same batch
and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_echo_data"
SOURCE = Source("Atcold/NYU-DLSP20", "09-echo_data.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC-BY-NC-SA-4.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (its full 20,000-step streams, 5 epochs)"),
        Variant(
            "no_batch_first",
            "nn.RNN built without batch_first=True while the chunks are [batch, time, 1]: the RNN runs its "
            "recurrence over the 5 streams and treats the 20 time steps as independent samples, so no step "
            "ever sees the inputs 3 steps before it",
            (C.WRONG_RESHAPE,),
            ("https://github.com/pytorch/pytorch/issues/1538",
             "https://github.com/Cadene/vqa.pytorch/issues/40",
             "https://github.com/HarryVolek/PyTorch_Speaker_Verification/issues/47"),
            Measure("test_accuracy", "test accuracy (percent) at least 20 points below the healthy run's: 50.3 "
                    "against 99.98 healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
        Variant(
            "sigmoid_before_bce_with_logits",
            "SimpleRNN.forward returns torch.sigmoid(self.linear(x)) while the loss stays BCEWithLogitsLoss: "
            "the sigmoid is applied twice, the 'logits' live in (0, 1), the loss cannot go below ~0.5 and "
            "the notebook's sigmoid(logits) > 0.5 predicts 1 everywhere",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/avBuffer/UNet3plus_pth/issues/23"),
            Measure("test_accuracy", "test accuracy (percent) at least 20 points below the healthy run's: 50.3 "
                    "against 99.98 healthy on seed 0 (the loss floors at 0.50 against 0.004)",
                    lambda healthy, buggy: not buggy > healthy - 20.0),
        ),
    )
}

BATCH_SIZE, ECHO_STEP, SERIES_LENGTH, BPTT_T = 5, 3, 20_000, 20
H_UNITS, LR, N_EPOCHS = 4, 0.001, 5


# --------------------------------------------------------------------------- res/sequential_tasks.py


class EchoData:
    def __init__(self, series_length: int = 40000, batch_size: int = 32, echo_step: int = 3,
                 truncated_length: int = 10, seed: int | None = None) -> None:  # fmt: skip
        self.series_length = series_length
        self.truncated_length = truncated_length
        self.n_batches = series_length // truncated_length
        self.echo_step = echo_step
        self.batch_size = batch_size
        if seed is not None:
            np.random.seed(seed)
        self.x_batch = None
        self.y_batch = None
        self.x_chunks: list[np.ndarray] = []
        self.y_chunks: list[np.ndarray] = []
        self.generate_new_series()
        self.prepare_batches()

    def __getitem__(self, index: int):
        if index == 0:
            self.generate_new_series()
            self.prepare_batches()
        return self.x_chunks[index], self.y_chunks[index]

    def __len__(self) -> int:
        return self.n_batches

    def generate_new_series(self) -> None:
        x = np.random.choice(2, size=(self.batch_size, self.series_length), p=[0.5, 0.5])
        y = np.roll(x, self.echo_step, axis=1)
        y[:, 0 : self.echo_step] = 0
        self.x_batch = x
        self.y_batch = y

    def prepare_batches(self) -> None:
        x = np.expand_dims(self.x_batch, axis=-1)
        y = np.expand_dims(self.y_batch, axis=-1)
        self.x_chunks = np.split(x, self.n_batches, axis=1)
        self.y_chunks = np.split(y, self.n_batches, axis=1)


# --------------------------------------------------------------------------- 09-echo_data.ipynb


class SimpleRNN(nn.Module):
    def __init__(self, input_size: int, rnn_hidden_size: int, output_size: int, batch_first: bool = True,
                 sigmoid_out: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.rnn_hidden_size = rnn_hidden_size
        self.rnn = torch.nn.RNN(input_size=input_size, hidden_size=rnn_hidden_size, num_layers=1,
                                nonlinearity="relu", batch_first=batch_first)  # fmt: skip
        self.linear = torch.nn.Linear(in_features=rnn_hidden_size, out_features=1)
        self.sigmoid_out = sigmoid_out

    def forward(self, x, hidden):
        # successive chunks belong to the same streams: the hidden state is shared across calls
        x, hidden = self.rnn(x, hidden)
        x = self.linear(x)
        if self.sigmoid_out:  # the bug: a sigmoid output in front of BCEWithLogitsLoss
            x = torch.sigmoid(x)
        return x, hidden


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    np.random.seed(3 + seed)

    train_data = EchoData(echo_step=ECHO_STEP, batch_size=BATCH_SIZE, series_length=SERIES_LENGTH,
                          truncated_length=BPTT_T)  # fmt: skip
    total_values_in_one_chunck = BATCH_SIZE * BPTT_T
    train_size = len(train_data)
    test_data = EchoData(echo_step=ECHO_STEP, batch_size=BATCH_SIZE, series_length=SERIES_LENGTH,
                         truncated_length=BPTT_T)  # fmt: skip
    test_size = len(test_data)

    model = SimpleRNN(input_size=1, rnn_hidden_size=H_UNITS, output_size=1,
                      batch_first=variant != "no_batch_first",
                      sigmoid_out=variant == "sigmoid_before_bce_with_logits")  # fmt: skip
    criterion = torch.nn.BCEWithLogitsLoss()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=LR)

    def loss_fn(output, target):
        return criterion(output[0], target)

    probe_batch = ((torch.from_numpy(train_data.x_chunks[0]).float(), None),
                   torch.from_numpy(train_data.y_chunks[0]).float())  # fmt: skip
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    def train_epoch():
        model.train()
        hidden = None  # new epoch --> fresh hidden state
        correct = 0.0
        losses = []
        for batch_idx in range(train_size):
            data, target = train_data[batch_idx]
            data, target = torch.from_numpy(data).float(), torch.from_numpy(target).float()
            optimizer.zero_grad()
            if hidden is not None:
                hidden.detach_()
            logits, hidden = model(data, hidden)
            loss = criterion(logits, target)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            losses.append(loss.item())
            pred = torch.sigmoid(logits) > 0.5
            correct += (pred == target.byte()).int().sum().item() / total_values_in_one_chunck
        return correct, loss.item(), float(np.mean(losses))

    def test():
        model.eval()
        correct = 0.0
        hidden = None
        with torch.no_grad():
            for batch_idx in range(test_size):
                data, target = test_data[batch_idx]
                data, target = torch.from_numpy(data).float(), torch.from_numpy(target).float()
                logits, hidden = model(data, hidden)
                pred = torch.sigmoid(logits) > 0.5
                correct += (pred == target.byte()).int().sum().item() / total_values_in_one_chunck
        return correct

    train_accuracy = last_loss = epoch_loss = float("nan")
    first_epoch_loss = float("nan")
    for epoch in range(1, N_EPOCHS + 1):
        correct, last_loss, epoch_loss = train_epoch()
        train_accuracy = float(correct) * 100 / train_size
        if epoch == 1:
            first_epoch_loss = epoch_loss

    correct = test()
    test_accuracy = float(correct) * 100 / test_size

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    return {"test_accuracy": test_accuracy, "train_accuracy": train_accuracy, "last_loss": last_loss,
            "last_epoch_mean_loss": epoch_loss, "first_epoch_mean_loss": first_epoch_loss}  # fmt: skip
