"""Port of aitorzip's PyTorch-CycleGAN: two generators, two discriminators, LSGAN + cycle +
identity losses, image replay buffers, a linear learning-rate decay.

Source: github.com/aitorzip/PyTorch-CycleGAN, ``train``, ``models.py`` and ``utils.py`` at
commit 67da8f9e2b69bd68763451803c7700aaccc92f18 (the three files last changed in
84cca46c5db0ab6e6b1ca78de59cfe17f25df399; ``datasets.py`` at the same HEAD; GPL-3.0,
Copyright (c) 2017 Aitor Ruano). Written anew from the facts of those files; no code copied.

Kept: ``Generator`` = ``ReflectionPad2d(3)`` + 7x7 ``Conv2d`` + ``InstanceNorm2d`` +
``ReLU(inplace=True)``, two stride-2 3x3 convolutions (width doubling), ``ResidualBlock`` s
(reflection pad, 3x3 conv, instance norm, ReLU, reflection pad, 3x3 conv, instance norm,
``x + block(x)``), two ``ConvTranspose2d(3, stride=2, padding=1, output_padding=1)``
(width halving), reflection pad + 7x7 conv to ``output_nc`` + ``Tanh``; ``Discriminator`` =
4x4 stride-2 convolutions with ``LeakyReLU(0.2, inplace=True)`` and ``InstanceNorm2d`` from
the second one, a stride-1 4x4 convolution, a last 4x4 convolution to one channel, then
``F.avg_pool2d`` over the whole map and ``.view(batch, -1)`` (so D's output is (batch, 1)
while ``target_real``/``target_fake`` are ``Tensor(batchSize)``: MSELoss broadcasts them, as
in the original, harmless at batch 1 and constant targets, issue #15/#24 there);
``weights_init_normal`` (N(0, 0.02) on every Conv weight, the BatchNorm2d branch never hit);
``criterion_GAN = MSELoss``, ``criterion_cycle = criterion_identity = L1Loss``; one
``Adam(lr=2e-4, betas=(0.5, 0.999))`` over ``itertools.chain`` of both generators and one per
discriminator; ``torch.optim.lr_scheduler.LambdaLR`` with the repository's ``LambdaLR.step``
(``1 - max(0, epoch + offset - decay_epoch) / (n_epochs - decay_epoch)``), stepped once per
epoch after the batch loop; ``ReplayBuffer(max_size=50)`` with ``push_and_pop`` (each
image kept while the buffer fills, then with probability 1/2 swapped for a stored one) on
python's ``random``; the unaligned ``ImageDataset`` (A by index, B drawn with
``random.randint``) through Resize(1.12 x size, bicubic), RandomCrop(size),
RandomHorizontalFlip, ToTensor, Normalize(0.5, 0.5); ``batchSize = 1``; preallocated
``input_A``/``input_B`` filled with ``copy_``; the loop: ``optimizer_G.zero_grad()``,
identity losses x5, GAN losses of ``netD_B(G_A2B(A))``/``netD_A(G_B2A(B))`` against
``target_real``, cycle losses x10, ``loss_G.backward()``, ``optimizer_G.step()``; then for
each discriminator ``zero_grad``, real against ``target_real``, the buffer's fake
``.detach()`` against ``target_fake``, ``(real + fake) * 0.5``, backward, step; the
Logger's five losses (here ``.item()``: the original's ``.data[0]`` fails on current
PyTorch, its issue #24).
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16 instead of 256x256 photographs,
one channel (``--input_nc 1 --output_nc 1``); domain A = 200 digits, domain B = 200
other digits inverted and turned a quarter (the horse2zebra stand-in); generator width 8
instead of 64 and 2 residual blocks instead of 9; discriminator widths 8-16-32 with one
stride-2 convolution fewer (a 16x16 image has no room for three); 4 epochs with the decay
from epoch 2 instead of 200 / 100. Visdom plotting and the checkpoint saves are left out.

nndx, as a GAN author would add it (like the DCGAN port): a preflight ``nndx.probe`` of
``netD_A`` (a model with a loss of its own) on 16 real A images and 16 ``G_B2A(B)`` fakes
with ``criterion_GAN`` and the program's own target convention (a 1-D ``Tensor(n)`` of
ones, then zeros); one ``nndx.Monitor`` per optimizer (``{"G_A2B", "G_B2A"}`` with
``optimizer_G``, ``netD_A`` with ``optimizer_D_A``, ``netD_B`` with ``optimizer_D_B``),
``loss_G``/``loss_D_A``/``loss_D_B`` logged to them; after training
``nndx.probe(netD_A, ..., monitor=monD_A)`` and the other two Monitors' reports, each
diagnosed; the author reads them ranked together.
"""

