"""Port of eriklindernoren's PyTorch-GAN SRGAN (``srgan.py``): a residual generator with
PixelShuffle upsampling, a patch discriminator, and a content loss in a feature extractor's space.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/srgan/srgan.py`` (with
its ``models.py`` and ``datasets.py``) at commit 36d3c77e5ff20ebe0aeefd322326a134a279b93e
(MIT, Copyright (c) 2018 Erik Linder-Norén). Written anew from the facts of those files; no
code copied.

Kept: ``GeneratorResNet`` = ``conv1`` (9x9 conv + ``PReLU``), ``ResidualBlock``s (conv3x3 ->
``BatchNorm2d(features, 0.8)`` (the 0.8 lands on ``eps``, as in the original) -> ``PReLU`` ->
conv3x3 -> ``BatchNorm2d(features, 0.8)``, plus the input), ``conv2`` (conv3x3 +
``BatchNorm2d(.., 0.8)``) added to ``conv1``'s output, two upsampling stages (conv3x3 to 4x
the width -> ``BatchNorm2d`` -> ``PixelShuffle(2)`` -> ``PReLU``), ``conv3`` (9x9 conv +
``Tanh``); ``Discriminator`` = four ``discriminator_block``s (conv3x3 stride 1 -> BN (not in
the first) -> ``LeakyReLU(0.2)`` -> conv3x3 stride 2 -> BN -> ``LeakyReLU(0.2)``) and a last
conv3x3 to one channel, ``output_shape`` (1, H/16, W/16); the feature extractor in
``eval()``, its parameters left trainable and in no optimizer; ``criterion_GAN = MSELoss``,
``criterion_content = L1Loss``; ``Adam(lr=2e-4, betas=(0.5, 0.999))`` for each model; the
loader ``shuffle=True``, batch 4; per batch ``valid``/``fake`` of ``discriminator.output_shape``,
the generator step (``optimizer_G.zero_grad()``, ``gen_hr = generator(imgs_lr)``, ``loss_GAN =
MSE(D(gen_hr), valid)``, ``loss_content = L1(fe(gen_hr), fe(imgs_hr).detach())``, ``loss_G =
loss_content + 1e-3 * loss_GAN``, backward, step), then the discriminator step
(``optimizer_D.zero_grad()``, ``(MSE(D(imgs_hr), valid) + MSE(D(gen_hr.detach()), fake)) / 2``,
backward, step); ``datasets.py``'s transforms: the LR image ``Resize((hr // 4, hr // 4),
BICUBIC)``, both through ``ToTensor`` and ``Normalize`` with the ImageNet mean/std (the
generator's ``Tanh`` range is not matched to it, as in the original: issue #54).
Shrunk: the feature extractor is a small fixed, randomly initialised conv stack (conv3x3 +
ReLU twice at 8 channels, max-pool, twice at 16, max-pool, twice at 32: the layout of
VGG19's ``features[:18]``, two convolutions a stage instead of 2/2/4, widths 8/16/32
instead of 64/128/256; kaiming-normal weights and zero biases so that its features keep
unit scale, as a trained VGG's are O(1)) instead of the pretrained VGG19 (a download); CelebA at 256x256 is
replaced by synthetic colour images made at run time (a smooth background of random colour,
discs and rectangles of random colours, values in 0.15-0.85) at 32x32 (LR 8x8); the
generator 16 wide with 4 residual blocks instead of 64 wide with 16; the discriminator
8/16/32/64 wide instead of 64/128/256/512; 4 epochs of 320 images instead of 200 epochs of
202,599; no sample grids, checkpoints or progress line (the losses kept as a record).
Measure only (not in the program): PSNR of the generator's output on 64 held-out images,
read on the 0-1 scale (the ImageNet normalisation undone and clamped, the denormalize() of
issue #54), and the bicubic upsampling's PSNR for reference.

nndx, as the author would add it: the generator is the model with targets (LR image in, HR
image out), so a preflight ``nndx.probe`` of the generator on the first 16 training pairs
with the generator's loss as the loop computes it (content loss plus 1e-3 times the
adversarial loss through the discriminator, a function of ``(gen_hr, imgs_hr)``) and
``optimizer_G``; ``nndx.Monitor(generator, optimizer_G)`` with that loss called as
``monG.loss_fn`` and ``nndx.Monitor(discriminator, optimizer_D)``, each model's loss logged
where it is computed; after training ``nndx.probe(generator, ..., monitor=monG)`` on the same
pairs and the discriminator Monitor's report, each diagnosed; the author reads both.
"""

