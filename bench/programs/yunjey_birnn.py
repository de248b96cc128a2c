"""Port of yunjey/pytorch-tutorial's bidirectional recurrent neural network: a 2-layer
bidirectional LSTM reads each image as a sequence of its rows and classifies it from the
last time step's output.

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/02-intermediate/bidirectional_recurrent_neural_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 yunjey). Written anew from
the facts of that file; no code copied.

Kept: ``BiRNN(input_size, hidden_size, num_layers, num_classes)``: ``nn.LSTM(input_size,
hidden_size, num_layers, batch_first=True, bidirectional=True)``, zero ``h0``/``c0`` of shape
``(num_layers*2, batch, hidden_size)`` built in ``forward``, ``fc = nn.Linear(hidden_size*2,
num_classes)`` on ``out[:, -1, :]``; ``hidden_size`` 128, ``num_layers`` 2, ``num_classes``
10, ``batch_size`` 100, ``learning_rate`` 0.003; ``nn.CrossEntropyLoss``, ``torch.optim.Adam``;
the images through ``transforms.ToTensor()`` (pixels in [0, 1]), a shuffling train loader and
an unshuffled test loader; per batch ``images.reshape(-1, sequence_length, input_size)``,
forward, loss, ``optimizer.zero_grad()``, ``backward``, ``step``, the loss printed every
``log_every`` steps; the test loop under ``no_grad`` with ``torch.max(outputs.data, 1)``.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of MNIST, so
``sequence_length`` = ``input_size`` = 8 (rows of 8 pixels) instead of 28; 10 epochs instead
of 2 (15 steps an epoch instead of 600); the loss printed every 5 steps instead of 100; CPU;
no checkpoint saved.
Measure only (not in the program): the test loop's accuracy is returned, with the mean
test cross-entropy and the last epoch's mean training loss.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(reshaped as the loop reshapes it) with the criterion, the optimizer and the train/test
sets as ``data``; ``nndx.Monitor(model, optimizer, every=10, loss_fn=criterion)`` around
the training loop, the loss computed through ``mon.loss_fn`` and logged where the script
prints it; after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_birnn"
SOURCE = Source(
    "yunjey/pytorch-tutorial", "tutorials/02-intermediate/bidirectional_recurrent_neural_network/main.py",
    "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT",
)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 8x8 digits read as 8 rows of 8 pixels, 10 epochs)"),
        Variant(
            "softmax_output",
            "BiRNN.forward returns torch.softmax(self.fc(out[:, -1, :]), dim=1): probabilities go into "
            "nn.CrossEntropyLoss, which applies log_softmax again, so the loss cannot fall below ~1.46 and its "
            "gradients shrink as the model grows confident",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10",
             "https://github.com/ariecattan/SciCo/issues/2",
             "https://github.com/NaJaeMin92/pytorch-DANN/issues/7"),
            Measure("test_acc", "test accuracy at least 5 points below the healthy run's: 84.4 against 94.7 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "missing_zero_grad",
            "optimizer.zero_grad() left out of the training loop: every backward adds to the gradients of all "
            "the steps before, and Adam steps along their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/fchollet/deep-learning-with-python-notebooks/issues/293",
             "https://github.com/Miraclelucy/dive_into_deep_learning/issues/6"),
            Measure("test_acc", "test accuracy at least 5 points below the healthy run's: 27.8 against 94.7 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
    )
}

sequence_length = 8
input_size = 8
hidden_size = 128
num_layers = 2
num_classes = 10
batch_size = 100
num_epochs = 10
learning_rate = 0.003
log_every = 5
device = torch.device("cpu")


class BiRNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int, num_classes: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(hidden_size * 2, num_classes)  # 2 for bidirection
        self.softmax_output = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = torch.zeros(self.num_layers * 2, x.size(0), self.hidden_size).to(device)
        c0 = torch.zeros(self.num_layers * 2, x.size(0), self.hidden_size).to(device)
        out, _ = self.lstm(x, (h0, c0))
        out = self.fc(out[:, -1, :])
        if self.softmax_output:
            out = torch.softmax(out, dim=1)
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    to_images = digits.to_tensor  # transforms.ToTensor(): (N, 1, H, W) in [0, 1]
    train_dataset = TensorDataset(to_images(tr_raw), tr_y)
    test_dataset = TensorDataset(to_images(te_raw), te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=batch_size, shuffle=False)

    model = BiRNN(input_size, hidden_size, num_layers, num_classes).to(device)
    model.softmax_output = variant == "softmax_output"
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffling alone
        first_images, first_labels = next(iter(train_loader))
    probe_batch = (first_images.reshape(-1, sequence_length, input_size), first_labels)
    splits = (train_dataset.tensors[0].reshape(-1, sequence_length, input_size), tr_y,
              test_dataset.tensors[0].reshape(-1, sequence_length, input_size), te_y)  # fmt: skip
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    total_step = len(train_loader)
    epoch_losses: list[float] = []
    for epoch in range(num_epochs):
        running = []
        for i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, sequence_length, input_size).to(device)
            labels = labels.to(device)

            outputs = model(images)
            loss = mon.loss_fn(outputs, labels)

            if variant != "missing_zero_grad":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running.append(loss.item())

            if (i + 1) % log_every == 0:
                nx.timed(lambda: mon.log(loss))  # noqa: B023 - where the script prints the loss
                _ = "Epoch [{}/{}], Step [{}/{}], Loss: {:.4f}".format(
                    epoch + 1, num_epochs, i + 1, total_step, loss.item())
        epoch_losses.append(sum(running) / len(running))

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    with torch.no_grad():
        correct = 0
        total = 0
        test_loss = 0.0
        for images, labels in test_loader:
            images = images.reshape(-1, sequence_length, input_size).to(device)
            labels = labels.to(device)
            outputs = model(images)
            test_loss += nn.functional.cross_entropy(outputs, labels, reduction="sum").item()
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    return {"test_acc": 100 * correct / total, "test_loss": test_loss / total,
            "final_train_loss": epoch_losses[-1], "first_epoch_loss": epoch_losses[0]}  # fmt: skip
