"""Port of yunjey's PyTorch-tutorial deep residual network (a CIFAR-10 ResNet with BatchNorm).

Source: github.com/yunjey/pytorch-tutorial,
``tutorials/02-intermediate/deep_residual_network/main.py`` at commit
0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 yunjey). Written anew
from the facts of that file; no code copied.

Kept: ``conv3x3`` (3x3, padding 1, no bias); ``ResidualBlock`` = conv3x3 -> BatchNorm2d ->
``ReLU(inplace=True)`` -> conv3x3 -> BatchNorm2d, plus the input (through a
``downsample`` of conv3x3 + BatchNorm2d when the stride or the width changes), then the
ReLU; ``ResNet`` = conv3x3 -> BatchNorm2d -> ReLU, three ``make_layer`` stages of
``[2, 2, 2]`` blocks (the second and third with stride 2), ``AvgPool2d`` over the last
feature map, flatten, ``Linear`` to 10 classes; ``nn.CrossEntropyLoss``; Adam(lr=0.001);
``zero_grad`` / ``backward`` / ``step``; the LR divided by 3 by ``update_lr`` every
quarter of the epochs; the training transform ``Pad`` + ``RandomHorizontalFlip`` +
``RandomCrop`` + ``ToTensor`` (no ``Normalize``), the test images through ``ToTensor``
only; batches of 100, the training set shuffled, the test set not; after training,
``model.eval()`` and ``torch.no_grad()`` for the test accuracy.
Shrunk: 16x16 RGB images (scikit-learn's 8x8 digits upsampled 2x and tinted with a
random colour per image on a random background) instead of 32x32 CIFAR-10, 8/16/32
channels instead of 16/32/64 (``AvgPool2d(4)`` instead of 8), ``Pad(2)`` /
``RandomCrop(16)`` instead of 4 / 32, 20 epochs of 15 batches with the LR divided every
5 instead of 80 of 500 divided every 20, 1,437 training and 360 test images instead of
50,000 / 10,000.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch,
``nndx.Monitor`` around the loop with the batch loss logged, the test loss and accuracy
logged once as ``split="val"`` after the test, then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deep_residual_network"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/02-intermediate/deep_residual_network/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "no_eval_at_test",
            "the test loop without model.eval() (as the tutorial first shipped): BatchNorm normalises each test "
            "batch by its own statistics and overwrites the running averages with the test data",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/yunjey/pytorch-tutorial/issues/96",
             "https://github.com/yunjey/pytorch-tutorial/issues/62"),
            Measure("test_loss_error",
                    "relative error of the reported test loss against the same model in eval mode, over 0.05 and "
                    "5x the healthy run's (0.105/0.080/0.113 buggy on seeds 0-2, exactly 0 healthy; test accuracy "
                    "0.867/0.878/0.892 reported against 0.881/0.881/0.911 in eval mode)",
                    lambda healthy, buggy: buggy > max(0.05, 5 * healthy)),
        ),
    )
}

SIZE, PAD = 16, 2
BATCH, EPOCHS, LR = 100, 20, 0.001
DECAY_EVERY = 5  # 80 epochs decayed every 20 in the original


# --------------------------------------------------------------------------- data


def colour_digits(images: torch.Tensor, seed: int) -> torch.Tensor:
    """(N, 8, 8) uint8 digits -> (N, 16, 16, 3) uint8 RGB: a CIFAR-sized stand-in with colour."""
    rng = np.random.default_rng(seed)
    n = images.shape[0]
    ink = images.float().div(255.0).repeat_interleave(2, 1).repeat_interleave(2, 2).unsqueeze(-1)
    fg = torch.from_numpy(rng.uniform(0.4, 1.0, size=(n, 1, 1, 3))).float()
    bg = torch.from_numpy(rng.uniform(0.0, 0.4, size=(n, 1, 1, 3))).float()
    rgb = bg * (1 - ink) + fg * ink
    return (rgb * 255).round().clamp(0, 255).to(torch.uint8)


def to_tensor(images: torch.Tensor) -> torch.Tensor:
    """``transforms.ToTensor`` on (N, H, W, C) uint8: (N, C, H, W) float in [0, 1]."""
    return images.permute(0, 3, 1, 2).float().div(255.0)


def train_transform(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``Pad(PAD)``, ``RandomHorizontalFlip()``, ``RandomCrop(SIZE)`` per image, on tensors."""
    padded = F.pad(x, (PAD, PAD, PAD, PAD))
    out = torch.empty_like(x)
    flips = torch.rand(len(x), generator=generator) < 0.5
    offsets = torch.randint(0, 2 * PAD + 1, (len(x), 2), generator=generator)
    for i in range(len(x)):
        image = padded[i].flip(-1) if flips[i] else padded[i]
        top, left = offsets[i].tolist()
        out[i] = image[:, top : top + SIZE, left : left + SIZE]
    return out


