"""Port of the PyTorch super-resolution example (ESPCN: sub-pixel convolution, PixelShuffle).

Source: github.com/pytorch/examples, ``super_resolution/main.py`` (with its ``model.py``,
``data.py`` and ``dataset.py``) at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8
(BSD-3-Clause, Copyright (c) 2017 Pytorch contributors). Written anew from the facts of
those files; no code copied.

Kept: ``Net`` = ``Conv2d(1, 64, 5, pad 2)`` -> ReLU -> ``Conv2d(64, 64, 3, pad 1)`` -> ReLU
-> ``Conv2d(64, 32, 3, pad 1)`` -> ReLU -> ``Conv2d(32, r*r, 3, pad 1)`` ->
``PixelShuffle(r)``, no activation on the output; ``init.orthogonal_`` on the four
convolution weights (gain ``calculate_gain('relu')`` on the first three, 1 on the last),
biases left at PyTorch's default; one luminance (Y) channel per image; the crop size made
a multiple of the upscale factor (``calculate_valid_crop_size``); the input is the
centre crop resized down by the factor (bilinear, antialiased, as PIL's ``Resize``) then
``ToTensor`` (0-255 -> 0-1), the target the same crop through ``ToTensor``;
``nn.MSELoss``; Adam; a shuffled training DataLoader and an unshuffled test one; each
epoch ``train`` then ``test``, the test under ``torch.no_grad()`` with the example's
PSNR ``10 * log10(1 / mse)`` averaged over the test batches. The settings are the
README's training command: ``--upscale_factor 3 --batchSize 4 --testBatchSize 100 --lr
0.001`` (the argparse default LR is 0.01; the README and the repository's CI script both
run 0.001).
Shrunk: BSDS300 (200 training and 100 test photographs, downloaded) is replaced by 200 +
100 synthetic grey-scale images made at run time (smooth random fields, sharp-edged discs
and rectangles, fine texture; 0-255 uint8 like PIL's Y channel); crops of 48x48 (LR
16x16) instead of 255x255 (LR 85x85); 8 epochs instead of the README's 30; the
per-epoch ``torch.save`` checkpoint and the DataLoader worker threads are dropped
(nothing is written to disk). The network's widths are the example's.

nndx, as the author would add it (the MNIST example's layout, as the other ports): a
preflight ``nndx.probe`` on the first training batch, the loop under ``nndx.Monitor``
with the criterion called through ``mon.loss_fn``, the test MSE logged as
``split="val"`` each epoch, then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from math import log10

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "super_resolution"
SOURCE = Source("pytorch/examples", "super_resolution/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (README settings: x3, batch 4, Adam lr=0.001)"),
        Variant(
            "target_unscaled",
            "the target built from the HR crop without ToTensor's /255 (torch.from_numpy(np.array(img)).float(), "
            "PILToTensor-style): inputs in [0, 1], targets in [0, 255], MSE between them",
            (C.UNNORMALIZED_TARGETS,),
            ("https://github.com/leftthomas/ESPCN/issues/30",
             "https://github.com/tensorlayer/SRGAN/issues/19",
             "https://github.com/www0wwwjs1/Matrix-Capsules-EM-Tensorflow/issues/51"),
            Measure("test_psnr_01", "test PSNR of the output read on the 0-1 scale (divided by the program's target "
                    "scale, 255 in the buggy one) against the true HR crop, at least 2 dB below the healthy run's "
                    "(25.1/25.1/24.7 dB healthy, 22.1/22.5/22.1 buggy on seeds 0-2; bilinear upsampling 24.3-24.5)",
                    lambda healthy, buggy: not buggy > healthy - 2.0),
        ),
    )
}

UPSCALE = 3
CROP = 48  # the example crops 256 -> 255 (a multiple of 3)
BATCH_SIZE = 4
TEST_BATCH_SIZE = 100
LR = 0.001
EPOCHS = 8


# --------------------------------------------------------------------------- the network (model.py)


class Net(nn.Module):
    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(32, upscale_factor**2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        gain = init.calculate_gain("relu")
        for conv in (self.conv1, self.conv2, self.conv3):
            init.orthogonal_(conv.weight, gain)
        init.orthogonal_(self.conv4.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


# --------------------------------------------------------------------------- the data (data.py, dataset.py)


def synthetic_luma(count: int, seed: int, size: int = 56) -> np.ndarray:
    """``count`` grey-scale "photographs" (uint8, size x size): a smooth random field at two
    scales, a few sharp-edged discs and rectangles, and fine texture, stretched to 0-255."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    images = np.empty((count, size, size), dtype=np.uint8)
    for i in range(count):
        coarse = torch.from_numpy(rng.standard_normal((1, 1, 4, 4)))
        medium = torch.from_numpy(rng.standard_normal((1, 1, 9, 9)))
        img = (F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=True)[0, 0].numpy()
               + 0.5 * F.interpolate(medium, size=(size, size), mode="bicubic", align_corners=True)[0, 0].numpy())
        for _ in range(rng.integers(2, 6)):
            level = rng.uniform(-1.5, 1.5)
            cy, cx = rng.uniform(0, size, 2)
            if rng.random() < 0.5:
                r = rng.uniform(3, size / 4)
                img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = level
            else:
                h, w = rng.uniform(3, size / 3, 2)
                img[(np.abs(yy - cy) < h) & (np.abs(xx - cx) < w)] = level
        img += 0.08 * rng.standard_normal((size, size))
        lo, hi = np.percentile(img, [1, 99])
        images[i] = np.clip(np.round((img - lo) / (hi - lo) * 255.0), 0, 255).astype(np.uint8)
    return images


