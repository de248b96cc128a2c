"""Port of bentrevett/pytorch-image-classification, ``2_lenet.ipynb``: LeNet on MNIST with the
notebook's own normalisation (mean and std computed from the training images), a 90/10
train/validation split, ``nn.CrossEntropyLoss``, Adam, and its ``train``/``evaluate`` functions.

Source: github.com/bentrevett/pytorch-image-classification, ``2_lenet.ipynb`` at commit
33c9cfdb9097bc65b5800c1996f199f0ba520888 (MIT, Copyright (c) 2018 Ben Trevett). Written anew
from the facts of that notebook; no code copied.

Kept: ``SEED = 1234`` seeding (``random``, ``np.random``, ``torch.manual_seed``); the
normalisation statistics ``mean = train_data.data.float().mean() / 255`` and ``std =
train_data.data.float().std() / 255`` over the raw 0..255 training pixels; the train
transforms ``RandomRotation(5, fill=(0,))``, ``RandomCrop(28, padding=2)``, ``ToTensor``,
``Normalize(mean, std)`` and the test transforms ``ToTensor`` + ``Normalize``; ``VALID_RATIO =
0.9`` with ``data.random_split`` and the validation split given the test transforms;
``BATCH_SIZE = 64`` (shuffled train loader, unshuffled valid/test loaders); ``LeNet``:
``conv1`` (1->6, 5x5) -> ``F.max_pool2d(2)`` -> ``F.relu`` -> ``conv2`` (6->16, 5x5) ->
``F.max_pool2d(2)`` -> ``F.relu`` -> ``view(batch, -1)`` (256, kept as ``h``) -> ``fc_1``
(256->120) -> ``F.relu`` -> ``fc_2`` (120->84) -> ``F.relu`` -> ``fc_3`` (84->10), returning
``(x, h)``; ``optim.Adam(model.parameters())`` (lr 1e-3); ``calculate_accuracy`` (argmax with
keepdim, ``eq`` against ``y.view_as``, divided by the batch size); ``train`` (``model.train()``,
per batch ``zero_grad``, ``y_pred, _ = model(x)``, loss, accuracy, ``backward``, ``step``, epoch
means of ``loss.item()``/``acc.item()`` over ``len(iterator)``); ``evaluate`` (``model.eval()``,
``torch.no_grad()``); the epoch loop keeping the weights of the best validation loss
(``torch.save``/``load_state_dict``, here a deep copy of the state dict) and the test
evaluation of those weights.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train -> 1,293 train /
144 valid, 360 test) instead of MNIST; 12 epochs instead of 20; the augmentation done on
tensors (a rotation by a uniform angle in [-5, 5] degrees through ``affine_grid`` /
``grid_sample`` with zero fill, then a random 28x28 crop of the image zero-padded by 2) in
place of torchvision's PIL transforms; no tqdm, plots, confusion matrix, PCA/t-SNE or
``imagine_digit``; CPU.

nndx, as the author would add it after reading nndx's README: the model returns ``(y_pred, h)``,
so nndx gets ``loss_fn(output, y) = criterion(output[0], y)``; a preflight ``nndx.probe`` on
the first training batch with the optimizer and the normalised train/valid tensors as
``data``; ``nndx.Monitor(model, optimizer, every=10)`` around the epoch loop, every batch's loss
logged in ``train`` and each epoch's validation loss logged as ``split="val"`` with its
accuracy; after training (best weights loaded) ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "bentrevett_lenet"
SOURCE = Source("bentrevett/pytorch-image-classification", "2_lenet.ipynb",
                "33c9cfdb9097bc65b5800c1996f199f0ba520888", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 upsampled digits, 12 epochs)"),
        Variant(
            "stats_not_divided_by_255",
            "the normalisation statistics are taken over the raw 0..255 pixels without the notebook's / 255 "
            "(mean = train_data.data.float().mean(), std = ...std()) and handed to Normalize after ToTensor, "
            "which has already scaled the pixels to [0, 1]: every input becomes about -mean/std plus a "
            "signal a hundred times smaller than the healthy one",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/choyingw/SynergyNet/issues/19",
             "https://github.com/batuhan3526/ResNet50_on_Cifar_100_Without_Transfer_Learning/issues/1",
             "https://github.com/timesler/facenet-pytorch/issues/89"),
            Measure("test_acc", "test accuracy at least 30 points below the healthy run's: 10.2 against 98.2 "
                    "healthy on seed 0 (the net never leaves chance)",
                    lambda healthy, buggy: not buggy > healthy - 30.0),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "LeNet.forward returns F.softmax(self.fc_3(x), dim=-1) (probabilities, as get_predictions wants) "
            "and nn.CrossEntropyLoss applies log-softmax to them again",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/doronharitan/human_activity_recognition_LRCN/issues/4",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32",
             "https://github.com/ariecattan/SciCo/issues/2"),
            Measure("final_train_acc", "last epoch's training accuracy at least 5 points below the healthy run's "
                    "(slowed learning): 86.5 against 95.2 healthy on seed 0 (test accuracy 95.8 against 98.2)",
                    lambda healthy, buggy: not buggy > healthy - 5.0),
        ),
    )
}

SEED, VALID_RATIO, BATCH_SIZE, EPOCHS, OUTPUT_DIM, SIDE = 1234, 0.9, 64, 12, 10, 28


# --------------------------------------------------------------------------- transforms (on tensors)


def train_transform(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """RandomRotation(5, fill=(0,)) then RandomCrop(28, padding=2), per image, on [0, 1] images."""
    n = x.shape[0]
    angle = (torch.rand(n, generator=gen) * 10 - 5) * math.pi / 180
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = cos, -sin, sin, cos
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")
    padded = F.pad(x, (2, 2, 2, 2))
    offs = torch.randint(0, 5, (n, 2), generator=gen)
    return torch.stack([padded[i, :, a : a + SIDE, b : b + SIDE] for i, (a, b) in enumerate(offs.tolist())])


# --------------------------------------------------------------------------- the notebook's model


class LeNet(nn.Module):
    def __init__(self, output_dim: int, softmax_out: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=1, out_channels=6, kernel_size=5)
        self.conv2 = nn.Conv2d(in_channels=6, out_channels=16, kernel_size=5)
        self.fc_1 = nn.Linear(16 * 4 * 4, 120)
        self.fc_2 = nn.Linear(120, 84)
        self.fc_3 = nn.Linear(84, output_dim)
        self.softmax_out = softmax_out

    def forward(self, x: torch.Tensor):
        x = self.conv1(x)
        x = F.max_pool2d(x, kernel_size=2)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, kernel_size=2)
        x = F.relu(x)
        x = x.view(x.shape[0], -1)
        h = x
        x = self.fc_1(x)
        x = F.relu(x)
        x = self.fc_2(x)
        x = F.relu(x)
        x = self.fc_3(x)
        if self.softmax_out:
            x = F.softmax(x, dim=-1)
        return x, h


def calculate_accuracy(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    top_pred = y_pred.argmax(1, keepdim=True)
    correct = top_pred.eq(y.view_as(top_pred)).sum()
    return correct.float() / y.shape[0]


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    random.seed(SEED + seed)
    np.random.seed(SEED + seed)
    torch.manual_seed(SEED + seed)

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    raw_up = (digits.upscaled(tr_raw, SIDE) * 255.0).round()  # train_data.data: 0..255 pixels
    if variant == "stats_not_divided_by_255":
        mean, std = raw_up.mean().item(), raw_up.std().item()
    else:
        mean, std = raw_up.mean().item() / 255, raw_up.std().item() / 255
    x_train_01 = digits.upscaled(tr_raw, SIDE)  # ToTensor: [0, 1]
    x_test = (digits.upscaled(te_raw, SIDE) - mean) / std  # test_transforms

    # data.random_split(train_data, [n_train, n_valid]); the valid part gets test_transforms
    n_train = int(len(tr_y) * VALID_RATIO)
    perm = torch.randperm(len(tr_y))
    tr_idx, va_idx = perm[:n_train], perm[n_train:]
    x_tr01, y_tr = x_train_01[tr_idx], tr_y[tr_idx]
    x_valid, y_valid = (x_train_01[va_idx] - mean) / std, tr_y[va_idx]

    model = LeNet(OUTPUT_DIM, softmax_out=variant == "softmax_before_cross_entropy")
    optimizer = torch.optim.Adam(model.parameters())
    criterion = nn.CrossEntropyLoss()

    def loss_fn(output, y: torch.Tensor) -> torch.Tensor:
        y_pred, _ = output
        return criterion(y_pred, y)

    aug_gen = torch.Generator().manual_seed(SEED + seed)
    shuffle_gen = torch.Generator().manual_seed(seed)

    def train_iterator():
        order = torch.randperm(len(y_tr), generator=shuffle_gen)
        for s in range(0, len(order), BATCH_SIZE):
            idx = order[s : s + BATCH_SIZE]
            yield (train_transform(x_tr01[idx], aug_gen) - mean) / std, y_tr[idx]

    def eval_iterator(x: torch.Tensor, y: torch.Tensor):
        return [(x[s : s + BATCH_SIZE], y[s : s + BATCH_SIZE]) for s in range(0, len(y), BATCH_SIZE)]

    n_batches = math.ceil(len(y_tr) / BATCH_SIZE)
    with torch.random.fork_rng():  # the probe batch: the train transforms on the first 64 images
        probe_batch = ((train_transform(x_tr01[:BATCH_SIZE], torch.Generator().manual_seed(0)) - mean) / std,
                       y_tr[:BATCH_SIZE])  # fmt: skip
    splits = ((x_tr01 - mean) / std, y_tr, x_valid, y_valid)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    def run_train() -> tuple[float, float]:
        epoch_loss = epoch_acc = 0.0
        model.train()
        for x, y in train_iterator():
            optimizer.zero_grad()
            y_pred, _ = model(x)
            loss = criterion(y_pred, y)
            acc = calculate_accuracy(y_pred, y)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            epoch_loss += loss.item()
            epoch_acc += acc.item()
        return epoch_loss / n_batches, epoch_acc / n_batches

    def evaluate(iterator) -> tuple[float, float]:
        epoch_loss = epoch_acc = 0.0
        model.eval()
        with torch.no_grad():
            for x, y in iterator:
                y_pred, _ = model(x)
                loss = criterion(y_pred, y)
                acc = calculate_accuracy(y_pred, y)
                epoch_loss += loss.item()
                epoch_acc += acc.item()
        return epoch_loss / len(iterator), epoch_acc / len(iterator)

    best_valid_loss, best_state = float("inf"), None
    train_loss = train_acc = valid_loss = valid_acc = float("nan")
    for _epoch in range(EPOCHS):
        train_loss, train_acc = run_train()
        valid_loss, valid_acc = evaluate(eval_iterator(x_valid, y_valid))
        nx.timed(lambda: mon.log(valid_loss, split="val", accuracy=valid_acc))  # noqa: B023
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            best_state = copy.deepcopy(model.state_dict())  # torch.save(model.state_dict(), 'tut2-model.pt')
    model.load_state_dict(best_state)

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer, data=splits)

    test_loss, test_acc = evaluate(eval_iterator(x_test, te_y))
    return {"test_acc": 100.0 * test_acc, "test_loss": test_loss, "best_valid_loss": best_valid_loss,
            "final_train_loss": train_loss, "final_train_acc": 100.0 * train_acc,
            "final_valid_acc": 100.0 * valid_acc, "input_mean": mean, "input_std": std}  # fmt: skip
