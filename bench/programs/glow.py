"""Port of rosinality's glow-pytorch: a multi-scale Glow (ActNorm with data-dependent
initialisation, LU-decomposed invertible 1x1 convolution, affine coupling with a
zero-initialised last convolution, squeeze and split with a learned prior) trained by
maximum likelihood in bits per dimension on dequantised images.

Source: github.com/rosinality/glow-pytorch, ``model.py`` and ``train.py`` at commit
97081ff115a694cf04aeedbd58447f33d242c879 (the repository's HEAD; MIT, Copyright (c) 2018
Kim Seonghyeon). Written anew from the facts of those files; no code copied.

Kept: ``ActNorm`` (``loc``/``scale`` parameters, an ``initialized`` uint8 buffer, on the
first forward ``loc = -mean`` and ``scale = 1 / (std + 1e-6)`` per channel of that batch,
log-det ``H * W * sum(log|scale|)``); ``InvConv2dLU`` (a random orthogonal matrix from
``scipy.linalg.qr`` of a numpy normal draw, LU-factored by ``scipy.linalg.lu``, ``w_p``,
the masks, ``s_sign`` and ``l_eye`` as buffers, ``w_l``, ``w_s = log|s|``, ``w_u`` as
parameters, log-det ``H * W * sum(w_s)``); ``ZeroConv2d`` (3x3 conv, weight and bias
zeroed, input padded with value 1, output times ``exp(3 * scale)``); ``AffineCoupling``
(``Conv2d(C/2, filter, 3)`` and ``Conv2d(filter, filter, 1)`` with N(0, 0.05) weights and
ReLUs, then a ``ZeroConv2d`` to ``C`` channels; ``s = sigmoid(log_s + 2)``, ``out_b = (in_b
+ t) * s``, log-det ``sum(log s)``); ``Flow`` = actnorm, invconv, coupling; ``Block`` =
squeeze (2x2 space-to-channel), ``n_flow`` flows, then split with the learned prior
``ZeroConv2d(2C, 4C)`` of the kept half giving the mean and log-sd of the other half (the
last block: the prior of zeros); ``gaussian_log_p``; ``Glow.forward`` summing ``log_p``
and the log-dets over blocks; ``train.py``: ``n_bits`` 5 (``floor(x * 255 / 2 ** 3)``),
``x / n_bins - 0.5``, dequantisation ``x + U(0, 1) / n_bins``; step 0 a forward under
``no_grad`` (the ActNorm initialisation) and ``continue``; ``logdet.mean()``;
``calc_loss`` (``-log(n_bins) * n_pixel + logdet + log_p``, divided by ``log(2) *
n_pixel``: bits per dimension); ``model.zero_grad()``, ``backward``, the learning rate
written into ``param_groups[0]`` every step (the warm-up formula is commented out in the
source, so ``warmup_lr = lr``), ``optim.Adam(lr=1e-4)``; ``--affine`` given (affine
coupling), LU convolution (no ``--no_lu``); the infinite shuffled ``sample_data`` loader.
Shrunk: scikit-learn's 8x8 digits, one channel, instead of 64x64 RGB photographs
(``n_pixel`` counts that one channel: the source's hard-coded ``* 3`` is for RGB);
2 blocks of 3 flows instead of 4 of 32 (8x8 -> 4x4 -> 2x2), coupling width 32 instead
of 512; batch 64 instead of 16; 400 iterations instead of 200,000, so ``lr`` 1e-3
instead of 1e-4; no ``DataParallel``, no sample images, no checkpoints; no
RandomHorizontalFlip (digits).
Measure only (not in the program): the bits per dimension by ``calc_loss`` on 360
held-out digits, dequantised with fixed noise, after training. Seed 0 (without nndx):
healthy 3.70, no_dequantization 4.14 (its training loss 3.61, below the healthy run's
3.69), actnorm_reinit_every_forward 4.06.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch (its
dequantised images, as ``(x, None)``: a density model has no targets) with the program's
loss written as ``loss_fn(output, _)`` on the model's ``(log_p, logdet, z_outs)``, with
the optimizer, before the loop; ``nndx.Monitor(model, optimizer)`` around it, each step's
loss logged; then ``nndx.probe(..., monitor=mon)`` on the first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

from math import log, pi

import numpy as np
import torch
from scipy import linalg as la
from torch import nn, optim
from torch.nn import functional as F

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "glow"
SOURCE = Source("rosinality/glow-pytorch", "train.py", "97081ff115a694cf04aeedbd58447f33d242c879", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, 2 blocks x 3 flows, width 32)"),
        Variant(
            "no_dequantization",
            "model(image) instead of model(image + torch.rand_like(image) / n_bins): the uniform dequantisation "
            "noise left out, so a continuous density is fitted to a few discrete pixel levels and the likelihood "
            "can grow without bound by collapsing onto them",
            (C.WRONG_LOSS,),
            ("https://github.com/openai/glow/issues/43",
             "https://github.com/y0ast/Glow-PyTorch/issues/23",
             "https://github.com/rosinality/glow-pytorch/issues/16"),
            Measure("heldout_bpd", "held-out bits/dim (dequantised, correct formula) at least 0.25 above the "
                    "healthy run's", lambda healthy, buggy: not buggy < healthy + 0.25),
        ),
        Variant(
            "actnorm_reinit_every_forward",
            "ActNorm's initialized flag is never set (the fill_(1) lost, as when the flag is a plain attribute "
            "that is not restored): the data-dependent initialisation runs on every forward, overwriting the "
            "learned loc/scale with the current batch's statistics",
            (C.BAD_INIT, C.FROZEN_PARAMETERS),
            ("https://github.com/rosinality/glow-pytorch/issues/6",
             "https://github.com/rosinality/glow-pytorch/issues/46",
             "https://github.com/jaywalnut310/glow-tts/issues/73"),
            Measure("heldout_bpd", "held-out bits/dim at least 0.1 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
    )
}

N_FLOW, N_BLOCK, FILTER, BATCH, ITERS, LR, N_BITS, IMG_SIZE, N_CHANNEL = 3, 2, 32, 64, 400, 1e-3, 5, 8, 1

logabs = lambda x: torch.log(torch.abs(x))  # noqa: E731 - the source's helper


# --------------------------------------------------------------------------- model.py


class ActNorm(nn.Module):
    def __init__(self, in_channel: int, reinit_every_forward: bool = False) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, in_channel, 1, 1))
        self.scale = nn.Parameter(torch.ones(1, in_channel, 1, 1))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))
        self.reinit_every_forward = reinit_every_forward

    def initialize(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            flat = x.permute(1, 0, 2, 3).contiguous().view(x.shape[1], -1)
            mean = flat.mean(1).view(1, -1, 1, 1)
            std = flat.std(1).view(1, -1, 1, 1)
            self.loc.data.copy_(-mean)
            self.scale.data.copy_(1 / (std + 1e-6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, _, height, width = x.shape
        if self.initialized.item() == 0:
            self.initialize(x)
            if not self.reinit_every_forward:
                self.initialized.fill_(1)
        logdet = height * width * torch.sum(logabs(self.scale))
        return self.scale * (x + self.loc), logdet

    def reverse(self, y: torch.Tensor) -> torch.Tensor:
        return y / self.scale - self.loc


class InvConv2dLU(nn.Module):
    def __init__(self, in_channel: int) -> None:
        super().__init__()
        weight = np.random.randn(in_channel, in_channel)
        q, _ = la.qr(weight)
        w_p, w_l, w_u = (np.ascontiguousarray(m) for m in la.lu(q.astype(np.float32)))
        w_s = np.diag(w_u).copy()
        w_u = np.triu(w_u, 1)
        u_mask = np.triu(np.ones_like(w_u), 1)
        l_mask = u_mask.T
        self.register_buffer("w_p", torch.from_numpy(w_p))
        self.register_buffer("u_mask", torch.from_numpy(u_mask))
        self.register_buffer("l_mask", torch.from_numpy(l_mask))
        self.register_buffer("s_sign", torch.sign(torch.from_numpy(w_s.copy())))
        self.register_buffer("l_eye", torch.eye(l_mask.shape[0]))
        self.w_l = nn.Parameter(torch.from_numpy(w_l))
        self.w_s = nn.Parameter(logabs(torch.from_numpy(w_s)))
        self.w_u = nn.Parameter(torch.from_numpy(w_u))

    def calc_weight(self) -> torch.Tensor:
        weight = (self.w_p @ (self.w_l * self.l_mask + self.l_eye)
                  @ ((self.w_u * self.u_mask) + torch.diag(self.s_sign * torch.exp(self.w_s))))  # fmt: skip
        return weight.unsqueeze(2).unsqueeze(3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, _, height, width = x.shape
        out = F.conv2d(x, self.calc_weight())
        return out, height * width * torch.sum(self.w_s)

    def reverse(self, y: torch.Tensor) -> torch.Tensor:
        return F.conv2d(y, self.calc_weight().squeeze().inverse().unsqueeze(2).unsqueeze(3))


class ZeroConv2d(nn.Module):
    def __init__(self, in_channel: int, out_channel: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channel, out_channel, 3, padding=0)
        self.conv.weight.data.zero_()
        self.conv.bias.data.zero_()
        self.scale = nn.Parameter(torch.zeros(1, out_channel, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(F.pad(x, [1, 1, 1, 1], value=1))
        return out * torch.exp(self.scale * 3)


class AffineCoupling(nn.Module):
    def __init__(self, in_channel: int, filter_size: int = FILTER) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channel // 2, filter_size, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(filter_size, filter_size, 1), nn.ReLU(inplace=True),
            ZeroConv2d(filter_size, in_channel),
        )  # fmt: skip
        self.net[0].weight.data.normal_(0, 0.05)
        self.net[0].bias.data.zero_()
        self.net[2].weight.data.normal_(0, 0.05)
        self.net[2].bias.data.zero_()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        in_a, in_b = x.chunk(2, 1)
        log_s, t = self.net(in_a).chunk(2, 1)
        s = torch.sigmoid(log_s + 2)
        out_b = (in_b + t) * s
        logdet = torch.sum(torch.log(s).view(x.shape[0], -1), 1)
        return torch.cat([in_a, out_b], 1), logdet


class Flow(nn.Module):
    def __init__(self, in_channel: int, reinit: bool) -> None:
        super().__init__()
        self.actnorm = ActNorm(in_channel, reinit_every_forward=reinit)
        self.invconv = InvConv2dLU(in_channel)
        self.coupling = AffineCoupling(in_channel)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, logdet = self.actnorm(x)
        out, det1 = self.invconv(out)
        out, det2 = self.coupling(out)
        return out, logdet + det1 + det2


def gaussian_log_p(x: torch.Tensor, mean: torch.Tensor, log_sd: torch.Tensor) -> torch.Tensor:
    return -0.5 * log(2 * pi) - log_sd - 0.5 * (x - mean) ** 2 / torch.exp(2 * log_sd)


class Block(nn.Module):
    def __init__(self, in_channel: int, n_flow: int, split: bool, reinit: bool) -> None:
        super().__init__()
        squeeze_dim = in_channel * 4
        self.flows = nn.ModuleList([Flow(squeeze_dim, reinit) for _ in range(n_flow)])
        self.split = split
        self.prior = ZeroConv2d(in_channel * 2, in_channel * 4) if split else ZeroConv2d(in_channel * 4, in_channel * 8)

    def forward(self, x: torch.Tensor):
        b_size, n_channel, height, width = x.shape
        squeezed = x.view(b_size, n_channel, height // 2, 2, width // 2, 2).permute(0, 1, 3, 5, 2, 4)
        out = squeezed.contiguous().view(b_size, n_channel * 4, height // 2, width // 2)
        logdet = 0
        for flow in self.flows:
            out, det = flow(out)
            logdet = logdet + det
        if self.split:
            out, z_new = out.chunk(2, 1)
            mean, log_sd = self.prior(out).chunk(2, 1)
        else:
            z_new = out
            mean, log_sd = self.prior(torch.zeros_like(out)).chunk(2, 1)
        log_p = gaussian_log_p(z_new, mean, log_sd).view(b_size, -1).sum(1)
        return out, logdet, log_p, z_new


class Glow(nn.Module):
    def __init__(self, in_channel: int, n_flow: int, n_block: int, reinit: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        n_channel = in_channel
        for _ in range(n_block - 1):
            self.blocks.append(Block(n_channel, n_flow, split=True, reinit=reinit))
            n_channel *= 2
        self.blocks.append(Block(n_channel, n_flow, split=False, reinit=reinit))

    def forward(self, x: torch.Tensor):
        log_p_sum, logdet, out, z_outs = 0, 0, x, []
        for block in self.blocks:
            out, det, log_p, z_new = block(out)
            z_outs.append(z_new)
            logdet = logdet + det
            log_p_sum = log_p_sum + log_p
        return log_p_sum, logdet, z_outs


# --------------------------------------------------------------------------- train.py


def calc_loss(log_p: torch.Tensor, logdet: torch.Tensor, image_size: int, n_bins: float):
    n_pixel = image_size * image_size * N_CHANNEL
    loss = -log(n_bins) * n_pixel + logdet + log_p
    return ((-loss / (log(2) * n_pixel)).mean(), (log_p / (log(2) * n_pixel)).mean(),
            (logdet / (log(2) * n_pixel)).mean())  # fmt: skip


def sample_data(images: torch.Tensor, batch_size: int, generator: torch.Generator):
    """the infinite shuffled loader: a new permutation each pass"""
    while True:
        order = torch.randperm(len(images), generator=generator)
        for start in range(0, len(images) - batch_size + 1, batch_size):
            yield images[order[start : start + batch_size]]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_images, _, test_images, _ = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)  # ToTensor: [0, 1]

    model = Glow(N_CHANNEL, N_FLOW, N_BLOCK, reinit=variant == "actnorm_reinit_every_forward")
    optimizer = optim.Adam(model.parameters(), lr=LR)
    n_bins = 2.0**N_BITS
    dequantize = variant != "no_dequantization"

    def prepare(image: torch.Tensor) -> torch.Tensor:
        image = image * 255
        image = torch.floor(image / 2 ** (8 - N_BITS))
        return image / n_bins - 0.5

    def loss_fn(output, _targets=None) -> torch.Tensor:
        log_p, logdet, _ = output
        return calc_loss(log_p, logdet.mean(), IMG_SIZE, n_bins)[0]

    dataset = sample_data(train_x, BATCH, torch.Generator().manual_seed(seed))
    first = prepare(next(dataset))
    first_in = first + torch.rand_like(first) / n_bins if dequantize else first
    probe_batch = (first_in, None)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    losses: list[float] = []
    for i in range(ITERS):
        image = first if i == 0 else prepare(next(dataset))
        x = (first_in if i == 0 else image + torch.rand_like(image) / n_bins) if dequantize else image
        if i == 0:
            with torch.no_grad():
                log_p, logdet, _ = model(x)  # ActNorm's data-dependent initialisation
                continue
        log_p, logdet, _ = model(x)
        logdet = logdet.mean()
        loss, log_p, log_det = calc_loss(log_p, logdet, IMG_SIZE, n_bins)
        model.zero_grad()
        loss.backward()
        warmup_lr = LR  # the source's warm-up formula is commented out
        optimizer.param_groups[0]["lr"] = warmup_lr
        optimizer.step()
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        losses.append(loss.item())

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    # measure only: held-out bits/dim, dequantised with fixed noise, by calc_loss
    gen = torch.Generator().manual_seed(seed + 1000)
    test = prepare(test_x)
    test = test + torch.rand(test.shape, generator=gen) / n_bins
    with torch.no_grad():
        log_p, logdet, _ = model(test)
        heldout = calc_loss(log_p, logdet.mean(), IMG_SIZE, n_bins)[0]
    return {"heldout_bpd": float(heldout), "last_loss": float(np.mean(losses[-20:]))}
