"""Port of milesial/Pytorch-UNet: ``train.py`` training ``UNet`` (``unet/``) for semantic
segmentation with cross-entropy + Dice loss, RMSprop and ReduceLROnPlateau on the val Dice.

Source: github.com/milesial/Pytorch-UNet, ``train.py``, ``unet/unet_model.py``,
``unet/unet_parts.py``, ``utils/dice_score.py`` and ``evaluate.py`` at commit
21d7850f2af30a9695bbeea75f3136aa538cfc4a (GPL-3.0, Copyright (c) milesial and
contributors). Written anew from the facts of those files; no code copied.

Kept: ``UNet(n_channels=3, n_classes=2, bilinear=False)`` (the script's defaults):
``DoubleConv`` = (``Conv2d(3x3, padding=1, bias=False)`` -> ``BatchNorm2d`` ->
``ReLU(inplace=True)``) twice; ``Down`` = ``MaxPool2d(2)`` + ``DoubleConv``; ``Up`` =
``ConvTranspose2d(in, in // 2, 2, stride=2)``, ``F.pad`` to the skip's size,
``torch.cat([skip, up], dim=1)`` + ``DoubleConv``; ``OutConv`` = a 1x1 ``Conv2d``; four
downs and four ups, raw logits out; the model and images in ``channels_last``; a 90/10
``random_split`` with ``Generator().manual_seed(0)``, a shuffled train loader and an
unshuffled ``drop_last`` val loader; ``optim.RMSprop(lr=1e-5, weight_decay=1e-8,
momentum=0.999, foreach=True)``; ``ReduceLROnPlateau(optimizer, 'max', patience=5)``
stepped with the val Dice; ``GradScaler(enabled=amp)`` and ``torch.autocast(...,
enabled=amp)`` with ``amp=False`` (the CPU run); the loss ``CrossEntropyLoss()(logits,
masks)`` + ``dice_loss(softmax(logits), one_hot(masks), multiclass=True)`` (Dice over
the batch per class, ``1 - mean``); ``optimizer.zero_grad(set_to_none=True)``,
``scale(loss).backward()``, ``unscale_``, ``clip_grad_norm_(..., 1.0)``,
``grad_scaler.step``/``update``; ``model.train()`` at each epoch's start; an evaluation
round every ``n_train // (5 * batch_size)`` steps: ``evaluate`` under
``inference_mode`` after ``net.eval()``, Dice of the one-hot argmax against the one-hot
mask without the background class, averaged over the val batches, then ``net.train()``;
masks mapped from their pixel values (0/255) to class indices as ``BasicDataset`` does,
images divided by 255.
Shrunk: synthetic 32x32 RGB images (1-3 ellipses of one colour on a smooth coloured
background with noise; the mask is the ellipses), 240 images instead of Carvana's 5,088
at 959x640 (``scale`` 0.5); channel widths 8-16-32-64-128 instead of 64-...-1024;
batch size 4 instead of 1 (the default) and 8 epochs instead of 5: 432 steps instead of
~23,000. No checkpoints, no wandb. Measure only: the val Dice after training and each
epoch's mean train loss (the script's ``epoch_loss``).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
with the script's loss (cross-entropy + Dice) and the train/val splits; ``nndx.Monitor``
around the loop with ``criterion`` called as ``mon.loss_fn`` (the Dice term added to
it as in the script), each step's loss logged; the val Dice is a score, not a loss, so
it is not logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn, optim
from torch.utils.data import DataLoader, Dataset, random_split

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "unet"
SOURCE = Source("milesial/Pytorch-UNet", "train.py", "21d7850f2af30a9695bbeea75f3136aa538cfc4a", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "train.py as published (n_classes=2: cross-entropy + Dice loss)"),
        Variant(
            "eval_mode_kept",
            "evaluate() ends without net.train(): after the first evaluation round of each epoch the rest of "
            "the epoch trains in eval mode (BatchNorm normalises with frozen running statistics)",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/milesial/Pytorch-UNet/commit/773ef215d41c1f36dc0ed4159c12df89d792fbc3",
             "https://github.com/wkentaro/pytorch-fcn/pull/56", "https://github.com/tk-rusch/coRNN/issues/1"),
            Measure("val_dice", "final val Dice at least 0.05 below the healthy run's: 0.35/0.31/0.15 against "
                    "0.84/0.76/0.76 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
        Variant(
            "plateau_mode_min",
            "ReduceLROnPlateau(optimizer, 'min', patience=5) while it is stepped with the val Dice (higher is "
            "better): every round the Dice improves counts as a bad one, and the LR is cut 10x every 6 rounds",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/md-mohaiminul/ViS4mer/issues/4", "https://github.com/IntelLabs/distiller/issues/240",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/673"),
            Measure("last_epoch_loss", "mean train loss of the last epoch 1.5x the healthy run's or more: "
                    "0.57/1.10/0.66 against 0.29/0.23/0.35 healthy on seeds 0-2 (val Dice 0.81/0.61/0.76 "
                    "against 0.84/0.76/0.76); the LR reaches ReduceLROnPlateau's floor (1e-8, its eps) by "
                    "round 20 of 43",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

SIDE = 32
N_IMAGES = 240
WIDTH = 8  # the original's 64
ARGS = {"epochs": 8, "batch_size": 4, "learning_rate": 1e-5, "val_percent": 0.1, "amp": False,
        "weight_decay": 1e-8, "momentum": 0.999, "gradient_clipping": 1.0, "classes": 2}  # fmt: skip


# --------------------------------------------------------------------------- data


def synthetic_shapes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, H, W, 3], masks uint8 [n, H, W] in {0, 255}): ellipses of one colour
    on a smooth coloured background with pixel noise (Carvana's car / background stand-in)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64)
    images = np.empty((n, SIDE, SIDE, 3), dtype=np.uint8)
    masks = np.zeros((n, SIDE, SIDE), dtype=np.uint8)
    for i in range(n):
        c0, c1 = rng.uniform(40, 200, 3), rng.uniform(40, 200, 3)
        t = (np.cos(rng.uniform(0, np.pi)) * xx + np.sin(rng.uniform(0, np.pi)) * yy) / (SIDE * 1.5)
        img = c0 + (c1 - c0) * t[..., None]
        bright = (c0 + c1) / 2 > 120  # per channel: the shape's colour stands out from the background's
        shape_colour = np.where(bright, rng.uniform(0, 50, 3), rng.uniform(205, 255, 3))
        inside = np.zeros((SIDE, SIDE), dtype=bool)
        for _ in range(rng.integers(1, 4)):
            cy, cx = rng.uniform(4, SIDE - 4, 2)
            ry, rx = rng.uniform(3, 9, 2)
            inside |= ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
        img[inside] = 0.2 * img[inside] + 0.8 * shape_colour
        img += rng.normal(0, 12, img.shape)
        images[i] = np.clip(img, 0, 255).astype(np.uint8)
        masks[i][inside] = 255
    return images, masks


class BasicDataset(Dataset):
    """``BasicDataset``: images HWC -> CHW / 255, mask pixel values -> class indices."""

    def __init__(self, images: np.ndarray, masks: np.ndarray) -> None:
        self.images, self.masks = images, masks
        self.mask_values = sorted(np.unique(masks).tolist())

    def __len__(self) -> int:
        return len(self.images)

    @staticmethod
    def preprocess(mask_values: list[int], img: np.ndarray, is_mask: bool) -> np.ndarray:
        if is_mask:
            mask = np.zeros(img.shape, dtype=np.int64)
            for i, v in enumerate(mask_values):
                mask[img == v] = i
            return mask
        img = img.transpose((2, 0, 1))
        return img / 255.0 if (img > 1).any() else img

    def __getitem__(self, idx: int) -> dict[str, Tensor]:
        img = self.preprocess(self.mask_values, self.images[idx], is_mask=False)
        mask = self.preprocess(self.mask_values, self.masks[idx], is_mask=True)
        return {"image": torch.as_tensor(img.copy()).float().contiguous(),
                "mask": torch.as_tensor(mask.copy()).long().contiguous()}  # fmt: skip


# --------------------------------------------------------------------------- unet/unet_parts.py, unet_model.py


class DoubleConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, mid_channels: int | None = None) -> None:
        super().__init__()
        mid_channels = mid_channels or out_channels
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(mid_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x: Tensor) -> Tensor:
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, bilinear: bool = True) -> None:
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = DoubleConv(in_channels, out_channels, in_channels // 2)
        else:
            self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        x1 = self.up(x1)
        dy, dx = x2.size(2) - x1.size(2), x2.size(3) - x1.size(3)
        x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class OutConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, n_channels: int, n_classes: int, bilinear: bool = False, width: int = WIDTH) -> None:
        super().__init__()
        self.n_channels, self.n_classes, self.bilinear = n_channels, n_classes, bilinear
        w = width
        factor = 2 if bilinear else 1
        self.inc = DoubleConv(n_channels, w)
        self.down1 = Down(w, 2 * w)
        self.down2 = Down(2 * w, 4 * w)
        self.down3 = Down(4 * w, 8 * w)
        self.down4 = Down(8 * w, 16 * w // factor)
        self.up1 = Up(16 * w, 8 * w // factor, bilinear)
        self.up2 = Up(8 * w, 4 * w // factor, bilinear)
        self.up3 = Up(4 * w, 2 * w // factor, bilinear)
        self.up4 = Up(2 * w, w, bilinear)
        self.outc = OutConv(w, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x5 = self.down4(x4)
        x = self.up1(x5, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)


# --------------------------------------------------------------------------- utils/dice_score.py, evaluate.py


def dice_coeff(input: Tensor, target: Tensor, reduce_batch_first: bool = False, epsilon: float = 1e-6) -> Tensor:
    assert input.size() == target.size()
    assert input.dim() == 3 or not reduce_batch_first
    sum_dim = (-1, -2) if input.dim() == 2 or not reduce_batch_first else (-1, -2, -3)
    inter = 2 * (input * target).sum(dim=sum_dim)
    sets_sum = input.sum(dim=sum_dim) + target.sum(dim=sum_dim)
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    return ((inter + epsilon) / (sets_sum + epsilon)).mean()


def multiclass_dice_coeff(input: Tensor, target: Tensor, reduce_batch_first: bool = False,
                          epsilon: float = 1e-6) -> Tensor:  # fmt: skip
    return dice_coeff(input.flatten(0, 1), target.flatten(0, 1), reduce_batch_first, epsilon)


def dice_loss(input: Tensor, target: Tensor, multiclass: bool = False) -> Tensor:
    fn = multiclass_dice_coeff if multiclass else dice_coeff
    return 1 - fn(input, target, reduce_batch_first=True)


@torch.inference_mode()
def evaluate(net: UNet, dataloader: DataLoader, device: torch.device, amp: bool, back_to_train: bool = True) -> float:
    net.eval()
    num_val_batches = len(dataloader)
    dice_score = 0.0
    with torch.autocast(device.type, enabled=amp):
        for batch in dataloader:
            image, mask_true = batch["image"], batch["mask"]
            image = image.to(device=device, dtype=torch.float32, memory_format=torch.channels_last)
            mask_true = mask_true.to(device=device, dtype=torch.long)
            mask_pred = net(image)
            assert mask_true.min() >= 0 and mask_true.max() < net.n_classes
            mask_true = F.one_hot(mask_true, net.n_classes).permute(0, 3, 1, 2).float()
            mask_pred = F.one_hot(mask_pred.argmax(dim=1), net.n_classes).permute(0, 3, 1, 2).float()
            dice_score += float(multiclass_dice_coeff(mask_pred[:, 1:], mask_true[:, 1:], reduce_batch_first=False))
    if back_to_train:
        net.train()
    return dice_score / max(num_val_batches, 1)


# --------------------------------------------------------------------------- train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    device = torch.device("cpu")
    args = ARGS
    model = UNet(n_channels=3, n_classes=args["classes"], bilinear=False)
    model = model.to(memory_format=torch.channels_last)
    model.to(device=device)

    # 1. dataset, 2. split, 3. loaders
    images, masks = synthetic_shapes(N_IMAGES, seed=seed)
    dataset = BasicDataset(images, masks)
    n_val = int(len(dataset) * args["val_percent"])
    n_train = len(dataset) - n_val
    train_set, val_set = random_split(dataset, [n_train, n_val], generator=torch.Generator().manual_seed(0))
    batch_size, amp = args["batch_size"], args["amp"]
    train_loader = DataLoader(train_set, shuffle=True, batch_size=batch_size,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    val_loader = DataLoader(val_set, shuffle=False, drop_last=True, batch_size=batch_size)

    # 4. optimizer, loss, scheduler, loss scaling
    optimizer = optim.RMSprop(model.parameters(), lr=args["learning_rate"], weight_decay=args["weight_decay"],
                              momentum=args["momentum"], foreach=True)  # fmt: skip
    mode = "min" if variant == "plateau_mode_min" else "max"  # goal: maximize Dice score
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode, patience=5)
    grad_scaler = torch.amp.GradScaler(device.type, enabled=amp)
    criterion = nn.CrossEntropyLoss() if model.n_classes > 1 else nn.BCEWithLogitsLoss()

    def seg_loss(masks_pred: Tensor, true_masks: Tensor, loss_fn=criterion) -> Tensor:
        loss = loss_fn(masks_pred, true_masks)
        return loss + dice_loss(F.softmax(masks_pred, dim=1).float(),
                                F.one_hot(true_masks, model.n_classes).permute(0, 3, 1, 2).float(), multiclass=True)

    def stacked(subset) -> tuple[Tensor, Tensor]:
        items = [subset[i] for i in range(len(subset))]
        return torch.stack([b["image"] for b in items]), torch.stack([b["mask"] for b in items])

    x_train, y_train = stacked(train_set)
    x_val, y_val = stacked(val_set)
    first_batch = (x_train[:batch_size].contiguous(memory_format=torch.channels_last), y_train[:batch_size])
    nx.preflight(model, first_batch, seg_loss, optimizer=optimizer, data=(x_train, y_train, x_val, y_val))
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    # 5. training
    global_step = 0
    val_scores: list[float] = []
    epoch_losses: list[float] = []
    for epoch in range(1, args["epochs"] + 1):
        model.train()
        epoch_loss = 0.0
        for batch in train_loader:
            images_, true_masks = batch["image"], batch["mask"]
            assert images_.shape[1] == model.n_channels
            images_ = images_.to(device=device, dtype=torch.float32, memory_format=torch.channels_last)
            true_masks = true_masks.to(device=device, dtype=torch.long)

            with torch.autocast(device.type, enabled=amp):
                masks_pred = model(images_)
                loss = seg_loss(masks_pred, true_masks, loss_fn=mon.loss_fn)

            optimizer.zero_grad(set_to_none=True)
            grad_scaler.scale(loss).backward()
            grad_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args["gradient_clipping"])
            grad_scaler.step(optimizer)
            grad_scaler.update()
            mon.log(loss)

            global_step += 1
            epoch_loss += loss.item()

            division_step = n_train // (5 * batch_size)
            if division_step > 0 and global_step % division_step == 0:
                val_score = evaluate(model, val_loader, device, amp, back_to_train=variant != "eval_mode_kept")
                scheduler.step(val_score)
                val_scores.append(val_score)
        epoch_losses.append(epoch_loss / len(train_loader))

    nx.finish(mon, model, first_batch, seg_loss, optimizer=optimizer, data=(x_train, y_train, x_val, y_val))
    return {
        "val_dice": evaluate(model, val_loader, device, amp),
        "last_round_dice": val_scores[-1],
        "last_epoch_loss": epoch_losses[-1],
        "final_lr": optimizer.param_groups[0]["lr"],
    }
