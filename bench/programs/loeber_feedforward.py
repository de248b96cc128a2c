"""Port of patrickloeber/pytorchTutorial, tutorial 13 (feed-forward net): ``NeuralNet``
(Linear-ReLU-Linear, no softmax at the end), ``CrossEntropyLoss`` and Adam at lr 0.001 on
MNIST, the images reshaped to vectors inside the loop.

Source: github.com/patrickloeber/pytorchTutorial, ``13_feedforward.py`` at commit
69637721ed9fa2ccf81a1093a928a52bbb591439 (MIT, Copyright (c) 2020 Patrick Loeber). Written anew
from the facts of that file; no code copied.

Kept: ``input_size = 784`` (28x28), ``hidden_size = 500``, ``num_classes = 10``,
``batch_size = 100``, ``learning_rate = 0.001``; ``transforms.ToTensor()`` images ([0, 1], no
normalisation); ``DataLoader(shuffle=True)`` for train, ``shuffle=False`` for test; the
script's ``next(iter(test_loader))`` look at a batch; ``NeuralNet``: ``l1 = nn.Linear(784,
500)``, ``relu = nn.ReLU()``, ``l2 = nn.Linear(500, 10)``, ``forward`` returns ``l2``'s output
("no activation and no softmax at the end"); ``nn.CrossEntropyLoss()``;
``torch.optim.Adam(model.parameters(), lr=learning_rate)``; the loop's order: ``images =
images.reshape(-1, 28*28)``, forward, loss, ``optimizer.zero_grad()``, ``loss.backward()``,
``optimizer.step()``; the test under ``torch.no_grad()``: ``torch.max(outputs.data, 1)``,
``100.0 * n_correct / n_samples``.
Replaced / shrunk: MNIST (60,000 + 10,000 images) by scikit-learn's 8x8 digits (1,437 train +
360 test), turned to tensors as ``ToTensor`` does and resized bilinearly to 28x28 so the
reshape and ``input_size = 784`` stay; ``num_epochs`` 2 -> 10 (2 epochs of MNIST are 1,200
steps; 10 epochs of 1,437 images are 150); the model's initial weights come from
``torch.manual_seed(seed)`` (the script sets no seed); no plots, no prints; CPU.
Measure only (not in the program): the test loss (``CrossEntropyLoss`` on the logits the
healthy model returns; on the model's output as it is) next to the script's test accuracy, and
the last epoch's mean train loss.

nndx, as the author would add it after the README: the model returns logits for
``CrossEntropyLoss``; the loop reshapes the images, so nndx gets ``criterion`` and the first
training batch reshaped as the loop reshapes it; a preflight ``nndx.probe`` with the
optimizer; ``nndx.Monitor(model, optimizer, every=10)`` around the loop, each step's loss
logged after ``optimizer.step()`` (where the script prints); after training ``nndx.probe(...,
monitor=mon, data=(X_train, y_train, X_test, y_test))`` (the images as vectors) and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "loeber_feedforward"
SOURCE = Source("patrickloeber/pytorchTutorial", "13_feedforward.py",
                "69637721ed9fa2ccf81a1093a928a52bbb591439", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the script as published (shrunk: 8x8 digits resized to 28x28, 10 epochs)"),
        Variant(
            "softmax_output",
            "forward ends with nn.Softmax(dim=1) on l2's output, and the probabilities go into "
            "nn.CrossEntropyLoss, which applies log_softmax again",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/NaJaeMin92/pytorch-DANN/issues/7",
             "https://github.com/doronharitan/human_activity_recognition_LRCN/issues/4",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32"),
            Measure("test_acc", "test accuracy at least 5 points below the healthy run's (the loss on "
                    "probabilities is bounded below, so the accuracy is compared)",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() left out of the loop: every backward adds to the gradients of all the "
            "steps before, and Adam steps along that running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/Miraclelucy/dive_into_deep_learning/issues/6",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_loss", "test loss at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
    )
}

INPUT_SIZE, HIDDEN_SIZE, NUM_CLASSES, NUM_EPOCHS, BATCH_SIZE, LEARNING_RATE = 784, 500, 10, 10, 100, 0.001


class NeuralNet(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_classes: int, softmax: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.l1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.l2 = nn.Linear(hidden_size, num_classes)
        self.softmax = nn.Softmax(dim=1) if softmax else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.l1(x)
        out = self.relu(out)
        out = self.l2(out)
        if self.softmax is not None:  # the bug: probabilities handed to CrossEntropyLoss
            out = self.softmax(out)
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, 28), digits.upscaled(te_raw, 28)  # ToTensor: [N, 1, 28, 28]
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(dataset=test_dataset, batch_size=BATCH_SIZE, shuffle=False)

    examples = iter(test_loader)
    example_data, example_targets = next(examples)  # the script plots these six digits

    model = NeuralNet(INPUT_SIZE, HIDDEN_SIZE, NUM_CLASSES, softmax=variant == "softmax_output")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    first_images, first_labels = next(iter(train_loader))
    probe_batch = (first_images.reshape(-1, 28 * 28), first_labels)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses: list[float] = []
    for _epoch in range(NUM_EPOCHS):
        epoch_losses = []
        for _i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, 28 * 28)
            outputs = model(images)
            loss = criterion(outputs, labels)
            if variant != "no_zero_grad":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_losses.append(loss.item())

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer,
              data=(x_train.reshape(-1, 28 * 28), tr_y, x_test.reshape(-1, 28 * 28), te_y))  # fmt: skip

    with torch.no_grad():
        n_correct = n_samples = 0
        test_loss = 0.0
        for images, labels in test_loader:
            images = images.reshape(-1, 28 * 28)
            outputs = model(images)
            _, predicted = torch.max(outputs.data, 1)
            n_samples += labels.size(0)
            n_correct += (predicted == labels).sum().item()
            test_loss += criterion(outputs, labels).item() * labels.size(0)
        acc = 100.0 * n_correct / n_samples
    return {"test_acc": acc, "test_loss": test_loss / n_samples,
            "train_loss": sum(epoch_losses) / len(epoch_losses)}  # fmt: skip