# --------------------------------------------------------------------------- the model


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


class ResidualBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample:
            residual = self.downsample(x)
        out += residual
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block: type[ResidualBlock], layers: list[int], num_classes: int = 10) -> None:
        super().__init__()
        self.in_channels = 8
        self.conv = conv3x3(3, 8)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self.make_layer(block, 8, layers[0])
        self.layer2 = self.make_layer(block, 16, layers[1], 2)
        self.layer3 = self.make_layer(block, 32, layers[2], 2)
        self.avg_pool = nn.AvgPool2d(SIZE // 4)
        self.fc = nn.Linear(32, num_classes)

    def make_layer(self, block: type[ResidualBlock], out_channels: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.in_channels != out_channels:
            downsample = nn.Sequential(conv3x3(self.in_channels, out_channels, stride=stride),
                                       nn.BatchNorm2d(out_channels))  # fmt: skip
        layers = [block(self.in_channels, out_channels, stride, downsample)]
        self.in_channels = out_channels
        layers += [block(out_channels, out_channels) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn(self.conv(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = self.avg_pool(out)
        return self.fc(out.view(out.size(0), -1))


def update_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = EPOCHS) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x = to_tensor(colour_digits(train_images, seed=seed + 10))
    test_x = to_tensor(colour_digits(test_images, seed=seed + 20))
    generator = torch.Generator().manual_seed(seed)

    def train_loader():
        order = torch.randperm(len(train_labels), generator=generator)
        for i in range(0, len(order), BATCH):
            idx = order[i : i + BATCH]
            yield train_transform(train_x[idx], generator), train_labels[idx]

    model = ResNet(ResidualBlock, [2, 2, 2])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    first_batch = (train_x[:BATCH], train_labels[:BATCH])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    curr_lr = LR
    for epoch in range(epochs):
        for images, labels in train_loader():
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)
        if (epoch + 1) % DECAY_EVERY == 0:
            curr_lr /= 3
            update_lr(optimizer, curr_lr)

    trained_state = copy.deepcopy(model.state_dict())  # the buggy test overwrites BatchNorm's running averages
    test_loss, accuracy = test(model, test_x, test_labels, eval_mode=variant != "no_eval_at_test")
    mon.log(test_loss, split="val", accuracy=accuracy)

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer)
    # what the trained model really does on the test set: eval mode, on a fresh copy nndx never saw
    reference = ResNet(ResidualBlock, [2, 2, 2])
    reference.load_state_dict(trained_state)
    eval_loss, eval_accuracy = test(reference, test_x, test_labels, eval_mode=True)
    return {
        "final_train_loss": loss.item(),
        "test_loss": test_loss,
        "test_accuracy": accuracy,
        "test_loss_eval_mode": eval_loss,
        "test_accuracy_eval_mode": eval_accuracy,
        "test_loss_error": abs(test_loss - eval_loss) / eval_loss,
    }


def test(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eval_mode: bool = True) -> tuple[float, float]:
    if eval_mode:
        model.eval()
    total_loss, correct, total = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(y), BATCH):
            images, labels = x[i : i + BATCH], y[i : i + BATCH]
            outputs = model(images)
            total_loss += F.cross_entropy(outputs, labels, reduction="sum").item()
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()
    return total_loss / total, correct / total
