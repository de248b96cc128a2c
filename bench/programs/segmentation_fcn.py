"""Port of pytorch/vision ``references/segmentation``: an FCN (backbone + ``FCNHead`` + auxiliary
head) trained with per-pixel cross-entropy (``ignore_index=255``), SGD and a poly LR schedule.

Source: github.com/pytorch/vision, ``references/segmentation/train.py`` and ``utils.py``
(``ConfusionMatrix``) at commit e8dd7c6c5c1e21b9acdec623b63d5d5559d9e0d7, and the model
family of ``torchvision/models/segmentation`` (``fcn.py``'s ``FCNHead``, ``_utils.py``'s
``_SimpleSegmentationModel``) (BSD-3-Clause, Copyright (c) Soumith Chintala 2016 and
contributors). Written anew from the facts of those files; no code copied, no pretrained
weights.

Kept: ``criterion(inputs, target)``: ``F.cross_entropy(x, target, ignore_index=255)`` for
every entry of the model's output dict, ``losses['out'] + 0.5 * losses['aux']``; the model
returning an ``OrderedDict`` ``{'out', 'aux'}``: the backbone's last stage through
``FCNHead`` (3x3 conv to ``in // 4`` without bias, ``BatchNorm2d``, ``ReLU``,
``Dropout(0.1)``, 1x1 conv to the classes), the stage before it through an auxiliary
``FCNHead``, each upsampled to the input size with ``F.interpolate(mode='bilinear',
align_corners=False)``; a dilated last stage (output stride 8 as torchvision's
``replace_stride_with_dilation``); ``params_to_optimize`` = backbone, classifier, and the
aux classifier at ``lr * 10``; ``SGD(lr=0.01, momentum=0.9, weight_decay=1e-4)``;
``LambdaLR(optimizer, lambda x: (1 - x / (len(data_loader) * epochs)) ** 0.9)`` stepped
after every ``optimizer.step()``; ``train_one_epoch``: ``model.train()``, forward,
``criterion``, ``zero_grad``/``backward``/``step``, ``lr_scheduler.step()``, the loss and
LR into the metric logger; ``evaluate``: ``model.eval()``, ``no_grad``, ``output['out']``,
``ConfusionMatrix.update(target.flatten(), output.argmax(1).flatten())`` (pixels outside
``[0, num_classes)`` -- the 255 ones -- dropped), ``compute``: global accuracy, per-class
IoU ``diag / (row + col - diag)``, mean IoU; a ``RandomSampler`` train loader with
``drop_last=True`` and a sequential val loader; the transforms' ``Normalize`` with the
ImageNet mean/std and the random horizontal flip on the train set, the target kept as
``torch.as_tensor(np.array(target), dtype=torch.int64)`` (``T.ToTensor`` of the
references' ``transforms.py``).
Shrunk: synthetic 32x32 RGB images instead of VOC/COCO at 480x480: 1-3 shapes (disc =
class 1, square = class 2, triangle = class 3) on a noisy smooth grey background,
each class with its own hue family, the mask with a 255 band one pixel wide inside each
shape's outline (VOC's "void" object borders);
4 classes instead of 21; 192 train / 64 val images; a 3-stage ResNet-ish backbone of widths
16/32/48 (stride 2, 2, then dilation 2) instead of ResNet-101; batch 8, 8 epochs (192
iterations) instead of 30 epochs, val batch 8 instead of 1; no random resize/crop (the images are already the crop size), no
checkpoints, single process.
Measure only: the val mean IoU after the last epoch, ``confmat.compute()`` against the true
masks (the program's own ``evaluate`` reads the val masks through the same transform, so
under ``mask_to_tensor`` it scores against corrupted masks; that number is returned as
``reported_miou``).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with ``criterion`` (the dict-taking one), the optimizer and the train/val splits (images and
masks through the val transform); ``nndx.Monitor`` around the
epochs with ``criterion`` called as ``mon.loss_fn``, each iteration's loss logged; after
each epoch the val loss (``criterion`` over the val loader) logged as ``split="val"`` with
the confusion matrix's "global correct" (pixel accuracy) as ``accuracy`` (the mean IoU is
not an accuracy and is not logged); then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "segmentation_fcn"
SOURCE = Source("pytorch/vision", "references/segmentation/train.py", "e8dd7c6c5c1e21b9acdec623b63d5d5559d9e0d7",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "train.py as published (fcn with --aux-loss)"),
        Variant(
            "mask_to_tensor",
            "the target mask goes through torchvision's ToTensor like the image: uint8 class ids are divided by "
            "255 and cast back to int64, so every class id becomes 0 and the 255 void border becomes class 1",
            (C.LABEL_NOISE, C.LABELS_MISALIGNED, C.LABEL_DTYPE),
            ("https://github.com/pytorch/vision/issues/2497", "https://github.com/pytorch/pytorch/issues/53959",
             "https://github.com/albumentations-team/albumentations/issues/148",
             "https://github.com/HasnainRaz/FC-DenseNet-TensorFlow/issues/17"),
            Measure("val_miou", "final val mean IoU (against the true masks) at least 0.15 below the healthy run's: "
                    "0.22 against 0.77 healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
        Variant(
            "separate_flips",
            "the train transform flips image and mask with two separate RandomHorizontalFlip draws (image and "
            "target transforms composed apart instead of the references' joint T.RandomHorizontalFlip): about "
            "half the training masks are the mirror image of their image",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/albumentations-team/albumentations/issues/1056",
             "https://github.com/Project-MONAI/MONAI/issues/1102",
             "https://github.com/bigmb/Unet-Segmentation-Pytorch-Nest-of-Unets/pull/30",
             "https://github.com/mapbox/robosat/pull/19"),
            Measure("val_miou", "final val mean IoU at least 0.1 below the healthy run's: 0.40 against 0.77 "
                    "healthy on seed 0", lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

ARGS = {"batch_size": 8, "epochs": 8, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4, "print_freq": 10}
NUM_CLASSES, SIDE, N_TRAIN, N_VAL = 4, 32, 192, 64
HUES = {1: np.array([0.9, 0.3, 0.2]), 2: np.array([0.2, 0.8, 0.3]), 3: np.array([0.25, 0.3, 0.9])}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------- the data (VOCSegmentation stand-in)


def make_scenes(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 RGB images (n, 32, 32, 3) and uint8 masks (n, 32, 32): class ids 0-3, 255 on
    a one-pixel band around each shape."""
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64)
    images = np.zeros((n, SIDE, SIDE, 3), np.uint8)
    masks = np.zeros((n, SIDE, SIDE), np.uint8)
    for i in range(n):
        base = rng.uniform(0.35, 0.65) + rng.normal(0, 0.05, size=3)
        tilt = rng.normal(0, 0.15, size=(2, 3))
        img = base + (xx[..., None] / SIDE - 0.5) * tilt[0] + (yy[..., None] / SIDE - 0.5) * tilt[1]
        mask = np.zeros((SIDE, SIDE), np.uint8)
        for _ in range(rng.integers(1, 4)):
            cls = int(rng.integers(1, NUM_CLASSES))
            r = rng.uniform(4.0, 7.0)
            cy, cx = rng.uniform(r, SIDE - r, size=2)
            if cls == 1:  # disc
                inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2
            elif cls == 2:  # square
                inside = (np.abs(yy - cy) <= r * 0.85) & (np.abs(xx - cx) <= r * 0.85)
            else:  # triangle, apex up
                inside = (yy >= cy - r) & (yy <= cy + r) & (np.abs(xx - cx) <= (yy - (cy - r)) * 0.6)
            colour = np.clip(HUES[cls] + rng.normal(0, 0.12, size=3), 0, 1)
            img[inside] = colour
            mask[inside] = cls
        img = np.clip(img + rng.normal(0, 0.05, size=img.shape), 0, 1)
        # the void band: pixels next to a boundary between different labels
        border = np.zeros_like(mask, dtype=bool)
        border[:-1] |= mask[:-1] != mask[1:]
        border[1:] |= mask[1:] != mask[:-1]
        border[:, :-1] |= mask[:, :-1] != mask[:, 1:]
        border[:, 1:] |= mask[:, 1:] != mask[:, :-1]
        mask[border & (mask > 0)] = 255
        images[i] = np.round(img * 255).astype(np.uint8)
        masks[i] = mask
    return images, masks


