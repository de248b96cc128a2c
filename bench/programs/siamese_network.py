"""Port of the PyTorch Siamese network example (a ResNet-18 twin, sigmoid + BCELoss).

Source: github.com/pytorch/examples, ``siamese_network/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``SiameseNetwork`` = a ResNet-18 body (torchvision's ``resnet18(weights=None)``:
7x7/2 stem convolution rewritten for one input channel, BatchNorm, ReLU, 3x3/2 max-pool,
four stages of two ``BasicBlock`` each with 1x1 downsampling shortcuts, adaptive average
pool; its ``fc`` dropped), applied to both images (``forward_once``), the two feature
vectors concatenated into ``Linear -> ReLU(inplace) -> Linear(1)`` and ``nn.Sigmoid``;
torchvision's init for the body (Kaiming-normal convolutions, BatchNorm 1/0) and the
example's ``xavier_uniform_`` + bias 0.01 for its Linear layers; the ``APP_MATCHER``
pairs (a random class for the first image, a second image of the same class for an even
index, of another class for an odd one, target 1./0., pixels as ``uint8 -> float`` with no
scaling); ``nn.BCELoss`` on ``model(images_1, images_2).squeeze()``; Adadelta(lr=1.0);
``StepLR(step_size=1, gamma=0.7)`` stepped once per epoch; the CPU DataLoader (batch 64,
not shuffled: the pairs are random anyway); ``test`` under ``model.eval()`` +
``torch.no_grad()`` with a 1,000 batch, predictions ``outputs > 0.5``, and the example's
test loss (batch means summed, divided by the number of pairs).
Shrunk: 8x8 digits (scikit-learn) instead of 28x28 MNIST, stage widths 8/16/32/64
instead of 64/128/256/512 and a 32-unit comparison layer instead of 256, 3 epochs of
5,748 pairs (four per training image; the example's index only picks same/other class)
instead of 14 of 60,000.

nndx, as the author would add it (the MNIST example's layout, which this one follows): a
preflight ``nndx.probe`` on the first batch of pairs, the loop under ``nndx.Monitor`` with
the criterion called through ``mon.loss_fn``, the test loss logged as ``split="val"``,
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``. The model takes two images,
so a batch is ``((images_1, images_2), targets)`` and the loss squeezes the output as the
example's loop does.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "siamese_network"
SOURCE = Source("pytorch/examples", "siamese_network/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (nn.Sigmoid output + nn.BCELoss: correct)"),
        Variant(
            "sigmoid_into_bce_with_logits",
            "criterion = nn.BCEWithLogitsLoss() (train and test) while the network still ends in nn.Sigmoid: "
            "a sigmoid applied twice",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/Turoad/lanedet/issues/32",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("test_accuracy", "pair accuracy on the test digits at least 0.15 below the healthy run's "
                    "(0.87/0.92 healthy, 0.52/0.57 buggy on seeds 0/1)",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

WIDTHS = (8, 16, 32, 64)
HIDDEN = 32


# --------------------------------------------------------------------------- torchvision's ResNet-18, narrower


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


def torchvision_init(model: nn.Module) -> None:
    """torchvision's ResNet init: He-normal (fan_out) convolutions, BatchNorm scale 1 and shift 0."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


class ResNet18(nn.Module):
    def __init__(self, widths: tuple[int, ...] = WIDTHS, in_channels: int = 3, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, stages = widths[0], []
        for i, planes in enumerate(widths):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1], num_classes)
        torchvision_init(self)


class SiameseNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.resnet = ResNet18()
        # a one-channel stem for grey-scale digits, as the example rewrites resnet18's
        self.resnet.conv1 = nn.Conv2d(1, WIDTHS[0], kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        self.fc_in_features = self.resnet.fc.in_features
        self.resnet = nn.Sequential(*(list(self.resnet.children())[:-1]))  # without its fc
        self.fc = nn.Sequential(
            nn.Linear(self.fc_in_features * 2, HIDDEN),
            nn.ReLU(inplace=True),
            nn.Linear(HIDDEN, 1),
        )
        self.sigmoid = nn.Sigmoid()
        self.resnet.apply(self.init_weights)
        self.fc.apply(self.init_weights)

    def init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x: torch.Tensor) -> torch.Tensor:
        output = self.resnet(x)
        return output.view(output.size()[0], -1)

    def forward(self, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
        output = torch.cat((self.forward_once(input1), self.forward_once(input2)), 1)
        return self.sigmoid(self.fc(output))


# --------------------------------------------------------------------------- the pairs


class AppMatcher(torch.utils.data.Dataset):
    """The example's ``APP_MATCHER``: pairs drawn with Python's ``random`` on every access."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, pairs_per_image: int = 1) -> None:
        self.data = images.unsqueeze(1).clone()  # (N, 1, 8, 8) uint8
        self.pairs_per_image = pairs_per_image
        targets = labels.numpy()
        self.grouped_examples = {i: (targets == i).nonzero()[0] for i in range(10)}

    def __len__(self) -> int:
        return self.data.shape[0] * self.pairs_per_image

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        selected_class = random.randint(0, 9)
        group = self.grouped_examples[selected_class]
        random_index_1 = random.randint(0, group.shape[0] - 1)
        image_1 = self.data[group[random_index_1]].clone().float()
        if index % 2 == 0:
            random_index_2 = random.randint(0, group.shape[0] - 1)
            while random_index_2 == random_index_1:
                random_index_2 = random.randint(0, group.shape[0] - 1)
            image_2 = self.data[group[random_index_2]].clone().float()
            target = torch.tensor(1, dtype=torch.float)
        else:
            other_selected_class = random.randint(0, 9)
            while other_selected_class == selected_class:
                other_selected_class = random.randint(0, 9)
            other = self.grouped_examples[other_selected_class]
            image_2 = self.data[other[random.randint(0, other.shape[0] - 1)]].clone().float()
            target = torch.tensor(0, dtype=torch.float)
        return image_1, image_2, target


# --------------------------------------------------------------------------- the program


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = 3, pairs_per_image: int = 4) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    random.seed(1 + seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_loader = torch.utils.data.DataLoader(AppMatcher(train_images, train_labels, pairs_per_image), batch_size=64)
    test_loader = torch.utils.data.DataLoader(AppMatcher(test_images, test_labels), batch_size=1000)

    model = SiameseNetwork()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    criterion = nn.BCEWithLogitsLoss() if variant == "sigmoid_into_bce_with_logits" else nn.BCELoss()

    def loss_on_batch(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return criterion(outputs.squeeze(), targets)  # the loop's model(...).squeeze()

    images_1, images_2, targets = next(iter(train_loader))
    first_batch = ((images_1, images_2), targets)
    nx.preflight(model, first_batch, loss_on_batch, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    epoch_losses: list[float] = []
    for _epoch in range(1, epochs + 1):
        model.train()
        losses = []
        for images_1, images_2, targets in train_loader:
            optimizer.zero_grad()
            outputs = model(images_1, images_2).squeeze()
            loss = mon.loss_fn(outputs, targets)
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
        epoch_losses.append(sum(losses) / len(losses))
        test_loss, accuracy, log_loss = test(model, test_loader, criterion)
        mon.log(test_loss, split="val", accuracy=accuracy)
        scheduler.step()

    nx.finish(mon, model, first_batch, loss_on_batch, optimizer=optimizer)
    return {
        "first_epoch_loss": epoch_losses[0],
        "final_train_loss": epoch_losses[-1],
        "test_loss": test_loss,
        "test_accuracy": accuracy,
        "test_log_loss": log_loss,
    }


def test(model: nn.Module, test_loader: torch.utils.data.DataLoader, criterion: nn.Module) -> tuple[float, float, float]:
    """The example's test loss and accuracy, plus the log loss of the outputs read as the
    probabilities the network's sigmoid says they are (the measure, not the example's)."""
    model.eval()
    test_loss, correct, log_loss = 0.0, 0, 0.0
    with torch.no_grad():
        for images_1, images_2, targets in test_loader:
            outputs = model(images_1, images_2).squeeze()
            test_loss += criterion(outputs, targets).sum().item()
            pred = torch.where(outputs > 0.5, 1, 0)
            correct += pred.eq(targets.view_as(pred)).sum().item()
            log_loss += nn.functional.binary_cross_entropy(outputs, targets, reduction="sum").item()
    n = len(test_loader.dataset)
    return test_loss / n, correct / n, log_loss / n
