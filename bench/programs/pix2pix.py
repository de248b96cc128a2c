"""Port of eriklindernoren's PyTorch-GAN pix2pix: a U-Net generator, a conditional PatchGAN
discriminator, an LSGAN (MSE) adversarial loss plus ``lambda_pixel`` x L1, two Adam optimizers.

Source: github.com/eriklindernoren/PyTorch-GAN, ``implementations/pix2pix/pix2pix.py``,
``models.py`` and ``datasets.py`` at commit 36d3c77e5ff20ebe0aeefd322326a134a279b93e (the
directory last changed in 23d54a34a357285fb34abb22ca3bd7888e35f87b; MIT, Copyright (c) 2018
Erik Linder-Norén). Written anew from the facts of those files; no code copied.

Kept: ``UNetDown`` = ``Conv2d(4, stride 2, padding 1, bias=False)`` + ``InstanceNorm2d``
(not on the first and the innermost block) + ``LeakyReLU(0.2)`` (+ ``Dropout(0.5)`` on the
deep blocks); ``UNetUp`` = ``ConvTranspose2d(4, 2, 1, bias=False)`` + ``InstanceNorm2d`` +
``ReLU(inplace=True)`` (+ ``Dropout(0.5)`` on the deep ones), then ``torch.cat`` with the skip;
``final`` = ``Upsample(scale_factor=2)``, ``ZeroPad2d((1, 0, 1, 0))``, ``Conv2d(4, padding=1)``,
``Tanh``; the ``Discriminator(img_A, img_B)`` = the two images concatenated on channels,
``discriminator_block`` s (4x4 stride-2 conv, ``InstanceNorm2d`` from the second,
``LeakyReLU(0.2, inplace=True)``), ``ZeroPad2d((1, 0, 1, 0))`` and a last ``Conv2d(.., 1, 4,
padding=1, bias=False)`` (no sigmoid); ``weights_init_normal`` (N(0, 0.02) on every Conv
weight); ``criterion_GAN = MSELoss``, ``criterion_pixelwise = L1Loss``, ``lambda_pixel = 100``;
``patch = (1, H // 2**n, W // 2**n)`` and per batch ``valid``/``fake`` targets of that shape;
``Adam(lr=2e-4, betas=(0.5, 0.999))`` per model; the dataset's pair (``A`` the photo, ``B``
the label map) with one shared ``np.random.random() < 0.5`` horizontal flip of both halves,
``Resize`` + ``ToTensor`` + ``Normalize(0.5, 0.5)``; the loader ``shuffle=True``; the loop's
``real_A = batch["B"]``, ``real_B = batch["A"]`` (label map in, photo out), the generator step
(``optimizer_G.zero_grad()``, ``fake_B = generator(real_A)``, ``loss_GAN =
MSE(D(fake_B, real_A), valid)``, ``loss_pixel = L1(fake_B, real_B)``, ``loss_G = loss_GAN +
lambda_pixel * loss_pixel``, backward, step), then the discriminator step
(``optimizer_D.zero_grad()``, real pair against ``valid``, ``fake_B.detach()`` against
``fake``, ``loss_D = 0.5 * (real + fake)``, backward, step); the print line's losses kept as
a record.
Shrunk: facades (256x256 photo | label map) become scikit-learn's 8x8 digits upscaled to
16x16 (bilinear, the ``Resize`` stand-in): ``A`` the digit, ``B`` its edge map (Sobel
magnitude, scaled to [0, 1]), one channel each; the U-Net has 4 down / 3 up blocks (widths
16-32-64-64) instead of 8 / 7 (64-...-512), dropout on the innermost two; the discriminator 3
blocks of widths 16-32-64 (so ``patch`` = H // 2**3 = 2) instead of 4 of 64-...-512; batch 8
instead of 1, 6 epochs of 400 pairs instead of 200 epochs of 506 photos. The image sampling
(``save_image``), the ETA and checkpoints are left out.

Measure only (not in the program): L1 of ``generator(edge map)`` against the digit on 200
held-out pairs, on the [-1, 1] scale, under ``torch.no_grad()`` (the generator left in train
mode, as the original's ``sample_images`` leaves it; dropout is its noise).

nndx, as the author would add it: a preflight ``nndx.probe`` of the generator (the model
with a target) on the first 16 training pairs as the dataset gives them, with the pixel
term of its loss (``lambda_pixel * L1``: the GAN term needs the condition image, which an
``(output, target)`` loss does not see) and the training pairs as ``data``; one
``nndx.Monitor`` per model/optimizer pair, ``loss_G``/``loss_D`` logged to them where they
are computed; after training ``nndx.probe(generator, ..., monitor=monG)`` and the
discriminator Monitor's report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pix2pix"
SOURCE = Source("eriklindernoren/PyTorch-GAN", "implementations/pix2pix/pix2pix.py",
                "36d3c77e5ff20ebe0aeefd322326a134a279b93e", "MIT")  # fmt: skip

_MEASURE = Measure("test_l1", "L1 of generator(edge map) against the digit on 200 held-out pairs, 1.15x the "
                   "healthy run's or more", lambda healthy, buggy: not buggy < 1.15 * healthy)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "no_zero_grad_G",
            "optimizer_G.zero_grad() left out of the generator step: the generator's gradients accumulate over "
            "every batch so far, and each Adam step follows their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/aladdinpersson/Machine-Learning-Collection/issues/114",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/LoreGoetschalckx/GANalyze/issues/7"),
            _MEASURE,
        ),
        Variant(
            "pair_flipped_separately",
            "the dataset's random horizontal flip drawn once for A and once again for B: in about half the pairs "
            "the target digit is the mirror of the input's edge map (the pairs are no longer aligned)",
            (C.LABELS_MISALIGNED, C.LABEL_NOISE),
            ("https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/1061",
             "https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/474",
             "https://github.com/NVIDIA/pix2pixHD/issues/252"),
            _MEASURE,
        ),
    )
}

# the options, shrunk
n_epochs, batch_size, lr, b1, b2 = 6, 8, 0.0002, 0.5, 0.999
img_height = img_width = 16
channels = 1
N_TRAIN, N_TEST, PROBE = 400, 200, 16
lambda_pixel = 100


# --------------------------------------------------------------------------- models.py


def weights_init_normal(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm2d") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


class UNetDown(nn.Module):
    def __init__(self, in_size: int, out_size: int, normalize: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_size, out_size, 4, 2, 1, bias=False)]
        if normalize:
            layers.append(nn.InstanceNorm2d(out_size))
        layers.append(nn.LeakyReLU(0.2))
        if dropout:
            layers.append(nn.Dropout(dropout))
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class UNetUp(nn.Module):
    def __init__(self, in_size: int, out_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.ConvTranspose2d(in_size, out_size, 4, 2, 1, bias=False),
                                   nn.InstanceNorm2d(out_size), nn.ReLU(inplace=True)]  # fmt: skip
        if dropout:
            layers.append(nn.Dropout(dropout))
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, skip_input: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.model(x), skip_input), 1)


class GeneratorUNet(nn.Module):
    def __init__(self, in_channels: int = channels, out_channels: int = channels) -> None:
        super().__init__()
        self.down1 = UNetDown(in_channels, 16, normalize=False)  # 8x8
        self.down2 = UNetDown(16, 32)  # 4x4
        self.down3 = UNetDown(32, 64, dropout=0.5)  # 2x2
        self.down4 = UNetDown(64, 64, normalize=False, dropout=0.5)  # 1x1, the innermost
        self.up1 = UNetUp(64, 64, dropout=0.5)
        self.up2 = UNetUp(128, 32)
        self.up3 = UNetUp(64, 16)
        self.final = nn.Sequential(
            nn.Upsample(scale_factor=2), nn.ZeroPad2d((1, 0, 1, 0)), nn.Conv2d(32, out_channels, 4, padding=1),
            nn.Tanh(),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(d1)
        d3 = self.down3(d2)
        d4 = self.down4(d3)
        u1 = self.up1(d4, d3)
        u2 = self.up2(u1, d2)
        u3 = self.up3(u2, d1)
        return self.final(u3)


class Discriminator(nn.Module):
    def __init__(self, in_channels: int = channels) -> None:
        super().__init__()

        def discriminator_block(in_filters: int, out_filters: int, normalization: bool = True) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(in_filters, out_filters, 4, stride=2, padding=1)]
            if normalization:
                layers.append(nn.InstanceNorm2d(out_filters))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *discriminator_block(in_channels * 2, 16, normalization=False),
            *discriminator_block(16, 32),
            *discriminator_block(32, 64),
            nn.ZeroPad2d((1, 0, 1, 0)),
            nn.Conv2d(64, 1, 4, padding=1, bias=False),
        )

    def forward(self, img_A: torch.Tensor, img_B: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return self.model(torch.cat((img_A, img_B), 1))


# --------------------------------------------------------------------------- datasets.py


def edge_maps(images: torch.Tensor) -> torch.Tensor:
    """The 'label map' half of a pair: the Sobel gradient magnitude of each digit, in [0, 1]."""
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]).view(1, 1, 3, 3)
    gx = F.conv2d(images, kx, padding=1)
    gy = F.conv2d(images, kx.transpose(2, 3), padding=1)
    mag = torch.sqrt(gx**2 + gy**2)
    return mag / mag.amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)


def pairs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train A, train B, test A, test B) in ToTensor's [0, 1]: A the digit resized to 16x16, B its edge map."""
    train_images, _, test_images, _ = data.digit_images(seed=seed)
    a = data.upscaled(train_images[:N_TRAIN], img_height)
    test_a = data.upscaled(test_images[:N_TEST], img_height)
    return a, edge_maps(a), test_a, edge_maps(test_a)


