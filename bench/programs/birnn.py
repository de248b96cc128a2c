"""Port of yunjey/pytorch-tutorial's bidirectional recurrent neural network: a 2-layer
bidirectional LSTM reads an image row by row (each row one time step) and a Linear
classifies the last time step's output (the forward and the backward halves together).

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/02-intermediate/bidirectional_recurrent_neural_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 yunjey). Written anew from
the facts of that file; no code copied.

Kept: ``BiRNN`` (``nn.LSTM(input_size, hidden_size, num_layers, batch_first=True,
bidirectional=True)``, ``nn.Linear(hidden_size * 2, num_classes)``; ``forward`` sets zero
``h0``/``c0`` of shape ``(num_layers * 2, batch, hidden_size)`` on ``device``, runs the LSTM and
applies the Linear to ``out[:, -1, :]``); ``nn.CrossEntropyLoss``; ``torch.optim.Adam`` at
``learning_rate`` 0.003; the MNIST pipeline's shape (``transforms.ToTensor()`` images, a
shuffling train ``DataLoader`` and an unshuffled test ``DataLoader`` of ``batch_size`` 100);
the loop (``images.reshape(-1, sequence_length, input_size)``, forward, loss,
``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()``, the loss printed every
few steps); the test (``torch.no_grad()``, ``torch.max(outputs.data, 1)``, accuracy in percent;
the model is never put in ``eval()`` mode, as in the original, which has no dropout).
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test, 0..255 uint8 pixels as MNIST's raw
files) instead of MNIST, so ``sequence_length`` = ``input_size`` = 8 instead of 28;
``hidden_size`` 32 instead of 128; 12 epochs instead of 2 (15 steps an epoch instead of 600);
the loss printed every 5 steps instead of every 100; CPU; no checkpoint saved.
Measure only (not in the program): the test accuracy is also returned with the test
cross-entropy and the last epoch's mean train loss.

nndx, as the author would add it: ``nndx.probe`` before training on the first training batch
(reshaped as the loop reshapes it) with the ``CrossEntropyLoss``, the Adam optimizer and the
train/test images (reshaped) and labels as ``data``; ``nndx.Monitor(model, optimizer,
every=10)`` around the loop, the loss logged where the script prints it; after training
``nndx.probe(..., monitor=mon)`` on the same batch, and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "birnn"
SOURCE = Source(
    "yunjey/pytorch-tutorial", "tutorials/02-intermediate/bidirectional_recurrent_neural_network/main.py",
    "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT",
)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 8x8 digits read as 8 rows of 8, hidden 32, 12 epochs)"),
        Variant(
            "softmax_before_cross_entropy",
            "forward returns F.softmax(self.fc(out[:, -1, :]), dim=1) and the loop still feeds it to "
            "nn.CrossEntropyLoss, which applies log_softmax itself: the loss sees probabilities as logits, "
            "squeezed into [0, 1], and its gradient shrinks as the model grows confident",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/vinhkhuc/PyTorch-Mini-Tutorials/issues/1",
             "https://github.com/NaJaeMin92/pytorch-DANN/issues/7",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32"),
            Measure("test_acc", "test accuracy at least 5 points below the healthy run's: 81.1 against 93.3 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "zero_grad_missing",
            "optimizer.zero_grad() left out of the loop: every backward adds to the gradients of all the "
            "steps before, and Adam steps along the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/heartcored98/Standalone-DeepLearning/issues/11",
             "https://github.com/jcjohnson/pytorch-examples/issues/31"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's: 28.9 against 93.3 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
    )
}

device = torch.device("cpu")

# Hyper-parameters
sequence_length = 8
input_size = 8
hidden_size = 32
num_layers = 2
num_classes = 10
batch_size = 100
num_epochs = 12
learning_rate = 0.003
print_every = 5


class BiRNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int, num_classes: int,
                 softmax_output: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.softmax_output = softmax_output
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(hidden_size * 2, num_classes)  # 2 for bidirection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Set initial states
        h0 = torch.zeros(self.num_layers * 2, x.size(0), self.hidden_size).to(device)
        c0 = torch.zeros(self.num_layers * 2, x.size(0), self.hidden_size).to(device)
        # Forward propagate LSTM
        out, _ = self.lstm(x, (h0, c0))
        # Decode the hidden state of the last time step
        out = self.fc(out[:, -1, :])
        if self.softmax_output:  # the bug: probabilities handed to CrossEntropyLoss
            out = F.softmax(out, dim=1)
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    # transforms.ToTensor(): (N, 1, H, W) in [0, 1]
    tr_x, te_x = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)
    train_dataset, test_dataset = TensorDataset(tr_x, tr_y), TensorDataset(te_x, te_y)

    # Data loader
    train_loader = DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=batch_size, shuffle=False)

    model = BiRNN(input_size, hidden_size, num_layers, num_classes,
                  softmax_output=variant == "softmax_before_cross_entropy").to(device)  # fmt: skip

    # Loss and optimizer
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first_images, first_labels = next(iter(train_loader))
    probe_batch = (first_images.reshape(-1, sequence_length, input_size), first_labels)
    splits = (tr_x.reshape(-1, sequence_length, input_size), tr_y, te_x.reshape(-1, sequence_length, input_size), te_y)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    # Train the model
    total_step = len(train_loader)
    last_epoch_losses: list[float] = []
    for epoch in range(num_epochs):
        last_epoch_losses = []
        for i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, sequence_length, input_size).to(device)
            labels = labels.to(device)

            # Forward pass
            outputs = model(images)
            loss = criterion(outputs, labels)

            # Backward and optimize
            if variant != "zero_grad_missing":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            last_epoch_losses.append(loss.item())

            if (i + 1) % print_every == 0:
                nx.timed(lambda: mon.log(loss))  # noqa: B023
                _ = f"Epoch [{epoch + 1}/{num_epochs}], Step [{i + 1}/{total_step}], Loss: {loss.item():.4f}"

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    # Test the model
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

    return {"test_acc": 100.0 * correct / total, "test_loss": test_loss / total,
            "last_epoch_train_loss": sum(last_epoch_losses) / len(last_epoch_losses)}  # fmt: skip