class SceneSegmentation(Dataset):
    """``VOCSegmentation`` with the references' transforms: (RandomHorizontalFlip,) ToTensor,
    Normalize on the image; the mask as int64 class ids (``mask_to_tensor``: through ToTensor)."""

    def __init__(self, images: np.ndarray, masks: np.ndarray, train: bool, variant: str, generator=None) -> None:
        self.images, self.masks, self.train, self.variant, self.generator = images, masks, train, variant, generator
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        image = torch.from_numpy(self.images[i]).permute(2, 0, 1).float().div(255.0)  # F.to_tensor(image)
        if self.variant == "mask_to_tensor":
            target = torch.from_numpy(self.masks[i])[None].float().div(255.0)  # F.to_tensor(mask)
            target = target.squeeze(0).to(torch.int64)
        else:
            target = torch.as_tensor(self.masks[i], dtype=torch.int64)
        if self.train and torch.rand(1, generator=self.generator).item() < 0.5:
            image = image.flip(-1)
            if self.variant != "separate_flips":
                target = target.flip(-1)
        if self.train and self.variant == "separate_flips" and torch.rand(1, generator=self.generator).item() < 0.5:
            target = target.flip(-1)  # the mask's own RandomHorizontalFlip, another draw
        return (image - self.mean) / self.std, target


