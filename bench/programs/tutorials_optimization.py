"""Port of pytorch/tutorials' "Optimizing Model Parameters" page (Learn the Basics): a
``NeuralNetwork`` (``nn.Flatten`` and a Linear-ReLU stack) trained on FashionMNIST with
``nn.CrossEntropyLoss`` and plain SGD at ``lr=1e-3``, by the page's ``train_loop`` and ``test_loop``.

Source: github.com/pytorch/tutorials, ``beginner_source/basics/optimization_tutorial.py`` at commit
009a87b0ec0b432889e865e55d3ae9e3912c306e (BSD-3-Clause, Copyright (c) 2017-2022 PyTorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``NeuralNetwork`` (``nn.Flatten()``; ``Linear(28*28, 512)``, ReLU, ``Linear(512, 512)``,
ReLU, ``Linear(512, 10)``; returns the logits), default PyTorch init; images through
``ToTensor`` (pixels in [0, 1], no normalisation); ``DataLoader(training_data, batch_size=64)``
and ``DataLoader(test_data, batch_size=64)`` as the page builds them (no ``shuffle``);
``learning_rate = 1e-3``, ``batch_size = 64``; ``nn.CrossEntropyLoss()``;
``torch.optim.SGD(model.parameters(), lr=learning_rate)``; ``train_loop`` (``model.train()``;
per batch: ``pred = model(X)``, ``loss = loss_fn(pred, y)``, ``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``; logging every 100 batches); ``test_loop``
(``model.eval()``, ``torch.no_grad()``, summed per-batch loss divided by the number of batches,
argmax accuracy over the set); the epoch loop calling both.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train / 360 test) instead
of FashionMNIST (60,000 / 10,000); hidden width 256 instead of 512; 80 epochs of 23 batches
(1,840 SGD steps) instead of 10 epochs of 938 (9,380 steps), so the page's lr=1e-3 has room to
move the loss (healthy: 63.6% test accuracy, about the page's own result after 10 epochs); no
printing (the logging points are where nndx logs); CPU.
Measure only (not in the program): ``test_loop``'s numbers of the last epoch, the mean train loss
of the last epoch and the share of test digits predicted as class 9.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch with the
``CrossEntropyLoss`` and the SGD, the train/test tensors as ``data``; ``nndx.Monitor(model,
optimizer)`` around the epoch loop, ``mon.log(loss)`` after every step of ``train_loop`` and
``mon.log(test_loss, split="val", accuracy=correct)`` after each ``test_loop``; after training
``nndx.probe(..., monitor=mon)`` on the same batch, then ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "tutorials_optimization"
SOURCE = Source("pytorch/tutorials", "beginner_source/basics/optimization_tutorial.py",
                "009a87b0ec0b432889e865e55d3ae9e3912c306e", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the page as published (shrunk: 28x28 digits, width 256, 80 epochs of 23 batches)"),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() is left out of train_loop: every loss.backward() adds its gradient to the "
            "sum of all earlier ones, so each SGD step follows the running sum of every past batch's gradient",
            (C.MISSING_ZERO_GRAD,),
            ("https://stackoverflow.com/questions/48001598/why-do-we-need-to-call-zero-grad-in-pytorch",
             "https://twitter.com/karpathy/status/1013244313327681536 (common mistake 3: forgot .zero_grad())",
             "https://discuss.pytorch.org/t/why-do-we-need-to-set-the-gradients-manually-to-zero-in-pytorch/4903"),
            Measure("test_loss", "test_loop's average loss of the last epoch at least 1.5x the healthy run's: 8.30 "
                    "against 2.09 on seed 0 (the summed gradients act as an ever-growing step: the net swings "
                    "to overconfident, test accuracy 97.5 against 63.6)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "unshuffled_sorted_data",
            "the training set arrives sorted by class (as torchvision's ImageFolder lists it) and the page's "
            "DataLoader(training_data, batch_size=64) has no shuffle=True: every epoch walks the classes in "
            "blocks, 0s first and 9s last, so each block pulls the net toward one class",
            (C.UNSHUFFLED_DATA,),
            ("https://github.com/joaoamcarvalho/mpd-public/issues/6 (train DataLoader missing shuffle=True)",
             "https://github.com/zzangjinsun/NLSPN_ECCV20/issues/24 (shuffle=False in training data loader?)",
             "https://github.com/ruotianluo/self-critical.pytorch/issues/153"),
            Measure("test_pred_last_class_share", "share of test digits the trained net calls a 9 (the class "
                    "trained last each epoch) at least 1.5x the healthy run's: 0.414 against 0.214 on seed 0 "
                    "(test accuracy 52.2 against 63.6)", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

LEARNING_RATE = 1e-3
BATCH_SIZE = 64
EPOCHS = 80
HIDDEN = 256
SIDE = 28


class NeuralNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(SIDE * SIDE, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, SIDE), digits.upscaled(te_raw, SIDE)  # ToTensor: [0, 1]
    if variant == "unshuffled_sorted_data":  # an ImageFolder-style dataset: listed class by class
        order = torch.argsort(tr_y, stable=True)
        x_train, tr_y = x_train[order], tr_y[order]
    training_data, test_data = TensorDataset(x_train, tr_y), TensorDataset(x_test, te_y)

    train_dataloader = DataLoader(training_data, batch_size=BATCH_SIZE)
    test_dataloader = DataLoader(test_data, batch_size=BATCH_SIZE)

    model = NeuralNetwork()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    first_batch = next(iter(train_dataloader))
    nx.preflight(model, first_batch, loss_fn, optimizer=optimizer, data=(x_train, tr_y, x_test, te_y))
    mon = nx.monitor(model, optimizer)

    train_losses: list[float] = []

    def train_loop(dataloader, model, loss_fn, optimizer) -> None:
        model.train()
        for batch, (X, y) in enumerate(dataloader):
            pred = model(X)
            loss = loss_fn(pred, y)

            if variant != "no_zero_grad":
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            nx.timed(lambda: mon.log(loss))  # noqa: B023 - where the page prints the loss
            train_losses.append(loss.item())

    def test_loop(dataloader, model, loss_fn) -> tuple[float, float]:
        model.eval()
        size = len(dataloader.dataset)
        num_batches = len(dataloader)
        test_loss, correct = 0.0, 0.0
        with torch.no_grad():
            for X, y in dataloader:
                pred = model(X)
                test_loss += loss_fn(pred, y).item()
                correct += (pred.argmax(1) == y).type(torch.float).sum().item()
        test_loss /= num_batches
        correct /= size
        return test_loss, correct

    test_loss = correct = float("nan")
    n_batches = len(train_dataloader)
    for _t in range(EPOCHS):
        train_loop(train_dataloader, model, loss_fn, optimizer)
        test_loss, correct = test_loop(test_dataloader, model, loss_fn)
        nx.timed(lambda: mon.log(test_loss, split="val", accuracy=correct))  # noqa: B023

    nx.finish(mon, model, first_batch, loss_fn, optimizer=optimizer, data=(x_train, tr_y, x_test, te_y))

    last_epoch = train_losses[-n_batches:]
    model.eval()
    with torch.no_grad():  # measure only: how many test digits the net calls a 9 (the last class block)
        last_class_share = (model(x_test).argmax(1) == 9).float().mean().item()
    return {"test_acc": 100.0 * correct, "test_loss": test_loss, "test_pred_last_class_share": last_class_share,
            "last_epoch_train_loss": sum(last_epoch) / len(last_epoch),
            "first_batch_loss": train_losses[0]}  # fmt: skip
