"""Port of the PyTorch transfer-learning tutorial ("ConvNet as fixed feature extractor").

Source: github.com/pytorch/tutorials, ``beginner_source/transfer_learning_tutorial.py``
at commit 039ee0ead6a2b72669cc75bee113f8b009e86a8c (BSD-3-Clause; authors Sasank
Chilamkurthy and Kaichao You). Written anew from the facts of that file; no code copied.

Kept: torchvision's ResNet-18 layout — a stem conv + BatchNorm + ReLU, stages of
``BasicBlock`` (two 3x3 convs with BatchNorm, a 1x1 conv + BatchNorm on the shortcut where
the shape changes), adaptive average pooling, one ``fc`` — with torchvision's init
(``kaiming_normal_(mode="fan_out", nonlinearity="relu")`` on every conv, BatchNorm scales
1 and shifts 0, ``fc`` at PyTorch's default); "pretrained" weights; every parameter
frozen (``requires_grad = False``), then ``fc`` replaced by a new ``nn.Linear(num_ftrs,
len(class_names))``; ``nn.CrossEntropyLoss``; ``optim.SGD(model.fc.parameters(), lr=0.01,
momentum=0.9)``; ``StepLR(step_size=7, gamma=0.1)`` stepped once per epoch after the
train phase; ``train_model``'s loop: each epoch a ``train`` phase (``model.train()``) and
a ``val`` phase (``model.eval()``), ``optimizer.zero_grad()`` then the forward under
``torch.set_grad_enabled(phase == 'train')``, the best validation accuracy's weights
deep-copied and loaded back at the end; batch size 64, 25 epochs; a small training set
(the tutorial's CUB subset: ~30 images per class), a shuffled train loader and an
unshuffled val loader; augmentation on train only, Normalize with the pretraining
data's mean and std.
``BasicBlock`` and the init are the siamese-network port's (the same torchvision code).
Shrunk: ImageNet pretraining is replaced by 6 epochs of training the same network on
scikit-learn's digits 0-4 (made at run time, cached per seed; nothing downloaded); the
target task is digits 5-9 with 30 training images per class (the rest are the val
set); images are 8x8 single-channel, so the stem is a 3x3 conv without the max-pool,
the stages are two of widths 16 and 32 with one block each, and RandomResizedCrop(224)
+ RandomHorizontalFlip become a random 1-pixel shift (a flipped digit is another digit).

nndx, as the author would add it (the MNIST example's layout, as the other ports): a
preflight ``nndx.probe`` on the first training batch, the loop under ``nndx.Monitor``
with the loop's own criterion call, the val loss logged as ``split="val"`` each epoch,
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.siamese_network import BasicBlock, torchvision_init
from nndx.report import CauseCode as C

NAME = "transfer_learning"
SOURCE = Source("pytorch/tutorials", "beginner_source/transfer_learning_tutorial.py",
                "039ee0ead6a2b72669cc75bee113f8b009e86a8c", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial's fixed feature extractor on a pretrained ResNet"),
        Variant(
            "not_pretrained",
            "the backbone built without its pretrained weights (resnet18(pretrained=False), or weights=None after "
            "the weights= migration) and then frozen: random features under the new fc",
            (C.FROZEN_PARAMETERS,),
            ("https://github.com/criticallycode/programming-tutorials/issues/4",
             "https://github.com/hushell/sib_meta_learn/issues/3",
             "https://github.com/kitzeslab/opensoundscape/issues/328"),
            Measure("best_val_accuracy", "best val accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

SOURCE_CLASSES, TARGET_CLASSES = 10, (5, 6, 7, 8, 9)
PER_CLASS = 30
PRETRAIN_EPOCHS = 10


class ResNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)
        torchvision_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _digits(seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(pretraining set, target set): half of the digits, all ten classes, stand in for
    ImageNet; the other half's digits 5-9, labelled 0-4, are the task transferred to."""
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    x = data.to_tensor(torch.cat([train_images, test_images]))
    y = torch.cat([train_labels, test_labels])
    half = len(y) // 2
    target = torch.isin(y[half:], torch.tensor(TARGET_CLASSES))
    return (x[:half], y[:half]), (x[half:][target], y[half:][target] - min(TARGET_CLASSES))