def collate_fn(batch):
    images, targets = zip(*batch)
    return torch.stack(images), torch.stack(targets)


# --------------------------------------------------------------------------- the model (fcn_resnet with aux)


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Backbone(nn.Module):
    """``IntermediateLayerGetter(resnet, {'layer4': 'out', 'layer3': 'aux'})`` in small."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.layer1 = BasicBlock(16, 16, stride=2)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.layer3 = BasicBlock(32, 48, stride=1, dilation=2)  # replace_stride_with_dilation

    def forward(self, x: torch.Tensor) -> OrderedDict:
        x = self.layer1(self.stem(x))
        aux = self.layer2(x)
        out = self.layer3(aux)
        return OrderedDict(out=out, aux=aux)


class FCNHead(nn.Sequential):
    def __init__(self, in_channels: int, channels: int) -> None:
        inter = in_channels // 4
        super().__init__(nn.Conv2d(in_channels, inter, 3, padding=1, bias=False), nn.BatchNorm2d(inter),
                         nn.ReLU(), nn.Dropout(0.1), nn.Conv2d(inter, channels, 1))  # fmt: skip


class FCN(nn.Module):
    """``_SimpleSegmentationModel``: backbone, classifier and aux classifier, outputs upsampled."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.classifier = FCNHead(48, num_classes)
        self.aux_classifier = FCNHead(32, num_classes)

    def forward(self, x: torch.Tensor) -> OrderedDict:
        input_shape = x.shape[-2:]
        features = self.backbone(x)
        result = OrderedDict()
        result["out"] = F.interpolate(self.classifier(features["out"]), size=input_shape, mode="bilinear",
                                      align_corners=False)  # fmt: skip
        result["aux"] = F.interpolate(self.aux_classifier(features["aux"]), size=input_shape, mode="bilinear",
                                      align_corners=False)  # fmt: skip
        return result


def criterion(inputs: dict, target: torch.Tensor) -> torch.Tensor:
    losses = {name: F.cross_entropy(x, target, ignore_index=255) for name, x in inputs.items()}
    if len(losses) == 1:
        return losses["out"]
    return losses["out"] + 0.5 * losses["aux"]


