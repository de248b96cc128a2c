"""Port of dougbrion's pytorch-classification-uncertainty: evidential deep learning (Sensoy et
al. 2018) on MNIST: a LeNet whose outputs become Dirichlet evidence through a ReLU, trained
on one-hot targets with the expected-MSE evidential loss plus a KL regulariser annealed in
over the epochs, Adam with weight decay and a StepLR.

Source: github.com/dougbrion/pytorch-classification-uncertainty, ``train.py``, ``losses.py``,
``helpers.py``, ``lenet.py``, ``main.py`` and ``data.py`` at commit
bed225bd20dc4ae88ded9be2d88bdd52e14fd990 (the repository's HEAD; MIT, Copyright (c) 2019
Douglas Brion). Written anew from the facts of those files; no code copied.

Kept: the README's training command ``main.py --train --dropout --uncertainty --mse``:
``LeNet(dropout=True)`` = ``Conv2d(1, 20, 5)``, ``Conv2d(20, 50, 5)`` (each followed by
``F.relu(F.max_pool2d(x, 1))``, a pool of size 1), flatten, ``Linear(., 500)``, ReLU,
``F.dropout(training=self.training)``, ``Linear(500, 10)``; ``edl_mse_loss``:
``relu_evidence`` (``F.relu``), ``alpha = evidence + 1``, the expected squared error
``sum((y - alpha / S) ** 2) + sum(alpha * (S - alpha) / (S * S * (S + 1)))`` plus
``min(1, epoch / annealing_step) * KL(Dir(alpha_tilde) || Dir(1))`` with ``alpha_tilde =
(alpha - 1) * (1 - y) + 1`` (the repository's ``kl_divergence``, lgamma/digamma terms), the
mean over the batch, ``annealing_step`` 10; targets ``one_hot_embedding`` (``torch.eye(10)
[labels]``); ``Adam(lr=1e-3, weight_decay=0.005)``; ``StepLR(step_size=7, gamma=0.1)``
stepped once per epoch after the train phase; ``train_model``: per epoch a ``train`` phase
(``model.train()``) and a ``val`` phase (``model.eval()``), each batch ``zero_grad``, the
forward under ``set_grad_enabled(phase == "train")``, ``preds = argmax(outputs)``, the
criterion called as ``criterion(outputs, y.float(), epoch, num_classes, 10, device)``,
backward and step in the train phase; the best val accuracy's weights deep-copied and
loaded back at the end; ``ToTensor()`` pixels in [0, 1], no normalisation.
Shrunk: scikit-learn's 8x8 digits resized to 16x16 (1,437 train, 360 val) instead of
28x28 MNIST (60,000 / 10,000), so ``fc1`` is ``Linear(50 * 8 * 8, 500)`` instead of
``Linear(20000, 500)``; batches of 24 instead of 1,000 (60 steps an epoch, as the
original's MNIST epoch has); 15 epochs instead of the README's 50 (the StepLR's 7 and the
annealing's 10 epochs kept); no rotating-digit plots or checkpoints. On this small data
the healthy run ends near 0.84 val accuracy, not MNIST's 0.99: with ``relu_evidence`` a
class whose output goes negative for every input gets no gradient again, and one or two
classes end with no evidence (the ReLU-evidence trap of EDL; the program as written).
Measure only (not in the program): the returned (best) model in eval mode on the val
split: accuracy, and the mean uncertainty ``u = K / S`` on the correctly and on the wrongly
classified digits, as the repository's ``test.py`` computes ``u``.

nndx, as the author would add it: the criterion takes the epoch and the class count, so
the author hands nndx ``loss_fn(outputs, y) = edl_mse_loss(outputs, y, epoch, 10, 10,
device)`` at the current epoch (0 for the preflight, the last one after training) with the
first training batch as ``(inputs, one_hot(labels))``, as the loop feeds it; a preflight
``nndx.probe`` with the optimizer, ``nndx.Monitor(model, optimizer)`` around
``train_model`` with every train batch's loss and accuracy logged and each val phase's
loss and accuracy logged as ``split="val"``, and after training ``nndx.probe(...,
monitor=mon)``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "evidential"
SOURCE = Source("dougbrion/pytorch-classification-uncertainty", "train.py",
                "bed225bd20dc4ae88ded9be2d88bdd52e14fd990", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the README's --train --dropout --uncertainty --mse run (shrunk: 16x16 digits, 15 "
                           "epochs, batches of 24)"),  # fmt: skip
        Variant(
            "log_softmax_head",
            "LeNet.forward ends with F.log_softmax(x, dim=1), as the usual MNIST classifier it was adapted from "
            "does: relu_evidence of log-probabilities (all <= 0) is zero everywhere, alpha is 1 for every class "
            "and no gradient reaches the network",
            (C.WRONG_OUTPUT_ACTIVATION, C.DEAD_RELU),
            ("https://github.com/chelsea0x3b/dfdx/issues/486",
             "https://github.com/ProteomicsML/ProteomicsML/pull/203",
             "https://github.com/jvargasmu/population_estimation/issues/68"),
            Measure("val_accuracy", "val accuracy of the returned model at least 0.3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "steplr_per_batch",
            "exp_lr_scheduler.step() called after every optimizer.step() instead of once per epoch: "
            "StepLR(step_size=7, gamma=0.1) meant in epochs divides the LR by 10 every 7 batches, 1e-3 to 1e-7 "
            "within the second epoch",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/1",
             "https://github.com/pytorch/vision/issues/1261",
             "https://github.com/pytorch/pytorch/issues/3814"),
            Measure("val_accuracy", "val accuracy of the returned model at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

NUM_CLASSES = 10
EPOCHS = 15
BATCH = 24
SIDE = 16
ANNEALING_STEP = 10


# --------------------------------------------------------------------------- helpers.py


def get_device() -> torch.device:
    return torch.device("cpu")


def one_hot_embedding(labels: torch.Tensor, num_classes: int = 10) -> torch.Tensor:
    y = torch.eye(num_classes)
    return y[labels]


# --------------------------------------------------------------------------- lenet.py


class LeNet(nn.Module):
    def __init__(self, dropout: bool = False, log_softmax: bool = False) -> None:
        super().__init__()
        self.use_dropout = dropout
        self.log_softmax = log_softmax  # the bug's head
        self.conv1 = nn.Conv2d(1, 20, kernel_size=5)
        self.conv2 = nn.Conv2d(20, 50, kernel_size=5)
        self.fc1 = nn.Linear(50 * (SIDE - 8) * (SIDE - 8), 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 1))
        x = F.relu(F.max_pool2d(self.conv2(x), 1))
        x = x.view(x.size()[0], -1)
        x = F.relu(self.fc1(x))
        if self.use_dropout:
            x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        if self.log_softmax:
            return F.log_softmax(x, dim=1)
        return x


# --------------------------------------------------------------------------- losses.py


def relu_evidence(y: torch.Tensor) -> torch.Tensor:
    return F.relu(y)


def kl_divergence(alpha: torch.Tensor, num_classes: int, device=None) -> torch.Tensor:
    ones = torch.ones([1, num_classes], dtype=torch.float32, device=device)
    sum_alpha = torch.sum(alpha, dim=1, keepdim=True)
    first_term = (torch.lgamma(sum_alpha) - torch.lgamma(alpha).sum(dim=1, keepdim=True)
                  + torch.lgamma(ones).sum(dim=1, keepdim=True) - torch.lgamma(ones.sum(dim=1, keepdim=True)))
    second_term = (alpha - ones).mul(torch.digamma(alpha) - torch.digamma(sum_alpha)).sum(dim=1, keepdim=True)
    return first_term + second_term  # fmt: skip


def loglikelihood_loss(y: torch.Tensor, alpha: torch.Tensor, device=None) -> torch.Tensor:
    S = torch.sum(alpha, dim=1, keepdim=True)
    loglikelihood_err = torch.sum((y - (alpha / S)) ** 2, dim=1, keepdim=True)
    loglikelihood_var = torch.sum(alpha * (S - alpha) / (S * S * (S + 1)), dim=1, keepdim=True)
    return loglikelihood_err + loglikelihood_var


def mse_loss(y, alpha, epoch_num, num_classes, annealing_step, device=None) -> torch.Tensor:
    loglikelihood = loglikelihood_loss(y, alpha, device=device)
    annealing_coef = torch.min(torch.tensor(1.0, dtype=torch.float32),
                               torch.tensor(epoch_num / annealing_step, dtype=torch.float32))  # fmt: skip
    kl_alpha = (alpha - 1) * (1 - y) + 1
    kl_div = annealing_coef * kl_divergence(kl_alpha, num_classes, device=device)
    return loglikelihood + kl_div


def edl_mse_loss(output, target, epoch_num, num_classes, annealing_step, device=None) -> torch.Tensor:
    evidence = relu_evidence(output)
    alpha = evidence + 1
    return torch.mean(mse_loss(target, alpha, epoch_num, num_classes, annealing_step, device=device))


# --------------------------------------------------------------------------- train.py


def train_model(model, dataloaders, num_classes, criterion, optimizer, scheduler=None, num_epochs=25, device=None,
                uncertainty=False, *, nx: Nndx, mon, per_batch_scheduler: bool = False):  # fmt: skip
    best_model_wts = copy.deepcopy(model.state_dict())
    best_acc = 0.0
    losses = {"loss": [], "phase": [], "epoch": []}
    accuracy = {"accuracy": [], "phase": [], "epoch": []}
    for epoch in range(num_epochs):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            running_loss = 0.0
            running_corrects = 0.0
            for inputs, labels in dataloaders[phase]:
                inputs = inputs.to(device)
                labels = labels.to(device)
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    if uncertainty:
                        y = one_hot_embedding(labels, num_classes).to(device)
                        outputs = model(inputs)
                        _, preds = torch.max(outputs, 1)
                        loss = criterion(outputs, y.float(), epoch, num_classes, ANNEALING_STEP, device)
                        match = torch.reshape(torch.eq(preds, labels).float(), (-1, 1))
                        acc = torch.mean(match)
                    else:
                        outputs = model(inputs)
                        _, preds = torch.max(outputs, 1)
                        loss = criterion(outputs, labels)
                        acc = torch.mean((preds == labels).float())
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                        if per_batch_scheduler and scheduler is not None:
                            scheduler.step()  # the bug
                        nx.timed(lambda: mon.log(loss, accuracy=float(acc)))  # noqa: B023
                running_loss += loss.item() * inputs.size(0)
                running_corrects += torch.sum(preds == labels.data)
            if scheduler is not None and not per_batch_scheduler:
                if phase == "train":
                    scheduler.step()
            epoch_loss = running_loss / len(dataloaders[phase].dataset)
            epoch_acc = running_corrects.double() / len(dataloaders[phase].dataset)
            losses["loss"].append(epoch_loss)
            losses["phase"].append(phase)
            losses["epoch"].append(epoch)
            accuracy["accuracy"].append(epoch_acc.item())
            accuracy["epoch"].append(epoch)
            accuracy["phase"].append(phase)
            if phase == "val":
                nx.timed(lambda: mon.log(epoch_loss, split="val", accuracy=epoch_acc.item()))  # noqa: B023
            if phase == "val" and epoch_acc > best_acc:
                best_acc = epoch_acc
                best_model_wts = copy.deepcopy(model.state_dict())
    model.load_state_dict(best_model_wts)
    return model, (losses, accuracy)


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
    data_train = TensorDataset(digits.upscaled(tr_x, SIDE), tr_y)  # ToTensor(): [0, 1]
    data_val = TensorDataset(digits.upscaled(te_x, SIDE), te_y)
    dataloaders = {
        "train": DataLoader(data_train, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed)),
        "val": DataLoader(data_val, batch_size=BATCH),
    }
    num_classes = NUM_CLASSES
    model = LeNet(dropout=True, log_softmax=variant == "log_softmax_head")
    criterion = edl_mse_loss
    optimizer = optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.005)
    exp_lr_scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)
    device = get_device()

    def loss_at(epoch: int):
        return lambda outputs, y: criterion(outputs, y, epoch, num_classes, ANNEALING_STEP, device)

    first_x, first_y = data_train.tensors[0][:BATCH], data_train.tensors[1][:BATCH]
    probe_batch = (first_x, one_hot_embedding(first_y, num_classes))
    nx.preflight(model, probe_batch, loss_at(0), optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5)

    model, _metrics = train_model(model, dataloaders, num_classes, criterion, optimizer, scheduler=exp_lr_scheduler,
                                  num_epochs=EPOCHS, device=device, uncertainty=True, nx=nx, mon=mon,
                                  per_batch_scheduler=variant == "steplr_per_batch")  # fmt: skip

    nx.finish(mon, model, probe_batch, loss_at(EPOCHS - 1), optimizer=optimizer)
    return {**measure(model, data_val), "final_lr": optimizer.param_groups[0]["lr"]}


# --------------------------------------------------------------------------- measure only


def measure(model: LeNet, data_val: TensorDataset) -> dict[str, float]:
    model.eval()
    x, labels = data_val.tensors
    with torch.no_grad():
        outputs = model(x)
    preds = outputs.argmax(1)
    alpha = relu_evidence(outputs) + 1
    u = (NUM_CLASSES / alpha.sum(1))
    right = preds == labels
    return {
        "val_accuracy": float(right.float().mean()),
        "u_correct": float(u[right].mean()) if right.any() else float("nan"),
        "u_wrong": float(u[~right].mean()) if (~right).any() else float("nan"),
    }