from __future__ import annotations

from math import log10

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "srgan"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/srgan/srgan.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "content_loss_on_detached_fake",
            "the content loss computed on feature_extractor(gen_hr.detach()): the term that carries the "
            "reconstruction gives the generator no gradient, only the 1e-3-weighted adversarial term trains it",
            (C.DETACHED_GRAPH,),
            ("https://github.com/samet-akcay/skip-ganomaly/issues/5", "https://github.com/wangle53/CSA-CDGAN/issues/5",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/179"),
            Measure("test_psnr", "test PSNR (0-1 scale) at least 1 dB below the healthy run's: 15.9 against "
                    "18.9 healthy on seed 0 (bicubic 27.7)", lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
        Variant(
            "no_zero_grad_G",
            "optimizer_G.zero_grad() left out of the generator step: every step applies the sum of all the "
            "generator's gradients so far (the discriminator's step is unchanged)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/opendp/smartnoise-sdk/issues/280",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            Measure("test_psnr", "test PSNR (0-1 scale) at least 1 dB below the healthy run's: 13.3 against "
                    "18.9 healthy on seed 0 (bicubic 27.7)", lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
    )
}

# the options, shrunk
n_epochs, batch_size, lr, b1, b2 = 4, 4, 0.0002, 0.5, 0.999
hr_height = hr_width = 32
channels = 3
N_TRAIN, N_TEST, PROBE = 320, 64, 16
GEN_WIDTH, N_RES, DISC_WIDTHS, FE_WIDTHS = 16, 4, (8, 16, 32, 64), (8, 16, 32)
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


# --------------------------------------------------------------------------- models.py


class FeatureExtractor(nn.Module):
    """Stand-in for ``vgg19(pretrained=True).features[:18]``: the same conv3x3/ReLU/max-pool
    layout, shrunk, with fixed random weights (no download)."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = channels
        for stage, width in enumerate(FE_WIDTHS):
            if stage:
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            for _ in range(2):
                layers += [nn.Conv2d(in_ch, width, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                in_ch = width
        self.feature_extractor = nn.Sequential(*layers)
        for m in self.modules():  # random weights at a trained VGG's scale: unit-variance features
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.feature_extractor(img)


class ResidualBlock(nn.Module):
    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.Conv2d(in_features, in_features, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(in_features, 0.8),
            nn.PReLU(),
            nn.Conv2d(in_features, in_features, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(in_features, 0.8),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv_block(x)


class GeneratorResNet(nn.Module):
    def __init__(self, in_channels: int = 3, out_channels: int = 3, n_residual_blocks: int = N_RES) -> None:
        super().__init__()
        w = GEN_WIDTH
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, w, kernel_size=9, stride=1, padding=4), nn.PReLU())
        self.res_blocks = nn.Sequential(*[ResidualBlock(w) for _ in range(n_residual_blocks)])
        self.conv2 = nn.Sequential(nn.Conv2d(w, w, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(w, 0.8))
        upsampling: list[nn.Module] = []
        for _ in range(2):
            upsampling += [nn.Conv2d(w, 4 * w, 3, 1, 1), nn.BatchNorm2d(4 * w), nn.PixelShuffle(upscale_factor=2),
                           nn.PReLU()]  # fmt: skip
        self.upsampling = nn.Sequential(*upsampling)
        self.conv3 = nn.Sequential(nn.Conv2d(w, out_channels, kernel_size=9, stride=1, padding=4), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out1 = self.conv1(x)
        out = self.res_blocks(out1)
        out2 = self.conv2(out)
        out = torch.add(out1, out2)
        out = self.upsampling(out)
        return self.conv3(out)


class Discriminator(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.input_shape = input_shape
        in_channels, in_height, in_width = self.input_shape
        patch_h, patch_w = int(in_height / 2**4), int(in_width / 2**4)
        self.output_shape = (1, patch_h, patch_w)

        def discriminator_block(in_filters: int, out_filters: int, first_block: bool = False) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(in_filters, out_filters, kernel_size=3, stride=1, padding=1)]
            if not first_block:
                layers.append(nn.BatchNorm2d(out_filters))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            layers.append(nn.Conv2d(out_filters, out_filters, kernel_size=3, stride=2, padding=1))
            layers.append(nn.BatchNorm2d(out_filters))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        layers: list[nn.Module] = []
        in_filters = in_channels
        for i, out_filters in enumerate(DISC_WIDTHS):
            layers.extend(discriminator_block(in_filters, out_filters, first_block=(i == 0)))
            in_filters = out_filters
        layers.append(nn.Conv2d(out_filters, 1, kernel_size=3, stride=1, padding=1))
        self.model = nn.Sequential(*layers)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.model(img)


# --------------------------------------------------------------------------- datasets.py (synthetic images)


def photos(count: int, seed: int) -> torch.Tensor:
    """(count, 3, hr, hr) colour images in ToTensor's 0-1 scale (see the module docstring)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:hr_height, 0:hr_width].astype(np.float64) / hr_height
    out = np.empty((count, channels, hr_height, hr_width))
    for n in range(count):
        img = rng.uniform(0.3, 0.6, size=(channels, 1, 1)) * np.ones((channels, hr_height, hr_width))
        for _ in range(2):  # a smooth field
            fx, fy, phase = rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0), rng.uniform(0, 2 * np.pi)
            img += rng.uniform(-0.08, 0.08, size=(channels, 1, 1)) * np.cos(2 * np.pi * (fx * xx + fy * yy) + phase)
        for _ in range(int(rng.integers(2, 5))):  # discs and rectangles
            colour = rng.uniform(0.15, 0.85, size=(channels, 1, 1))
            cy, cx = rng.uniform(0.1, 0.9, size=2)
            if rng.random() < 0.5:
                mask = (yy - cy) ** 2 + (xx - cx) ** 2 < rng.uniform(0.05, 0.25) ** 2
            else:
                h, w = rng.uniform(0.1, 0.4, size=2)
                mask = (np.abs(yy - cy) < h / 2) & (np.abs(xx - cx) < w / 2)
            img = np.where(mask[None], colour, img)
        out[n] = np.clip(img, 0.15, 0.85)
    return torch.from_numpy(out).float()


def normalize(images: torch.Tensor) -> torch.Tensor:
    """``transforms.Normalize(mean, std)``."""
    return (images - torch.tensor(MEAN).float().view(1, 3, 1, 1)) / torch.tensor(STD).float().view(1, 3, 1, 1)


def denormalize(images: torch.Tensor) -> torch.Tensor:
    return images * torch.tensor(STD).float().view(1, 3, 1, 1) + torch.tensor(MEAN).float().view(1, 3, 1, 1)


class ImageDataset(Dataset):
    """The HR images and their LR versions (bicubic, antialiased as PIL's resize), normalised."""

    def __init__(self, hr: torch.Tensor) -> None:
        lr_images = F.interpolate(hr, size=(hr_height // 4, hr_height // 4), mode="bicubic", align_corners=False,
                                  antialias=True).clamp(0, 1)  # fmt: skip
        self.lr, self.hr = normalize(lr_images), normalize(hr)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"lr": self.lr[index % len(self.lr)], "hr": self.hr[index % len(self.hr)]}

    def __len__(self) -> int:
        return len(self.hr)


# --------------------------------------------------------------------------- srgan.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    hr_shape = (hr_height, hr_width)
    generator = GeneratorResNet()
    discriminator = Discriminator(input_shape=(channels, *hr_shape))
    feature_extractor = FeatureExtractor()
    feature_extractor.eval()

    criterion_GAN = torch.nn.MSELoss()  # noqa: N806 - the source's names
    criterion_content = torch.nn.L1Loss()

    optimizer_G = torch.optim.Adam(generator.parameters(), lr=lr, betas=(b1, b2))  # noqa: N806
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(b1, b2))  # noqa: N806

    dataset = ImageDataset(photos(N_TRAIN, seed))
    test_set = ImageDataset(photos(N_TEST, seed + 10_000))
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip

    def generator_loss(gen_hr: torch.Tensor, imgs_hr: torch.Tensor) -> torch.Tensor:
        """The loop's loss_G as a function of the generator's output and the HR images."""
        valid = torch.ones((gen_hr.size(0), *discriminator.output_shape))
        loss_GAN = criterion_GAN(discriminator(gen_hr), valid)  # noqa: N806
        fake_for_content = gen_hr.detach() if variant == "content_loss_on_detached_fake" else gen_hr
        gen_features = feature_extractor(fake_for_content)
        real_features = feature_extractor(imgs_hr)
        loss_content = criterion_content(gen_features, real_features.detach())
        return loss_content + 1e-3 * loss_GAN

    probe_batch = (dataset.lr[:PROBE], dataset.hr[:PROBE])
    nx.preflight(generator, probe_batch, generator_loss, optimizer=optimizer_G)
    monG = nx.monitor(generator, optimizer_G, every=10, loss_fn=generator_loss)  # noqa: N806
    monD = nx.monitor(discriminator, optimizer_D, every=10)  # noqa: N806

    logged: dict[str, list[float]] = {"loss_G": [], "loss_D": []}
    for _epoch in range(n_epochs):
        for _i, imgs in enumerate(dataloader):
            imgs_lr, imgs_hr = imgs["lr"], imgs["hr"]
            valid = torch.ones((imgs_lr.size(0), *discriminator.output_shape))
            fake = torch.zeros((imgs_lr.size(0), *discriminator.output_shape))

            # train the generator
            if variant != "no_zero_grad_G":
                optimizer_G.zero_grad()
            gen_hr = generator(imgs_lr)
            loss_G = monG.loss_fn(gen_hr, imgs_hr)  # noqa: N806 - content + 1e-3 * adversarial
            loss_G.backward()
            optimizer_G.step()
            nx.timed(lambda: monG.log(loss_G))

            # train the discriminator
            optimizer_D.zero_grad()
            loss_real = criterion_GAN(discriminator(imgs_hr), valid)
            loss_fake = criterion_GAN(discriminator(gen_hr.detach()), fake)
            loss_D = (loss_real + loss_fake) / 2  # noqa: N806
            loss_D.backward()
            optimizer_D.step()
            nx.timed(lambda: monD.log(loss_D))

            logged["loss_G"].append(loss_G.item())
            logged["loss_D"].append(loss_D.item())

    nx.finish(monG, generator, probe_batch, generator_loss, optimizer=optimizer_G)
    nx.finish(monD)

    # measure only: PSNR on held-out images, on the 0-1 scale
    generator.eval()
    with torch.no_grad():
        target = denormalize(test_set.hr).clamp(0, 1)
        out = denormalize(generator(test_set.lr)).clamp(0, 1)
        bicubic = F.interpolate(denormalize(test_set.lr), size=(hr_height, hr_width), mode="bicubic",
                                align_corners=False).clamp(0, 1)  # fmt: skip
        psnr = 10 * log10(1 / F.mse_loss(out, target).item())
        psnr_bicubic = 10 * log10(1 / F.mse_loss(bicubic, target).item())

    def late(name: str) -> float:
        values = logged[name][-100:]
        return sum(values) / len(values)

    return {"test_psnr": psnr, "bicubic_psnr": psnr_bicubic, "late_loss_G": late("loss_G"),
            "late_loss_D": late("loss_D")}  # fmt: skip