class ConfusionMatrix:
    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.mat = None

    def update(self, a: torch.Tensor, b: torch.Tensor) -> None:
        n = self.num_classes
        if self.mat is None:
            self.mat = torch.zeros((n, n), dtype=torch.int64)
        with torch.no_grad():
            keep = (a >= 0) & (a < n)
            idx = n * a[keep].to(torch.int64) + b[keep]
            self.mat += torch.bincount(idx, minlength=n**2).reshape(n, n)

    def compute(self):
        h = self.mat.float()
        acc_global = torch.diag(h).sum() / h.sum()
        iu = torch.diag(h) / (h.sum(1) + h.sum(0) - torch.diag(h))
        return acc_global, iu


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    train_images, train_masks = make_scenes(N_TRAIN, rng)
    val_images, val_masks = make_scenes(N_VAL, rng)
    dataset = SceneSegmentation(train_images, train_masks, train=True, variant=variant,
                                generator=torch.Generator().manual_seed(seed))  # fmt: skip
    dataset_test = SceneSegmentation(val_images, val_masks, train=False, variant=variant)
    data_loader = DataLoader(dataset, batch_size=args["batch_size"], collate_fn=collate_fn, drop_last=True,
                             sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)))  # fmt: skip
    data_loader_test = DataLoader(dataset_test, batch_size=args["batch_size"], collate_fn=collate_fn,
                                  sampler=SequentialSampler(dataset_test))  # fmt: skip

    model = FCN(NUM_CLASSES)
    params_to_optimize = [
        {"params": [p for p in model.backbone.parameters() if p.requires_grad]},
        {"params": [p for p in model.classifier.parameters() if p.requires_grad]},
        {"params": [p for p in model.aux_classifier.parameters() if p.requires_grad], "lr": args["lr"] * 10},
    ]
    optimizer = torch.optim.SGD(params_to_optimize, lr=args["lr"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"])  # fmt: skip
    total = len(data_loader) * args["epochs"]
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda x: (1 - x / total) ** 0.9)

    plain_train = SceneSegmentation(train_images, train_masks, train=False, variant=variant)  # no flip
    x_train, y_train = collate_fn([plain_train[i] for i in range(len(plain_train))])
    x_val, y_val = collate_fn([dataset_test[i] for i in range(len(dataset_test))])
    splits = (x_train, y_train, x_val, y_val)
    first_batch = (x_train[: args["batch_size"]], y_train[: args["batch_size"]])
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    log: list[str] = []

    def train_one_epoch(epoch: int) -> float:
        model.train()
        losses = []
        for i, (image, target) in enumerate(data_loader):
            output = model(image)
            loss = mon.loss_fn(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
            mon.log(loss)
            if i % args["print_freq"] == 0:
                log.append(f"Epoch: [{epoch}] [{i}] loss: {loss.item():.4f} lr: {optimizer.param_groups[0]['lr']:.6f}")
        return float(np.mean(losses))

    def evaluate() -> tuple[float, float, float]:
        model.eval()
        confmat = ConfusionMatrix(NUM_CLASSES)
        val_losses = []
        with torch.no_grad():
            for image, target in data_loader_test:
                output = model(image)
                val_losses.append(criterion(output, target).item())
                output = output["out"]
                confmat.update(target.flatten(), output.argmax(1).flatten())
        acc_global, iu = confmat.compute()
        miou = float(torch.nan_to_num(iu).mean())
        log.append(f"global correct: {acc_global.item() * 100:.1f} mean IoU: {miou * 100:.1f}")
        return miou, float(acc_global), float(np.mean(val_losses))

    train_loss = miou = acc = val_loss = float("nan")
    for epoch in range(args["epochs"]):
        train_loss = train_one_epoch(epoch)
        miou, acc, val_loss = evaluate()
        mon.log(val_loss, split="val", accuracy=acc)  # "global correct": the pixel accuracy

    # Measure only: the IoU against the true masks (the buggy variant's own val masks are corrupted too)
    true_conf = ConfusionMatrix(NUM_CLASSES)
    model.eval()
    clean_val = SceneSegmentation(val_images, val_masks, train=False, variant="healthy")
    with torch.no_grad():
        for image, target in DataLoader(clean_val, batch_size=args["batch_size"], collate_fn=collate_fn):
            true_conf.update(target.flatten(), model(image)["out"].argmax(1).flatten())
    _, true_iu = true_conf.compute()

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"val_miou": float(torch.nan_to_num(true_iu).mean()), "reported_miou": miou, "val_acc": acc,
            "val_loss": val_loss, "train_loss": train_loss, "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
