"""Port of rahulvigneswaran's Lottery-Ticket-Hypothesis-in-Pytorch: iterative magnitude pruning
with rewinding to the original initialisation (Frankle & Carbin 2019) of the ``fc1`` MLP.

Source: github.com/rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch, ``main.py`` and
``archs/mnist/fc1.py`` at commit 34a8c9678406a1c7dd0fec4c9f0d25d017be55fb (the repository's
HEAD; no licence stated: the repository has no LICENSE file). Written anew from the facts of
those files; no code copied.

Kept: ``fc1`` = ``Sequential(Linear(784, 300), ReLU(inplace=True), Linear(300, 100),
ReLU(inplace=True), Linear(100, 10))`` after ``torch.flatten(x, 1)``; ``weight_init``
(``xavier_normal_`` Linear weights, ``normal_`` biases) applied once, the initial state
deep-copied; ``make_mask`` (a numpy array of ones per ``weight``); ``Adam(model.parameters(),
weight_decay=1e-4)`` (default lr) for round 0, ``CrossEntropyLoss``; each later round:
``prune_by_percentile`` (per ``weight`` tensor, the ``percent`` percentile of the absolute
non-zero values; weights below it zeroed in the weights and the mask), then
``original_initialization`` (surviving weights back to their initial values times the mask,
biases back to their initial values) and a new ``Adam(lr=args.lr, weight_decay=1e-4)``;
per round ``end_iter`` epochs of ``test`` (every ``valid_freq=1`` epoch, before training;
``model.eval()``, ``torch.no_grad()``, argmax accuracy in percent) then ``train``
(``model.train()``, per batch ``zero_grad``, forward, loss, backward, the gradients of the
``weight`` tensors zeroed by numpy where the weight is (near) zero, ``optimizer.step()``),
the round's best accuracy kept; batches of 60 reshuffled every epoch; inputs through
``ToTensor`` and ``Normalize((0.1307,), (0.3081,))``; ``prune_type="lt"``, ``lr=1.2e-3``.
Fixed (the healthy program): the published gradient freeze tests ``tensor < EPS``, which
freezes every negative weight too; the healthy port uses ``abs(tensor) < EPS`` as issues #5
and #31 of the repository propose, and the published line is the ``negative_weights_frozen``
bug below.
Shrunk: scikit-learn's 8x8 digits resized to 28x28 (1,437 training and 360 test images)
instead of MNIST (60,000 / 10,000); 4 pruning rounds (full, then 3 prunes) of 35% instead of
35 rounds of 10% (27% of the weights left at the end instead of 2.5%); 5 epochs per round
instead of 100 (24 batches an epoch). No checkpoints, plots, dumps or TensorBoard.
Measure only (not in the program): the last round's best test accuracy (``bestacc[-1]``, the
number the program plots), its final accuracy, and the fraction of weights left.

nndx, as the author would add it: the program builds a new Adam each pruning round, so one
``nndx.Monitor(model, optimizer)`` per round around its epochs, each batch's loss logged
(earlier rounds' Monitors closed and diagnosed on their own, the last round's folded into
``nndx.probe(..., monitor=mon)`` on the first training batch); a preflight ``nndx.probe`` on
the first batch with the criterion and round 0's optimizer before training.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lottery_ticket"
SOURCE = Source("rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch", "main.py",
                "34a8c9678406a1c7dd0fec4c9f0d25d017be55fb",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "main.py with the gradient freeze on abs(weight) < EPS (shrunk: 4 rounds of 35%, "
                "5 epochs a round, 28x28 digits)"),
        Variant(
            "negative_weights_frozen",
            "the published gradient freeze np.where(tensor < EPS, 0, grad): every negative weight's gradient is "
            "zeroed along with the pruned ones, so about half of each layer never learns from the data (only "
            "Adam's weight decay moves it)",
            (C.FROZEN_PARAMETERS,),
            ("https://github.com/rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch/issues/5",
             "https://github.com/rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch/issues/31",
             "https://github.com/rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch/issues/7"),
            Measure("best_accuracy", "the last round's best test accuracy at least 2 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 2.0),
        ),
        Variant(
            "zero_grad_per_epoch",
            "optimizer.zero_grad() called once at the top of train() instead of per batch: every batch's gradient "
            "is added to all the earlier ones of the epoch before Adam steps on the sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/SharifiZarchi/Introduction_to_Machine_Learning/issues/55"),
            Measure("best_accuracy", "the last round's best test accuracy at least 2 points below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 2.0),
        ),
    )
}

LR, BATCH_SIZE, END_ITER, PRUNE_PERCENT, PRUNE_ITERATIONS, EPS = 1.2e-3, 60, 5, 35, 4, 1e-6


# --------------------------------------------------------------------------- archs/mnist/fc1.py


class fc1(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.classifier = nn.Sequential(
            nn.Linear(28 * 28, 300),
            nn.ReLU(inplace=True),
            nn.Linear(300, 100),
            nn.ReLU(inplace=True),
            nn.Linear(100, num_classes),
        )

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


# --------------------------------------------------------------------------- main.py


def weight_init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        init.xavier_normal_(m.weight.data)
        init.normal_(m.bias.data)


class Pruner:
    """main.py's globals (``model``, ``mask``) and the functions that use them."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.mask: list[np.ndarray] = []

    def make_mask(self) -> None:
        self.mask = [np.ones_like(p.data.cpu().numpy()) for n, p in self.model.named_parameters() if "weight" in n]

    def prune_by_percentile(self, percent: float) -> None:
        step = 0
        for name, param in self.model.named_parameters():
            if "weight" in name:
                tensor = param.data.cpu().numpy()
                alive = tensor[np.nonzero(tensor)]
                percentile_value = np.percentile(abs(alive), percent)
                new_mask = np.where(abs(tensor) < percentile_value, 0, self.mask[step])
                param.data = torch.from_numpy(tensor * new_mask).to(param.device)
                self.mask[step] = new_mask
                step += 1

    def original_initialization(self, initial_state_dict: dict) -> None:
        step = 0
        for name, param in self.model.named_parameters():
            if "weight" in name:
                param.data = torch.from_numpy(self.mask[step] * initial_state_dict[name].cpu().numpy()).to(param.device)
                step += 1
            if "bias" in name:
                param.data = initial_state_dict[name]


