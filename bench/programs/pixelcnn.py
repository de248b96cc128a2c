"""Port of jzbontar/pixelcnn-pytorch: a PixelCNN of masked convolutions (mask A, then B) with a per-pixel softmax.

Source: github.com/jzbontar/pixelcnn-pytorch, ``main.py`` at commit
14c9414602e0694692c77a5e0d87188adcded118 (MIT, Copyright (c) 2020 Jure Zbontar). Written
anew from the facts of that file; no code copied.

Kept: ``MaskedConv2d``, an ``nn.Conv2d`` holding a ``mask`` buffer of the weight's shape,
all ones except, in the kernel's centre row, the centre column onwards (type ``A``) or the
columns after the centre (type ``B``), and every row below the centre; its ``forward``
multiplies ``weight.data`` by the mask in place and then convolves. The net: one type-A
masked conv from 1 channel to ``fm`` (7x7, stride 1, padding 3, no bias), then type-B
masked convs ``fm`` -> ``fm`` (7x7, no bias), each followed by ``BatchNorm2d(fm)`` and
``ReLU(True)``, and a final ``nn.Conv2d(fm, classes, 1)`` giving one logit per intensity
class and pixel. Targets are the input image's own pixels, ``(input[:, 0] * (classes -
1)).long()`` (``* 255`` in the original, where the pixels are ToTensor's ``k / 255``); the
loss ``F.cross_entropy(net(input), target)`` over the class dimension; ``optim.Adam`` with
its default settings; per epoch ``net.train(True)``, a shuffled pass over the training set
(``zero_grad``, ``backward``, ``step``), then ``net.train(False)`` and the same loss over
the unshuffled test set, then sampling a batch pixel by pixel in raster order (softmax of
the logits at (i, j), ``torch.multinomial``, the class written back scaled to [0, 1]), and
the epoch line with the mean train and test NLL (nats per pixel).
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) quantised to 4 intensity levels
(pixel 0..16 rounded to 0..3, stored as ``level / 3``) instead of MNIST's 28x28 and 256
levels; ``fm`` 16 instead of 64; 1 type-A + 3 type-B masked layers instead of 1 + 7;
batch 32 instead of 128; 6 epochs instead of 25; 64 samples drawn after the last epoch
only (not each epoch), none saved to PNG; CPU, no cudnn/pin_memory/worker.
Measure only (not in the program): the test NLL in bits per dimension (the program's test
NLL / ln 2), the same computed with the logits laid out correctly (``permute`` before
flattening; equal to it when the loss line is as published), and the samples' mean
intensity level against the test images' (``sample_level_gap``).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(input, target) with the program's loss and the optimizer; ``nndx.Monitor(net,
optimizer)`` around the epochs, every batch's loss logged and each epoch's test NLL
logged as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "pixelcnn"
SOURCE = Source("jzbontar/pixelcnn-pytorch", "main.py", "14c9414602e0694692c77a5e0d87188adcded118", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 4 levels, fm 16, 4 masked layers, 6 epochs)"),
        Variant(
            "first_layer_mask_b",
            "the first masked convolution built with mask type 'B' instead of 'A': its kernel keeps the centre "
            "tap, so every output sees the very pixel it predicts; the NLL falls far below what any causal "
            "model reaches, and sampling (where that pixel is still 0) produces near-blank images",
            (C.DATA_LEAKAGE,),
            ("https://github.com/j-min/PixelCNN/issues/3", "https://github.com/j-min/PixelCNN/pull/4",
             "https://github.com/rosinality/vq-vae-2-pytorch/issues/31",
             "https://github.com/o-tawab/Video-Pixel-Networks/issues/1",
             "https://github.com/anantzoid/Conditional-PixelCNN-decoder/issues/9"),
            Measure("test_bpd", "test NLL (bits/dim) at least 0.3 below the healthy run's (impossibly good for a "
                    "causal model): 0.087/0.153/0.075 against 0.902/0.884/0.881 healthy on seeds 0-2; samples' mean "
                    "level off by 0.86-0.92 against 0.00-0.06",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "logits_view_without_permute",
            "the loss flattens the (N, classes, H, W) logits with .view(-1, classes) without moving the class "
            "dimension last (permute(0, 2, 3, 1)): each row of 'class logits' is 4 neighbouring pixels of one "
            "class channel, scored against an unrelated pixel's target",
            (C.WRONG_RESHAPE,),
            ("https://github.com/weirme/FCSN/issues/32", "https://github.com/clcarwin/focal_loss_pytorch/issues/6",
             "https://github.com/liuxuexun/RandLA-Net-Pytorch-New/issues/20"),
            Measure("test_bpd_permuted", "test NLL (bits/dim) of the logits laid out correctly at least 0.3 "
                    "above the healthy run's: 2.51/2.05/2.26 against 0.90/0.88/0.88 on seeds 0-2 "
                    "(the program's own test NLL, through the same wrong view: 0.91/0.89/0.88)",
                    lambda healthy, buggy: not buggy < healthy + 0.3),
        ),
    )
}

LEVELS, FM, N_MASKED, KERNEL, BATCH_SIZE, EPOCHS, N_SAMPLES = 4, 16, 4, 7, 32, 6, 64


class MaskedConv2d(nn.Conv2d):
    """A convolution whose kernel sees only the pixels before the centre (A) or up to it (B)."""

    def __init__(self, mask_type: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        assert mask_type in {"A", "B"}
        self.register_buffer("mask", torch.ones_like(self.weight.data))
        _, _, k_h, k_w = self.weight.shape
        self.mask[:, :, k_h // 2, k_w // 2 + (1 if mask_type == "B" else 0):] = 0
        self.mask[:, :, k_h // 2 + 1:] = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.data *= self.mask
        return super().forward(x)


def build_net(first_mask: str) -> nn.Sequential:
    layers: list[nn.Module] = [MaskedConv2d(first_mask, 1, FM, KERNEL, 1, KERNEL // 2, bias=False),
                               nn.BatchNorm2d(FM), nn.ReLU(True)]  # fmt: skip
    for _ in range(N_MASKED - 1):
        layers += [MaskedConv2d("B", FM, FM, KERNEL, 1, KERNEL // 2, bias=False), nn.BatchNorm2d(FM), nn.ReLU(True)]
    layers.append(nn.Conv2d(FM, LEVELS, 1))
    return nn.Sequential(*layers)


def quantised(images: torch.Tensor) -> torch.Tensor:
    """uint8 0..255 digits -> (N, 1, 8, 8) floats level / (LEVELS - 1), the ToTensor form of the levels."""
    levels = torch.round(images.float() / 255.0 * (LEVELS - 1))
    return (levels / (LEVELS - 1)).unsqueeze(1)


def make_loss(variant: str):
    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if variant == "logits_view_without_permute":
            return F.cross_entropy(output.view(-1, LEVELS), target.view(-1))
        return F.cross_entropy(output, target)

    return loss_fn


def targets_of(x: torch.Tensor) -> torch.Tensor:
    return (x[:, 0] * (LEVELS - 1)).long()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_raw, _, test_raw, _ = data.digit_images(seed=seed)
    x_train, x_test = quantised(train_raw), quantised(test_raw)
    tr = DataLoader(TensorDataset(x_train), batch_size=BATCH_SIZE, shuffle=True,
                    generator=torch.Generator().manual_seed(seed))  # fmt: skip
    te = DataLoader(TensorDataset(x_test), batch_size=BATCH_SIZE, shuffle=False)

    net = build_net("B" if variant == "first_layer_mask_b" else "A")
    loss_fn = make_loss(variant)
    optimizer = optim.Adam(net.parameters())

    first_batch = (x_train[:BATCH_SIZE], targets_of(x_train[:BATCH_SIZE]))
    nx.preflight(net, first_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=5)

    log: list[str] = []
    nll_tr = nll_te = nll_te_permuted = float("nan")
    sample = torch.zeros(N_SAMPLES, 1, 8, 8)
    for epoch in range(EPOCHS):
        err_tr = []
        net.train(True)
        for (inp,) in tr:
            target = targets_of(inp)
            loss = loss_fn(net(inp), target)
            err_tr.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))

        err_te, err_te_permuted = [], []
        net.train(False)
        with torch.no_grad():
            for (inp,) in te:
                target = targets_of(inp)
                out = net(inp)
                err_te.append(loss_fn(out, target).item())
                err_te_permuted.append(F.cross_entropy(out.permute(0, 2, 3, 1).reshape(-1, LEVELS),
                                                       target.reshape(-1)).item())  # fmt: skip
        nll_tr, nll_te = sum(err_tr) / len(err_tr), sum(err_te) / len(err_te)
        nll_te_permuted = sum(err_te_permuted) / len(err_te_permuted)
        nx.timed(lambda: mon.log(nll_te, split="val"))

        if epoch == EPOCHS - 1:  # the original samples every epoch; here once, at the end
            sample.fill_(0)
            net.train(False)
            with torch.no_grad():
                for i in range(8):
                    for j in range(8):
                        out = net(sample)
                        probs = F.softmax(out[:, :, i, j], dim=1)
                        sample[:, :, i, j] = torch.multinomial(probs, 1).float() / (LEVELS - 1)
        log.append(f"epoch={epoch}; nll_tr={nll_tr:.7f}; nll_te={nll_te:.7f}")

    nx.finish(mon, net, first_batch, loss_fn, optimizer=optimizer)
    gap = abs(float(sample.mean()) - float(x_test.mean())) * (LEVELS - 1)
    return {
        "test_bpd": nll_te / math.log(2),
        "test_bpd_permuted": nll_te_permuted / math.log(2),
        "train_nll": nll_tr,
        "sample_level_gap": gap,
    }
