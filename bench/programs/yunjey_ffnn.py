"""Port of yunjey/pytorch-tutorial's feedforward neural network: a one-hidden-layer MLP
(784 -> 500 -> ReLU -> 10) classifying MNIST digits with CrossEntropyLoss and Adam, then a test
loop that counts the argmax hits.

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/01-basics/feedforward_neural_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 yunjey). Written anew from
the facts of that file; no code copied.

Kept: the hyper-parameters (``input_size = 784``, ``hidden_size = 500``, ``num_classes = 10``,
``num_epochs = 5``, ``batch_size = 100``, ``learning_rate = 0.001``); ``NeuralNet``
(``fc1 = Linear(784, 500)``, ``relu = ReLU()``, ``fc2 = Linear(500, 10)``, forward fc1 -> relu
-> fc2, logits out); ``criterion = CrossEntropyLoss()``; ``Adam(model.parameters(), lr)``; the
data pipeline: ``ToTensor`` images (pixels in [0, 1], no normalisation), a shuffled train loader
and an unshuffled test loader of batch 100; the loop: per batch ``images.reshape(-1, 28*28)``,
``outputs = model(images)``, ``loss = criterion(outputs, labels)``, ``zero_grad``, ``backward``,
``step``; the test loop under ``torch.no_grad()`` (``torch.max(outputs.data, 1)``, hits over
total; the model is never put in eval mode, as in the original, which has no dropout or
batch norm).
Shrunk/replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 in [0, 1] (1,437
training, 360 test images) in place of MNIST's 60,000/10,000, so an epoch is 15 steps; no
checkpoint saved; the per-100-step print is where the loss is logged, every step.

nndx, as the author would add it: a preflight ``nndx.probe(model, (images, labels), criterion,
optimizer=optimizer, data=(train images, train labels, test images, test labels))`` on the
first training batch (flattened as the loop flattens it); ``nndx.Monitor(model, optimizer,
every=10)`` around the loop, every batch's loss logged; after training, ``nndx.probe(...,
monitor=mon)`` on the same batch and data, and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_ffnn"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/01-basics/feedforward_neural_network/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "main.py as published (shrunk: 28x28 upsampled digits, 1,437 training images)"),
        Variant(
            "softmax_then_cross_entropy",
            "NeuralNet.forward ends in nn.Softmax(dim=1) (the 'probabilities' people add to a classifier) while "
            "the loss stays nn.CrossEntropyLoss, which applies log-softmax itself: the loss is taken on "
            "softmax(softmax(logits)), bounded below by about 1.46 and with shrunken gradients",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/shaoxiongji/federated-learning/issues/9",
             "https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10",
             "https://github.com/GiorgiaD/PEPITA/issues/1"),
            Measure("final_train_loss", "mean loss of the last epoch at least 0.5 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.5),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: every backward adds its gradient to the sum of all the "
            "earlier batches', so Adam steps along a running sum of stale gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/yastrebksv/TennisCourtDetector/issues/7",
             "https://github.com/wenet-e2e/wekws/pull/73",
             "https://github.com/snakers4/silero-vad/pull/699"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 10.0),
        ),
    )
}

input_size, hidden_size, num_classes = 784, 500, 10
num_epochs, batch_size, learning_rate = 5, 100, 0.001
SIDE = 28


class NeuralNet(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_classes: int, softmax: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, num_classes)
        self.softmax = nn.Softmax(dim=1) if softmax else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc1(x)
        out = self.relu(out)
        out = self.fc2(out)
        if self.softmax is not None:
            out = self.softmax(out)
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, SIDE), digits.upscaled(te_raw, SIDE)  # ToTensor: [0, 1]
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=batch_size, shuffle=False)

    model = NeuralNet(input_size, hidden_size, num_classes, softmax=variant == "softmax_then_cross_entropy")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    probe_batch = (x_train[:batch_size].reshape(-1, 28 * 28), tr_y[:batch_size])
    splits = (x_train.reshape(-1, 28 * 28), tr_y, x_test.reshape(-1, 28 * 28), te_y)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses: list[float] = []
    for _epoch in range(num_epochs):
        epoch_losses = []
        for _i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, 28 * 28)
            outputs = model(images)
            loss = criterion(outputs, labels)
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023 - where the original prints the loss
            epoch_losses.append(loss.item())

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer, data=splits)

    with torch.no_grad():
        correct = total = 0
        for images, labels in test_loader:
            images = images.reshape(-1, 28 * 28)
            outputs = model(images)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    return {"test_acc": 100.0 * correct / total, "final_train_loss": sum(epoch_losses) / len(epoch_losses)}
