"""Port of udacity/deep-learning-v2-pytorch's CIFAR-10 CNN solution: three 3x3 conv layers with
ReLU and 2x2 max pooling, dropout, two linear layers, ``CrossEntropyLoss`` and plain SGD at
0.01, trained with a train/validation split and the model saved whenever the validation loss
falls, then reloaded and tested.

Source: github.com/udacity/deep-learning-v2-pytorch,
``convolutional-neural-networks/cifar-cnn/cifar10_cnn_solution.ipynb`` at commit
c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written anew from
the facts of the notebook; no code copied.

Kept: ``Net``: ``conv1`` 3 -> 16, ``conv2`` 16 -> 32, ``conv3`` 32 -> 64 (3x3, padding 1), each
followed by ReLU and ``MaxPool2d(2, 2)``, ``x.view(-1, 64 * 4 * 4)``, ``Dropout(0.25)``,
``fc1`` 1024 -> 500 + ReLU, dropout, ``fc2`` 500 -> 10 (raw scores); ``nn.CrossEntropyLoss()``;
``optim.SGD(model.parameters(), lr=0.01)``; the data pipeline: ``train_transform`` =
RandomHorizontalFlip, RandomRotation(10), ToTensor, Normalize((0.5,)*3, (0.5,)*3) and
``test_transform`` = ToTensor + Normalize; ``valid_size = 0.2`` of the shuffled training
indices (``np.random.shuffle``), ``SubsetRandomSampler``s for train and validation over the
*training* dataset (so the validation images are augmented too, as in the notebook),
``batch_size = 20``; the loop: per epoch ``model.train()``, per batch ``zero_grad``, forward,
loss, backward, step, ``train_loss += loss.item()*data.size(0)``; ``model.eval()`` and the
validation loss summed the same way; both averaged over ``len(loader.sampler)``;
``torch.save(model.state_dict(), ...)`` when ``valid_loss <= valid_loss_min``; after training
``model.load_state_dict(torch.load(...))``, ``model.eval()`` and the test loss and accuracy.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test), pixels 0..255 replicated to 3
channels and resized (bilinear) to 32x32, instead of CIFAR-10 (so the shapes, 3x32x32 and 10
classes, are CIFAR's); the notebook's 30 epochs, of 58 batches instead of 2,000; the checkpoint goes to an in-memory buffer
instead of ``model_cifar.pt``; the flip and the rotation (uniform in [-10, 10] degrees,
bilinear, zero fill) written in torch since torchvision is not installed; no plots; CPU.
Measure only (not in the program): nothing beyond the notebook's own test loss and test
accuracy.

nndx, as the author would add it: a preflight ``nndx.probe(model, first_batch, criterion,
optimizer=optimizer, data=(X_train, y_train, X_val, y_val))`` (the split's images through
``test_transform``); ``nndx.Monitor(model, optimizer, every=10)`` around the epochs, every batch's
loss logged and each epoch's validation loss logged as ``split="val"``; after the best model
is reloaded, ``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.sampler import SubsetRandomSampler

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_cifar_cnn"
SOURCE = Source("udacity/deep-learning-v2-pytorch", "convolutional-neural-networks/cifar-cnn/cifar10_cnn_solution.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 3x32x32 digits, 30 epochs of 58 batches)"),
        Variant(
            "no_eval_mode",
            "model.eval() left out of the validation and test loops (the notebook as first published): "
            "dropout stays on when the validation loss that picks the checkpoint and the test loss are "
            "computed",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/issues/3",
             "https://github.com/udacity/deep-learning-v2-pytorch/issues/399",
             "https://github.com/udacity/deep-learning-v2-pytorch/pull/397"),
            Measure("best_valid_loss", "the validation loss the notebook prints and checkpoints on at least 1.15x "
                    "the healthy run's: 0.349 against 0.263 healthy on seed 0 (the test loss moves less: 0.263 "
                    "against 0.254)", lambda healthy, buggy: buggy >= 1.15 * healthy),
        ),
        Variant(
            "softmax_before_cross_entropy",
            "Net.forward returns F.softmax(self.fc2(x), dim=1) while the loss stays nn.CrossEntropyLoss, which "
            "applies log-softmax itself: the softmax is applied twice and the gradients shrink",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10",
             "https://github.com/DSKSD/DeepNLP-models-Pytorch/issues/2",
             "https://github.com/doronharitan/human_activity_recognition_LRCN/issues/4",
             "https://github.com/bowang-lab/Transformer-GCN-QA/pull/32"),
            Measure("test_acc", "test accuracy at least 10 points below the healthy run's: 9.2 against 92.8 "
                    "healthy on seed 0",
                    lambda healthy, buggy: buggy <= healthy - 10.0),
        ),
    )
}

SIDE, BATCH_SIZE, VALID_SIZE, N_EPOCHS, LR = 32, 20, 0.2, 30, 0.01


class Net(nn.Module):
    def __init__(self, double_softmax: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(64 * 4 * 4, 500)
        self.fc2 = nn.Linear(500, 10)
        self.dropout = nn.Dropout(0.25)
        self.double_softmax = double_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = self.pool(F.relu(self.conv3(x)))
        x = x.view(-1, 64 * 4 * 4)
        x = self.dropout(x)
        x = F.relu(self.fc1(x))
        x = self.dropout(x)
        x = self.fc2(x)
        if self.double_softmax:
            x = F.softmax(x, dim=1)
        return x


# --------------------------------------------------------------------------- transforms (torchvision's, in torch)


def normalize(img: torch.Tensor) -> torch.Tensor:
    return (img - 0.5) / 0.5  # Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def random_hflip(img: torch.Tensor) -> torch.Tensor:
    return img.flip(-1) if torch.rand(1).item() < 0.5 else img


def random_rotation(img: torch.Tensor, degrees: float = 10.0) -> torch.Tensor:
    angle = math.radians(float(torch.empty(1).uniform_(-degrees, degrees).item()))
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]]).unsqueeze(0)
    grid = F.affine_grid(theta, [1, *img.shape], align_corners=False)
    return F.grid_sample(img.unsqueeze(0), grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]


def train_transform(img: torch.Tensor) -> torch.Tensor:
    return normalize(random_rotation(random_hflip(img)))


def test_transform(img: torch.Tensor) -> torch.Tensor:
    return normalize(img)


class ImageSet(Dataset):
    """A CIFAR10-like dataset: 3x32x32 images in [0, 1] (ToTensor's output) and their labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    use_eval = variant != "no_eval_mode"

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    tr_img = digits.upscaled(tr_raw, SIDE).expand(-1, 3, -1, -1).contiguous()
    te_img = digits.upscaled(te_raw, SIDE).expand(-1, 3, -1, -1).contiguous()
    train_data = ImageSet(tr_img, tr_y, train_transform)
    test_data = ImageSet(te_img, te_y, test_transform)

    num_train = len(train_data)
    indices = list(range(num_train))
    np.random.shuffle(indices)
    split = int(np.floor(VALID_SIZE * num_train))
    train_idx, valid_idx = indices[split:], indices[:split]
    train_sampler = SubsetRandomSampler(train_idx)
    valid_sampler = SubsetRandomSampler(valid_idx)
    train_loader = DataLoader(train_data, batch_size=BATCH_SIZE, sampler=train_sampler, num_workers=0)
    valid_loader = DataLoader(train_data, batch_size=BATCH_SIZE, sampler=valid_sampler, num_workers=0)
    test_loader = DataLoader(test_data, batch_size=BATCH_SIZE, num_workers=0)

    model = Net(double_softmax=variant == "softmax_before_cross_entropy")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    # nndx: the first training batch (drawn without touching the program's random stream) and the split
    with torch.random.fork_rng():
        first_batch = next(iter(train_loader))
    splits = (normalize(tr_img[train_idx]), tr_y[train_idx], normalize(tr_img[valid_idx]), tr_y[valid_idx])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=10)

    checkpoint = None
    valid_loss_min = np.inf
    history = []
    for _epoch in range(1, N_EPOCHS + 1):
        train_loss = 0.0
        valid_loss = 0.0

        model.train()
        for data, target in train_loader:
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_loss += loss.item() * data.size(0)

        if use_eval:
            model.eval()
        for data, target in valid_loader:
            output = model(data)
            loss = criterion(output, target)
            valid_loss += loss.item() * data.size(0)

        train_loss = train_loss / len(train_loader.sampler)
        valid_loss = valid_loss / len(valid_loader.sampler)
        nx.timed(lambda: mon.log(valid_loss, split="val"))  # noqa: B023
        history.append((train_loss, valid_loss))

        if valid_loss <= valid_loss_min:
            checkpoint = io.BytesIO()
            torch.save(model.state_dict(), checkpoint)
            valid_loss_min = valid_loss

    checkpoint.seek(0)
    model.load_state_dict(torch.load(checkpoint))
    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)

    test_loss = 0.0
    class_correct = [0.0] * 10
    class_total = [0.0] * 10
    if use_eval:
        model.eval()
    for data, target in test_loader:
        output = model(data)
        loss = criterion(output, target)
        test_loss += loss.item() * data.size(0)
        _, pred = torch.max(output, 1)
        correct = np.squeeze(pred.eq(target.data.view_as(pred)).numpy())
        for i in range(len(target)):
            label = target.data[i]
            class_correct[label] += correct[i].item()
            class_total[label] += 1
    test_loss = test_loss / len(test_loader.dataset)
    test_acc = 100.0 * np.sum(class_correct) / np.sum(class_total)
    return {"test_loss": test_loss, "test_acc": float(test_acc), "best_valid_loss": float(valid_loss_min),
            "final_train_loss": history[-1][0], "final_valid_loss": history[-1][1]}  # fmt: skip