def calculate_valid_crop_size(crop_size: int, upscale_factor: int) -> int:
    return crop_size - (crop_size % upscale_factor)


def center_crop(images: np.ndarray, crop: int) -> np.ndarray:
    top, left = (images.shape[1] - crop) // 2, (images.shape[2] - crop) // 2
    return images[:, top : top + crop, left : left + crop]


def pairs(images: np.ndarray, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset's (input, target) for every image: CenterCrop -> Resize(crop // r) ->
    ToTensor for the input, CenterCrop -> ToTensor for the target (the bug: no /255)."""
    crop = calculate_valid_crop_size(CROP, UPSCALE)
    hr = torch.from_numpy(np.ascontiguousarray(center_crop(images, crop))).unsqueeze(1).float()  # 0..255
    lr = F.interpolate(hr, size=(crop // UPSCALE, crop // UPSCALE), mode="bilinear", antialias=True,
                       align_corners=False).round().clamp(0, 255)  # fmt: skip  # PIL resizes uint8 images
    inputs = lr / 255.0  # ToTensor
    targets = hr if variant == "target_unscaled" else hr / 255.0
    return inputs, targets


# --------------------------------------------------------------------------- the program (main.py)


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = EPOCHS) -> dict[str, float]:
    torch.manual_seed(123 + seed)  # the example's --seed default
    train_in, train_target = pairs(synthetic_luma(200, seed=seed), variant)
    test_in, test_target = pairs(synthetic_luma(100, seed=10_000 + seed), variant)
    target_scale = 255.0 if variant == "target_unscaled" else 1.0
    training_data_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train_in, train_target), batch_size=BATCH_SIZE, shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    testing_data_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(test_in, test_target), batch_size=TEST_BATCH_SIZE, shuffle=False
    )

    model = Net(upscale_factor=UPSCALE)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    first_batch = tuple(next(iter(training_data_loader)))
    nx.preflight(model, first_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10, loss_fn=criterion)

    epoch_losses: list[float] = []
    for _epoch in range(1, epochs + 1):
        epoch_loss = 0.0
        for iteration, batch in enumerate(training_data_loader, 1):
            input, target = batch[0], batch[1]
            optimizer.zero_grad()
            loss = mon.loss_fn(model(input), target)
            epoch_loss += loss.item()
            loss.backward()
            optimizer.step()
            mon.log(loss)
        epoch_losses.append(epoch_loss / iteration)
        test_mse, avg_psnr, psnr_01 = test(model, criterion, testing_data_loader, target_scale)
        mon.log(test_mse, split="val")

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer)
    with torch.no_grad():  # what plain bilinear upsampling scores: the bar a trained net must pass
        up = F.interpolate(test_in, scale_factor=UPSCALE, mode="bilinear", align_corners=False)
        bilinear_psnr = 10 * log10(1 / F.mse_loss(up, test_target / target_scale).item())
    return {
        "first_epoch_loss": epoch_losses[0],
        "final_train_loss": epoch_losses[-1],
        "test_psnr": avg_psnr,  # the example's number, on the program's own target scale
        "test_psnr_01": psnr_01,
        "bilinear_psnr_01": bilinear_psnr,
    }


def test(model: nn.Module, criterion: nn.Module, testing_data_loader: torch.utils.data.DataLoader,
         target_scale: float) -> tuple[float, float, float]:  # fmt: skip
    """The example's average PSNR over the test batches (with its mean MSE, logged), plus
    the PSNR on the 0-1 scale the images really have (the measure, not the example's)."""
    avg_psnr, avg_mse, psnr_01 = 0.0, 0.0, 0.0
    with torch.no_grad():
        for batch in testing_data_loader:
            input, target = batch[0], batch[1]
            prediction = model(input)
            mse = criterion(prediction, target)
            avg_mse += mse.item()
            avg_psnr += 10 * log10(1 / mse.item())
            psnr_01 += 10 * log10(1 / F.mse_loss(prediction / target_scale, target / target_scale).item())
    n = len(testing_data_loader)
    return avg_mse / n, avg_psnr / n, psnr_01 / n