class ImageDataset(Dataset):
    """The paired images, one random horizontal flip for the pair, then Normalize(0.5, 0.5).
    ``separate_flips``: the bug, a second draw for B."""

    def __init__(self, files_A: torch.Tensor, files_B: torch.Tensor, rng: np.random.RandomState,  # noqa: N803
                 separate_flips: bool = False) -> None:  # fmt: skip
        self.files_A, self.files_B, self.rng, self.separate_flips = files_A, files_B, rng, separate_flips

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        img_A = self.files_A[index % len(self.files_A)]  # noqa: N806
        img_B = self.files_B[index % len(self.files_B)]  # noqa: N806
        flip = self.rng.random_sample() < 0.5
        if flip:
            img_A = img_A.flip(-1)  # noqa: N806
        if self.separate_flips:
            flip = self.rng.random_sample() < 0.5
        if flip:
            img_B = img_B.flip(-1)  # noqa: N806
        return {"A": (img_A - 0.5) / 0.5, "B": (img_B - 0.5) / 0.5}

    def __len__(self) -> int:
        return len(self.files_A)


# --------------------------------------------------------------------------- pix2pix.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    files_A, files_B, test_A, test_B = pairs(seed)  # noqa: N806

    criterion_GAN = torch.nn.MSELoss()  # noqa: N806
    criterion_pixelwise = torch.nn.L1Loss()
    patch = (1, img_height // 2**3, img_width // 2**3)

    generator, discriminator = GeneratorUNet(), Discriminator()
    generator.apply(weights_init_normal)
    discriminator.apply(weights_init_normal)
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=lr, betas=(b1, b2))  # noqa: N806
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(b1, b2))  # noqa: N806

    dataset = ImageDataset(files_A, files_B, np.random.RandomState(seed),
                           separate_flips=variant == "pair_flipped_separately")  # fmt: skip
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip

    def pixel_loss(fake_B: torch.Tensor, real_B: torch.Tensor) -> torch.Tensor:  # noqa: N803
        return lambda_pixel * criterion_pixelwise(fake_B, real_B)

    # the preflight: the training pairs as the dataset gives them (its own flip draws, its own RandomState copy)
    probe_set = ImageDataset(files_A, files_B, np.random.RandomState(seed + 1), separate_flips=dataset.separate_flips)
    items = [probe_set[i] for i in range(len(probe_set))]
    train_in = torch.stack([item["B"] for item in items])
    train_out = torch.stack([item["A"] for item in items])
    probe_batch = (train_in[:PROBE], train_out[:PROBE])
    nx.preflight(generator, probe_batch, pixel_loss, optimizer=optimizer_G, data=(train_in, train_out))
    monG = nx.monitor(generator, optimizer_G, every=10)  # noqa: N806
    monD = nx.monitor(discriminator, optimizer_D, every=10)  # noqa: N806

    logged: dict[str, list[float]] = {"loss_D": [], "loss_G": [], "loss_pixel": [], "loss_GAN": []}
    for _epoch in range(n_epochs):
        for _i, batch in enumerate(dataloader):
            real_A = batch["B"]  # noqa: N806
            real_B = batch["A"]  # noqa: N806
            valid = torch.ones((real_A.size(0), *patch), requires_grad=False)
            fake = torch.zeros((real_A.size(0), *patch), requires_grad=False)

            # generator
            if variant != "no_zero_grad_G":
                optimizer_G.zero_grad()
            fake_B = generator(real_A)  # noqa: N806
            pred_fake = discriminator(fake_B, real_A)
            loss_GAN = criterion_GAN(pred_fake, valid)  # noqa: N806
            loss_pixel = criterion_pixelwise(fake_B, real_B)
            loss_G = loss_GAN + lambda_pixel * loss_pixel  # noqa: N806
            loss_G.backward()
            optimizer_G.step()
            nx.timed(lambda: monG.log(loss_G))

            # discriminator
            optimizer_D.zero_grad()
            pred_real = discriminator(real_B, real_A)
            loss_real = criterion_GAN(pred_real, valid)
            pred_fake = discriminator(fake_B.detach(), real_A)
            loss_fake = criterion_GAN(pred_fake, fake)
            loss_D = 0.5 * (loss_real + loss_fake)  # noqa: N806
            loss_D.backward()
            optimizer_D.step()
            nx.timed(lambda: monD.log(loss_D))

            logged["loss_D"].append(loss_D.item())
            logged["loss_G"].append(loss_G.item())
            logged["loss_pixel"].append(loss_pixel.item())
            logged["loss_GAN"].append(loss_GAN.item())

    nx.finish(monG, generator, probe_batch, pixel_loss, optimizer=optimizer_G, data=(train_in, train_out))
    nx.finish(monD)

    def late(name: str) -> float:
        values = logged[name][-50:]
        return sum(values) / len(values)

    with torch.no_grad():  # measure only: held-out edge map -> digit
        test_in, test_out = (test_B - 0.5) / 0.5, (test_A - 0.5) / 0.5
        test_l1 = F.l1_loss(generator(test_in), test_out).item()
    return {
        "late_loss_G": late("loss_G"),
        "late_loss_pixel": late("loss_pixel"),
        "late_loss_GAN": late("loss_GAN"),
        "late_loss_D": late("loss_D"),
        "test_l1": test_l1,
    }