@functools.lru_cache(maxsize=4)
def _pretrained(seed: int) -> tuple[dict[str, torch.Tensor], float, float]:
    """"ImageNet": the same network trained on the pretraining half; its weights and the
    data's mean/std (the Normalize constants a pretrained model ships with)."""
    (x, y), _ = _digits(seed)
    mean, std = x.mean().item(), x.std().item()
    x = (x - mean) / std
    with torch.random.fork_rng():
        torch.manual_seed(10_000 + seed)
        model = ResNet(SOURCE_CLASSES)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        for _ in range(PRETRAIN_EPOCHS):
            order = torch.randperm(len(y))
            for i in range(0, len(order), 64):
                idx = order[i : i + 64]
                optimizer.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                optimizer.step()
    return copy.deepcopy(model.state_dict()), mean, std


def resnet(pretrained: bool, seed: int) -> tuple[ResNet, float, float]:
    model = ResNet(SOURCE_CLASSES)
    state, mean, std = _pretrained(seed)
    if pretrained:
        model.load_state_dict(state)
    return model, mean, std


def _shift(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random 1-pixel translation (the port's RandomResizedCrop): pad 1, crop 8x8."""
    padded = F.pad(x, (1, 1, 1, 1))
    out = torch.empty_like(x)
    offsets = torch.randint(0, 3, (len(x), 2), generator=generator)
    for i, (dy, dx) in enumerate(offsets.tolist()):
        out[i] = padded[i, :, dy : dy + 8, dx : dx + 8]
    return out


def train(variant: str, nx: Nndx, seed: int = 0, num_epochs: int = 25) -> dict[str, float]:
    torch.manual_seed(seed)
    model_conv, mean, std = resnet(pretrained=variant != "not_pretrained", seed=seed)
    _, (x, y) = _digits(seed)
    x = (x - mean) / std
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    train_idx = torch.cat([order[y[order] == c][:PER_CLASS] for c in range(len(TARGET_CLASSES))])
    val_mask = torch.ones(len(y), dtype=torch.bool)
    val_mask[train_idx] = False
    sets = {"train": (x[train_idx], y[train_idx]), "val": (x[val_mask], y[val_mask])}
    generator = torch.Generator().manual_seed(seed + 1)

    def batches(phase: str):
        inputs, labels = sets[phase]
        idx = torch.randperm(len(labels), generator=generator) if phase == "train" else torch.arange(len(labels))
        for i in range(0, len(idx), 64):
            chosen = idx[i : i + 64]
            batch = inputs[chosen]
            yield (_shift(batch, generator) if phase == "train" else batch), labels[chosen]

    for param in model_conv.parameters():
        param.requires_grad = False
    num_ftrs = model_conv.fc.in_features
    model_conv.fc = nn.Linear(num_ftrs, len(TARGET_CLASSES))
    criterion = nn.CrossEntropyLoss()
    optimizer_conv = torch.optim.SGD(model_conv.fc.parameters(), lr=0.01, momentum=0.9)
    exp_lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer_conv, step_size=7, gamma=0.1)

    first_batch = next(batches("train"))
    nx.preflight(model_conv, first_batch, criterion, optimizer=optimizer_conv,
                 data=(*sets["train"], *sets["val"]))  # fmt: skip
    mon = nx.monitor(model_conv, optimizer_conv, every=5)

    best_model_wts = copy.deepcopy(model_conv.state_dict())
    best_acc, first_train_loss, epoch_loss = 0.0, None, 0.0
    for _epoch in range(num_epochs):
        for phase in ("train", "val"):
            model_conv.train(phase == "train")
            running_loss, running_corrects, seen = 0.0, 0, 0
            for inputs, labels in batches(phase):
                optimizer_conv.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model_conv(inputs)
                    _, preds = torch.max(outputs, 1)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer_conv.step()
                        mon.log(loss)
                running_loss += loss.item() * inputs.size(0)
                running_corrects += int(torch.sum(preds == labels))
                seen += inputs.size(0)
            if phase == "train":
                exp_lr_scheduler.step()
            epoch_loss, epoch_acc = running_loss / seen, running_corrects / seen
            if phase == "train" and first_train_loss is None:
                first_train_loss = epoch_loss
            if phase == "val":
                mon.log(epoch_loss, split="val", accuracy=epoch_acc)
                if epoch_acc > best_acc:
                    best_acc = epoch_acc
                    best_model_wts = copy.deepcopy(model_conv.state_dict())
    model_conv.load_state_dict(best_model_wts)

    nx.finish(mon, model_conv, first_batch, criterion, optimizer=optimizer_conv,
              data=(*sets["train"], *sets["val"]))  # fmt: skip
    return {"first_train_loss": float(first_train_loss or 0.0), "best_val_accuracy": best_acc,
            "final_val_loss": epoch_loss}  # fmt: skip