from __future__ import annotations

import itertools
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cyclegan"
SOURCE = Source("aitorzip/PyTorch-CycleGAN", "train", "67da8f9e2b69bd68763451803c7700aaccc92f18", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "scheduler_step_per_batch",
            "lr_scheduler_G/D_A/D_B.step() moved into the batch loop: the LambdaLR meant per epoch counts "
            "iterations, so the LR decays to 0 within a few steps and then goes negative (gradient ascent)",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/1", "https://github.com/pytorch/tutorials/pull/640",
             "https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/209"),
            Measure("test_cycle_l1", "L1 of G_B2A(G_A2B(a)) against a on 64 held-out digits, 1.5x the healthy "
                    "run's or more", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "optimizer_G_misses_G_B2A",
            "optimizer_G = Adam(netG_A2B.parameters(), ...): the itertools.chain dropped, netG_B2A is in the "
            "loss but in no optimizer, so it never learns",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/tuyunbin/SCORER/issues/3",
             "https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/1381",
             "https://github.com/eriklindernoren/PyTorch-GAN/issues/108"),
            Measure("test_cycle_l1", "L1 of G_B2A(G_A2B(a)) against a on 64 held-out digits, 1.5x the healthy "
                    "run's or more", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

# the options, shrunk
n_epochs, decay_epoch, batchSize, lr = 4, 2, 1, 0.0002
size, input_nc, output_nc = 16, 1, 1
NGF, N_RES, NDF = 8, 2, 8
PER_DOMAIN = 64
PROBE = 16


# --------------------------------------------------------------------------- models.py


class ResidualBlock(nn.Module):
    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(in_features, in_features, 3), nn.InstanceNorm2d(in_features),
            nn.ReLU(inplace=True),
            nn.ReflectionPad2d(1), nn.Conv2d(in_features, in_features, 3), nn.InstanceNorm2d(in_features),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv_block(x)


class Generator(nn.Module):
    def __init__(self, input_nc: int, output_nc: int, n_residual_blocks: int = N_RES) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.ReflectionPad2d(3), nn.Conv2d(input_nc, NGF, 7), nn.InstanceNorm2d(NGF),
                                   nn.ReLU(inplace=True)]  # fmt: skip
        width = NGF
        for _ in range(2):  # down
            layers += [nn.Conv2d(width, width * 2, 3, stride=2, padding=1), nn.InstanceNorm2d(width * 2),
                       nn.ReLU(inplace=True)]  # fmt: skip
            width *= 2
        layers += [ResidualBlock(width) for _ in range(n_residual_blocks)]
        for _ in range(2):  # up
            layers += [nn.ConvTranspose2d(width, width // 2, 3, stride=2, padding=1, output_padding=1),
                       nn.InstanceNorm2d(width // 2), nn.ReLU(inplace=True)]  # fmt: skip
            width //= 2
        layers += [nn.ReflectionPad2d(3), nn.Conv2d(NGF, output_nc, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class Discriminator(nn.Module):
    def __init__(self, input_nc: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(input_nc, NDF, 4, stride=2, padding=1), nn.LeakyReLU(0.2, inplace=True)]
        layers += [nn.Conv2d(NDF, NDF * 2, 4, stride=2, padding=1), nn.InstanceNorm2d(NDF * 2),
                   nn.LeakyReLU(0.2, inplace=True)]  # fmt: skip
        layers += [nn.Conv2d(NDF * 2, NDF * 4, 4, padding=1), nn.InstanceNorm2d(NDF * 4),
                   nn.LeakyReLU(0.2, inplace=True)]  # fmt: skip
        layers += [nn.Conv2d(NDF * 4, 1, 4, padding=1)]  # the FCN classification layer
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.model(x)
        return F.avg_pool2d(x, x.size()[2:]).view(x.size()[0], -1)  # average pooling and flatten


# --------------------------------------------------------------------------- utils.py


class ReplayBuffer:
    def __init__(self, max_size: int = 50) -> None:
        assert max_size > 0, "an empty buffer"
        self.max_size = max_size
        self.data: list[torch.Tensor] = []

    def push_and_pop(self, images: torch.Tensor) -> torch.Tensor:
        out = []
        for element in images.data:
            element = torch.unsqueeze(element, 0)
            if len(self.data) < self.max_size:
                self.data.append(element)
                out.append(element)
            elif random.uniform(0, 1) > 0.5:
                i = random.randint(0, self.max_size - 1)
                out.append(self.data[i].clone())
                self.data[i] = element
            else:
                out.append(element)
        return torch.cat(out)


class LambdaLR:
    def __init__(self, n_epochs: int, offset: int, decay_start_epoch: int) -> None:
        assert n_epochs - decay_start_epoch > 0, "the decay must start before the training ends"
        self.n_epochs, self.offset, self.decay_start_epoch = n_epochs, offset, decay_start_epoch

    def step(self, epoch: int) -> float:
        return 1.0 - max(0, epoch + self.offset - self.decay_start_epoch) / (self.n_epochs - self.decay_start_epoch)


def weights_init_normal(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm2d") != -1:
        torch.nn.init.normal_(m.weight.data, 1.0, 0.02)
        torch.nn.init.constant_(m.bias.data, 0.0)


# --------------------------------------------------------------------------- datasets.py


class ImageDataset(Dataset):
    """Unaligned A/B images: the digits pre-resized to 1.12 x size (Resize, bicubic), then per
    item RandomCrop(size), RandomHorizontalFlip, and Normalize(0.5, 0.5) of ToTensor's pixels."""

    def __init__(self, files_A: torch.Tensor, files_B: torch.Tensor, unaligned: bool = False) -> None:
        self.files_A, self.files_B, self.unaligned = files_A, files_B, unaligned

    def transform(self, image: torch.Tensor) -> torch.Tensor:
        top = torch.randint(0, image.shape[-2] - size + 1, (1,)).item()
        left = torch.randint(0, image.shape[-1] - size + 1, (1,)).item()
        image = image[:, top : top + size, left : left + size]
        if torch.rand(1) < 0.5:
            image = image.flip(-1)
        return (image - 0.5) / 0.5

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item_A = self.transform(self.files_A[index % len(self.files_A)])
        if self.unaligned:
            item_B = self.transform(self.files_B[random.randint(0, len(self.files_B) - 1)])
        else:
            item_B = self.transform(self.files_B[index % len(self.files_B)])
        return {"A": item_A, "B": item_B}

    def __len__(self) -> int:
        return max(len(self.files_A), len(self.files_B))


def domains(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train A, train B, test A, test B) in ToTensor's [0, 1], resized to 1.12 x size: A the
    digits, B other digits inverted and turned a quarter."""
    train_images, _, test_images, _ = data.digit_images(seed=seed)
    big = int(size * 1.12)

    def resized(raw: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(data.to_tensor(raw), size=(big, big), mode="bicubic", align_corners=False)
        return x.clamp(0, 1)

    a = resized(train_images[:PER_DOMAIN])
    b = 1.0 - torch.rot90(resized(train_images[PER_DOMAIN : 2 * PER_DOMAIN]), 1, (2, 3))
    test_a = resized(test_images[:64])
    test_b = 1.0 - torch.rot90(resized(test_images[64:128]), 1, (2, 3))
    return a, b, test_a, test_b


# --------------------------------------------------------------------------- train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    random.seed(seed)
    files_A, files_B, test_A, test_B = domains(seed)

    netG_A2B, netG_B2A = Generator(input_nc, output_nc), Generator(output_nc, input_nc)
    netD_A, netD_B = Discriminator(input_nc), Discriminator(output_nc)
    for net in (netG_A2B, netG_B2A, netD_A, netD_B):
        net.apply(weights_init_normal)

    criterion_GAN = torch.nn.MSELoss()
    criterion_cycle = torch.nn.L1Loss()
    criterion_identity = torch.nn.L1Loss()

    g_params = (netG_A2B.parameters() if variant == "optimizer_G_misses_G_B2A"
                else itertools.chain(netG_A2B.parameters(), netG_B2A.parameters()))  # fmt: skip
    optimizer_G = torch.optim.Adam(g_params, lr=lr, betas=(0.5, 0.999))
    optimizer_D_A = torch.optim.Adam(netD_A.parameters(), lr=lr, betas=(0.5, 0.999))
    optimizer_D_B = torch.optim.Adam(netD_B.parameters(), lr=lr, betas=(0.5, 0.999))
    Sched = torch.optim.lr_scheduler.LambdaLR
    lr_scheduler_G = Sched(optimizer_G, lr_lambda=LambdaLR(n_epochs, 0, decay_epoch).step)
    lr_scheduler_D_A = Sched(optimizer_D_A, lr_lambda=LambdaLR(n_epochs, 0, decay_epoch).step)
    lr_scheduler_D_B = Sched(optimizer_D_B, lr_lambda=LambdaLR(n_epochs, 0, decay_epoch).step)
    schedulers = (lr_scheduler_G, lr_scheduler_D_A, lr_scheduler_D_B)

    input_A = torch.Tensor(batchSize, input_nc, size, size)
    input_B = torch.Tensor(batchSize, output_nc, size, size)
    target_real = torch.Tensor(batchSize).fill_(1.0)
    target_fake = torch.Tensor(batchSize).fill_(0.0)
    fake_A_buffer, fake_B_buffer = ReplayBuffer(), ReplayBuffer()

    dataloader = DataLoader(ImageDataset(files_A, files_B, unaligned=True), batch_size=batchSize, shuffle=True,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip

    # the preflight batch: real A images and the untrained G_B2A's fakes, the program's 1-D targets
    crop = (files_A.shape[-1] - size) // 2
    probe_real = (files_A[:PROBE, :, crop : crop + size, crop : crop + size] - 0.5) / 0.5
    with torch.no_grad():
        probe_fake = netG_B2A((files_B[:PROBE, :, crop : crop + size, crop : crop + size] - 0.5) / 0.5)
    probe_batch = (torch.cat([probe_real, probe_fake]),
                   torch.cat([torch.Tensor(PROBE).fill_(1.0), torch.Tensor(PROBE).fill_(0.0)]))  # fmt: skip
    nx.preflight(netD_A, probe_batch, criterion_GAN, optimizer=optimizer_D_A)
    monG = nx.monitor({"G_A2B": netG_A2B, "G_B2A": netG_B2A}, optimizer_G, every=10)
    monD_A = nx.monitor(netD_A, optimizer_D_A, every=10)
    monD_B = nx.monitor(netD_B, optimizer_D_B, every=10)

    names = ("loss_G", "loss_G_identity", "loss_G_GAN", "loss_G_cycle", "loss_D")
    logged: dict[str, list[float]] = {k: [] for k in names}
    for epoch in range(n_epochs):
        for i, batch in enumerate(dataloader):
            real_A = input_A.copy_(batch["A"])
            real_B = input_B.copy_(batch["B"])

            # generators A2B and B2A
            optimizer_G.zero_grad()
            same_B = netG_A2B(real_B)  # identity: G_A2B(B) should be B
            loss_identity_B = criterion_identity(same_B, real_B) * 5.0
            same_A = netG_B2A(real_A)
            loss_identity_A = criterion_identity(same_A, real_A) * 5.0
            fake_B = netG_A2B(real_A)  # GAN
            pred_fake = netD_B(fake_B)
            loss_GAN_A2B = criterion_GAN(pred_fake, target_real)
            fake_A = netG_B2A(real_B)
            pred_fake = netD_A(fake_A)
            loss_GAN_B2A = criterion_GAN(pred_fake, target_real)
            recovered_A = netG_B2A(fake_B)  # cycle
            loss_cycle_ABA = criterion_cycle(recovered_A, real_A) * 10.0
            recovered_B = netG_A2B(fake_A)
            loss_cycle_BAB = criterion_cycle(recovered_B, real_B) * 10.0
            loss_G = loss_identity_A + loss_identity_B + loss_GAN_A2B + loss_GAN_B2A + loss_cycle_ABA + loss_cycle_BAB
            loss_G.backward()
            optimizer_G.step()
            monG.log(loss_G)

            # discriminator A
            optimizer_D_A.zero_grad()
            pred_real = netD_A(real_A)
            loss_D_real = criterion_GAN(pred_real, target_real)
            fake_A = fake_A_buffer.push_and_pop(fake_A)
            pred_fake = netD_A(fake_A.detach())
            loss_D_fake = criterion_GAN(pred_fake, target_fake)
            loss_D_A = (loss_D_real + loss_D_fake) * 0.5
            loss_D_A.backward()
            optimizer_D_A.step()
            monD_A.log(loss_D_A)

            # discriminator B
            optimizer_D_B.zero_grad()
            pred_real = netD_B(real_B)
            loss_D_real = criterion_GAN(pred_real, target_real)
            fake_B = fake_B_buffer.push_and_pop(fake_B)
            pred_fake = netD_B(fake_B.detach())
            loss_D_fake = criterion_GAN(pred_fake, target_fake)
            loss_D_B = (loss_D_real + loss_D_fake) * 0.5
            loss_D_B.backward()
            optimizer_D_B.step()
            monD_B.log(loss_D_B)

            # the Logger's losses
            logged["loss_G"].append(loss_G.item())
            logged["loss_G_identity"].append((loss_identity_A + loss_identity_B).item())
            logged["loss_G_GAN"].append((loss_GAN_A2B + loss_GAN_B2A).item())
            logged["loss_G_cycle"].append((loss_cycle_ABA + loss_cycle_BAB).item())
            logged["loss_D"].append((loss_D_A + loss_D_B).item())
            if variant == "scheduler_step_per_batch":
                for scheduler in schedulers:
                    scheduler.step()

        if variant != "scheduler_step_per_batch":  # update the learning rates, once per epoch
            for scheduler in schedulers:
                scheduler.step()

    nx.finish(monG)
    nx.finish(monD_A, netD_A, probe_batch, criterion_GAN, optimizer=optimizer_D_A)
    nx.finish(monD_B)

    def late(name: str) -> float:
        values = logged[name][-100:]
        return sum(values) / len(values)

    with torch.no_grad():  # measure only: the cycle A -> B -> A on held-out digits
        test_a = (test_A[:, :, crop : crop + size, crop : crop + size] - 0.5) / 0.5
        test_cycle = F.l1_loss(netG_B2A(netG_A2B(test_a)), test_a).item()
    return {
        "late_loss_G": late("loss_G"),
        "late_loss_G_cycle": late("loss_G_cycle"),
        "late_loss_G_identity": late("loss_G_identity"),
        "late_loss_D": late("loss_D"),
        "test_cycle_l1": test_cycle,
        "final_lr_G": optimizer_G.param_groups[0]["lr"],
    }
