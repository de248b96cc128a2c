"""Port of yunjey/pytorch-tutorial's convolutional neural network: a two-layer ConvNet
(conv 5x5 -> BatchNorm2d -> ReLU -> max-pool, twice, then one Linear) trained with Adam on
cross-entropy, tested in ``model.eval()`` mode.

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/02-intermediate/convolutional_neural_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 Yunjey Choi). Written anew
from the facts of that file; no code copied.

Kept: ``ConvNet``: ``layer1 = Conv2d(1, 16, 5, stride 1, padding 2), BatchNorm2d(16), ReLU,
MaxPool2d(2, 2)``; ``layer2 = Conv2d(16, 32, 5, 1, 2), BatchNorm2d(32), ReLU, MaxPool2d(2, 2)``;
``out.reshape(out.size(0), -1)`` into ``Linear(.., num_classes)``; ``nn.CrossEntropyLoss``;
``torch.optim.Adam(lr=0.001)``; batch size 100 with a shuffling train loader and an unshuffled
test loader; images through ``ToTensor`` only (pixels in [0, 1], no Normalize); the loop:
forward, loss, ``zero_grad``, ``backward``, ``step``; the test: ``model.eval()``, ``no_grad``,
``torch.max(outputs.data, 1)`` accuracy over the test loader.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of MNIST's 28x28, so the
feature map after two pools is 2x2 and the Linear is ``Linear(2*2*32, 10)``; 10 epochs
instead of 5 (15 batches an epoch instead of 600); CPU; no checkpoint saved.
Measure only (not in the program): the test loss (mean cross-entropy over the test set, in
whatever mode the test runs) next to the program's test accuracy, and the final epoch's mean
train loss.

nndx, as the author would add it after the README: a preflight ``nndx.probe(model, first
batch, criterion, optimizer=optimizer, data=(train, test))`` before training;
``nndx.Monitor(model, optimizer, every=10)`` around the loop, every batch's loss logged where
the program prints it; at the end of the script (after the test, where the checkpoint is
saved) ``nndx.probe(..., monitor=mon)`` on the same first batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_cnn"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/02-intermediate/convolutional_neural_network/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 8x8 digits, 10 epochs)"),
        Variant(
            "zero_grad_forgotten",
            "optimizer.zero_grad() left out of the loop: every backward adds its gradient to all the earlier "
            "batches' gradients, so Adam steps along the running sum of every gradient since the start",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/wenet-e2e/wekws/pull/73",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's",
                    lambda healthy, buggy: buggy <= healthy - 10.0),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "the ConvNet ends in nn.Softmax(dim=1) and its probabilities go into nn.CrossEntropyLoss, which "
            "applies log-softmax again: the loss is bounded below far above zero and its gradients shrink",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),
            ("https://github.com/ariecattan/SciCo/issues/2",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32",
             "https://github.com/nishnik/Deep-Semantic-Similarity-Model-PyTorch/issues/2"),
            Measure("final_train_loss", "final epoch's mean train loss at least 0.5 above the healthy run's",
                    lambda healthy, buggy: buggy >= healthy + 0.5),
        ),
    )
}

NUM_EPOCHS, NUM_CLASSES, BATCH_SIZE, LEARNING_RATE = 10, 10, 100, 0.001


class ConvNet(nn.Module):
    def __init__(self, num_classes: int = 10, softmax_out: bool = False) -> None:
        super().__init__()
        self.layer1 = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2))
        self.layer2 = nn.Sequential(
            nn.Conv2d(16, 32, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2))
        self.fc = nn.Linear(2 * 2 * 32, num_classes)
        self.softmax = nn.Softmax(dim=1) if softmax_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer1(x)
        out = self.layer2(out)
        out = out.reshape(out.size(0), -1)
        out = self.fc(out)
        if self.softmax is not None:
            out = self.softmax(out)
        return out


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)  # transforms.ToTensor()
    train_dataset, test_dataset = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)
    loader_gen = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(dataset=train_dataset, batch_size=BATCH_SIZE, shuffle=True, generator=loader_gen)
    test_loader = DataLoader(dataset=test_dataset, batch_size=BATCH_SIZE, shuffle=False)

    model = ConvNet(NUM_CLASSES, softmax_out=variant == "softmax_before_cross_entropy")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    first_batch = (x_train[:BATCH_SIZE], tr_y[:BATCH_SIZE])
    splits = (x_train, tr_y, x_test, te_y)
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses: list[float] = []
    for _epoch in range(NUM_EPOCHS):
        batch_losses = []
        for images, labels in train_loader:
            outputs = model(images)
            loss = criterion(outputs, labels)
            if variant != "zero_grad_forgotten":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023 - where the tutorial prints the loss
            batch_losses.append(loss.item())
        epoch_losses.append(sum(batch_losses) / len(batch_losses))

    # Test the model
    model.eval()  # eval mode (batchnorm uses moving mean/variance instead of mini-batch mean/variance)
    test_loss_sum = 0.0
    with torch.no_grad():
        correct = 0
        total = 0
        for images, labels in test_loader:
            outputs = model(images)
            test_loss_sum += criterion(outputs, labels).item() * labels.size(0)  # measure only
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    test_acc = 100 * correct / total

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"test_acc": test_acc, "test_loss": test_loss_sum / total, "final_train_loss": epoch_losses[-1],
            "first_epoch_loss": epoch_losses[0]}  # fmt: skip