def train_epoch(model, batches, optimizer, criterion, variant: str, mon, nx: Nndx) -> float:
    model.train()
    if variant == "zero_grad_per_epoch":
        optimizer.zero_grad()
    for imgs, targets in batches:
        if variant != "zero_grad_per_epoch":
            optimizer.zero_grad()
        output = model(imgs)
        train_loss = criterion(output, targets)
        train_loss.backward()
        # Freezing pruned weights by making their gradients zero
        for name, p in model.named_parameters():
            if "weight" in name:
                tensor = p.data.cpu().numpy()
                grad_tensor = p.grad.data.cpu().numpy()
                frozen = tensor < EPS if variant == "negative_weights_frozen" else np.abs(tensor) < EPS
                grad_tensor = np.where(frozen, 0, grad_tensor)
                p.grad.data = torch.from_numpy(grad_tensor).to(p.device)
        optimizer.step()
        nx.timed(lambda: mon.log(train_loss))  # noqa: B023
    return train_loss.item()


@torch.no_grad()
def test(model, x_test, y_test) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(y_test) - len(y_test) % BATCH_SIZE, BATCH_SIZE):  # drop_last=True
        output = model(x_test[i : i + BATCH_SIZE])
        pred = output.data.max(1, keepdim=True)[1]
        correct += pred.eq(y_test[i : i + BATCH_SIZE].view_as(pred)).sum().item()
    return 100.0 * correct / len(y_test)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    shuffle = torch.Generator().manual_seed(seed + 1)
    x_train, y_train, x_test, y_test = digits.digit_images(seed)
    normalize = lambda imgs: (digits.upscaled(imgs, 28) - 0.1307) / 0.3081  # noqa: E731
    x_train, x_test = normalize(x_train), normalize(x_test)

    def epoch_batches():
        order = torch.randperm(len(y_train), generator=shuffle)
        return [(x_train[order[i : i + BATCH_SIZE]], y_train[order[i : i + BATCH_SIZE]])
                for i in range(0, len(order), BATCH_SIZE)]  # fmt: skip

    model = fc1()
    model.apply(weight_init)
    initial_state_dict = copy.deepcopy(model.state_dict())
    pruner = Pruner(model)
    pruner.make_mask()
    optimizer = torch.optim.Adam(model.parameters(), weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()

    probe_batch = (x_train[:BATCH_SIZE], y_train[:BATCH_SIZE])
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)

    bestacc = np.zeros(PRUNE_ITERATIONS)
    accuracy = 0.0
    for _ite in range(PRUNE_ITERATIONS):
        if _ite != 0:
            pruner.prune_by_percentile(PRUNE_PERCENT)
            pruner.original_initialization(initial_state_dict)
            optimizer = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=1e-4)
        mon = nx.monitor(model, optimizer, every=5)
        best_accuracy = 0.0
        for _iter in range(END_ITER):
            accuracy = test(model, x_test, y_test)
            best_accuracy = max(best_accuracy, accuracy)
            train_epoch(model, epoch_batches(), optimizer, criterion, variant, mon, nx)
        bestacc[_ite] = best_accuracy
        if _ite == PRUNE_ITERATIONS - 1:
            nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)
        else:
            nx.finish(mon)

    final_accuracy = test(model, x_test, y_test)  # measure only: after the last epoch
    weights = [p.data for n, p in model.named_parameters() if "weight" in n]
    left = sum(int((w != 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    return {"best_accuracy": float(bestacc[-1]), "round0_best_accuracy": float(bestacc[0]),
            "final_accuracy": final_accuracy, "weights_left": left}  # fmt: skip
