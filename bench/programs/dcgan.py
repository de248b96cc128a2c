"""Port of the PyTorch DCGAN example (two models, two optimizers).

Source: github.com/pytorch/examples, ``dcgan/main.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: the generator (``ConvTranspose2d`` without bias -> ``BatchNorm2d`` ->
``ReLU(True)`` ... -> ``Tanh``) and the discriminator (``Conv2d`` without bias ->
``LeakyReLU(0.2, inplace=True)``, ``BatchNorm2d`` from the second block, a last
``Conv2d`` to one channel -> ``Sigmoid``, ``view(-1, 1).squeeze(1)``); ``weights_init``
(N(0, 0.02) convolutions, N(1, 0.02) batch-norm scales); ``nn.BCELoss``; one
``Adam(lr=2e-4, betas=(0.5, 0.999))`` per model; each iteration ``netD.zero_grad()``,
a real batch against label 1, ``netD(fake.detach())`` against label 0,
``optimizerD.step()``, then ``netG.zero_grad()``, ``netD(fake)`` against label 1,
``optimizerG.step()``; images normalised to [-1, 1].
Shrunk: 8x8 digits instead of 64x64 images (three transposed convolutions instead of
five, two strided convolutions instead of four), nz 16, ngf = ndf = 8, batch 64,
5 epochs of 1,797 images.

nndx, as the author would add it: a preflight ``nndx.probe`` of the discriminator (the
one model with a loss of its own) on real and generated images, one ``nndx.Monitor``
per model/optimizer pair, the loop's own ``criterion`` calls, ``errD``/``errG`` logged
to their Monitors; after training ``nndx.probe(netD, ..., monitor=monD)`` and the
generator Monitor's report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dcgan"
SOURCE = Source("pytorch/examples", "dcgan/main.py", "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "netD_zero_grad_missing",
            "netD.zero_grad() dropped: the discriminator's gradients accumulate over iterations (and from errG.backward())",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/Project-MONAI/GenerativeModels/issues/102"),
            Measure("late_grad_norm_D", "netD's gradient norm at its last 20 steps, 3x the healthy run's or more",
                    lambda healthy, buggy: buggy >= 3 * healthy),
        ),
        Variant(
            "sigmoid_into_bce_with_logits",
            "criterion = nn.BCEWithLogitsLoss() while netD still ends in nn.Sigmoid (a sigmoid applied twice)",
            (C.DOUBLE_SOFTMAX,),
            ("https://github.com/itakurah/focal-loss-pytorch/pull/5",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/cvg/glue-factory/issues/89"),
            Measure("late_grad_norm_D", "netD's gradient norm at its last 20 steps, under a third of the healthy run's "
                    "(the second sigmoid's slope, at most 1/4, scales every gradient)",
                    lambda healthy, buggy: buggy < healthy / 3),
        ),
    )
}

NZ, NGF, NDF, NC = 16, 8, 8, 1


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, NGF * 4, 2, 1, 0, bias=False),  # 2x2
            nn.BatchNorm2d(NGF * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 4, NGF * 2, 4, 2, 1, bias=False),  # 4x4
            nn.BatchNorm2d(NGF * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 2, NC, 4, 2, 1, bias=False),  # 8x8
            nn.Tanh(),
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(NC, NDF, 4, 2, 1, bias=False),  # 4x4
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),  # 2x2
            nn.BatchNorm2d(NDF * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 2, 1, 2, 1, 0, bias=False),  # 1x1
            nn.Sigmoid(),
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.main(input).view(-1, 1).squeeze(1)


def grad_norm(model: nn.Module) -> float:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def train(variant: str, nx: Nndx, seed: int = 0, epochs: int = 5, batch_size: int = 64) -> dict[str, float]:
    torch.manual_seed(999 + seed)
    train_images, _, test_images, _ = data.digit_images(seed=seed, test_size=0)
    images = data.to_tensor(train_images) * 2.0 - 1.0  # ToTensor + Normalize((0.5,), (0.5,))
    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCEWithLogitsLoss() if variant == "sigmoid_into_bce_with_logits" else nn.BCELoss()
    real_label, fake_label = 1.0, 0.0
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    generator = torch.Generator().manual_seed(seed)

    with torch.no_grad():  # the preflight batch: real images and the untrained generator's
        probe_fake = netG(torch.randn(32, NZ, 1, 1, generator=generator))
    probe_batch = (torch.cat([images[:32], probe_fake]), torch.cat([torch.ones(32), torch.zeros(32)]))
    nx.preflight(netD, probe_batch, criterion, optimizer=optimizerD)
    monD = nx.monitor(netD, optimizerD, every=10)
    monG = nx.monitor(netG, optimizerG, every=10)

    errD_real_history: list[float] = []
    errD_fake_history: list[float] = []
    grad_norms_D: list[float] = []
    for epoch in range(epochs):
        order = torch.randperm(len(images), generator=generator)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            # (1) update D: maximise log(D(x)) + log(1 - D(G(z)))
            if variant != "netD_zero_grad_missing":
                netD.zero_grad()
            real = images[order[i : i + batch_size]]
            label = torch.full((batch_size,), real_label)
            output = netD(real)
            errD_real = criterion(output, label)
            errD_real.backward()
            noise = torch.randn(batch_size, NZ, 1, 1, generator=generator)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            errD = errD_real + errD_fake
            grad_norms_D.append(grad_norm(netD))
            optimizerD.step()
            monD.log(errD)
            # (2) update G: maximise log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            optimizerG.step()
            monG.log(errG)
            errD_real_history.append(errD_real.item())
            errD_fake_history.append(errD_fake.item())

    nx.finish(monD, netD, probe_batch, criterion, optimizer=optimizerD)
    nx.finish(monG)
    return {
        "min_errD_real": min(errD_real_history),
        "min_errD_fake": min(errD_fake_history),
        "late_errD_real": sum(errD_real_history[-20:]) / 20,
        "late_grad_norm_D": sum(grad_norms_D[-20:]) / 20,
    }
