"""Port of rosinality's stylegan2-pytorch: StyleGAN2 (a mapping network of equalized-learning-rate
linear layers, modulated/demodulated convolutions with noise injection, skip ToRGB outputs, a
residual discriminator with a minibatch-stddev layer), the non-saturating logistic loss, lazy R1
regularization every ``d_reg_every`` steps, lazy path-length regularization every
``g_reg_every`` steps, an EMA copy of the generator, Adam with the lazy-regularization ratio
applied to the learning rate and the betas.

Source: github.com/rosinality/stylegan2-pytorch, ``train.py`` and ``model.py`` (and the
CPU paths of ``op/fused_act.py`` and ``op/upfirdn2d.py``) at commit
bef283a1c24087da704d16c30abc8e36e63efa0e (the repository's HEAD; MIT, Copyright (c) 2019 Kim
Seonghyeon; the ops carry NVIDIA's licence). Written anew from the facts of those files; no
code copied.

Kept: ``PixelNorm``; ``EqualLinear`` (weight ``randn / lr_mul``, scale ``lr_mul / sqrt(in)``,
bias times ``lr_mul``, the fused leaky ReLU (slope 0.2, gain sqrt 2, bias added first) when
``activation="fused_lrelu"``); ``EqualConv2d``; ``upfirdn2d`` (zero-insertion up-sampling,
padding, the flipped FIR kernel, down-sampling) behind ``Upsample`` and ``Blur`` with the
``[1, 3, 3, 1]`` kernel and the original's padding arithmetic; ``ModulatedConv2d`` (the fused
path: style from an ``EqualLinear(bias_init=1)``, the weight scaled per sample, demodulated by
``rsqrt(sum w^2 + 1e-8)``, one grouped convolution over the batch; up-sampling by a grouped
stride-2 transposed convolution then the blur); ``NoiseInjection`` (a zero-initialised weight
times fresh Gaussian noise); ``ConstantInput``; ``StyledConv`` (modulated conv, noise, fused
leaky ReLU with its bias); ``ToRGB`` (a 1x1 modulated conv without demodulation, a bias, the
up-sampled skip added); ``Generator.forward`` (mapping of each style, style mixing at a random
``inject_index``, the constant input, ``conv1``/``to_rgb1``, then per resolution an up-sampling
``StyledConv``, a ``StyledConv`` and a ``ToRGB``; ``return_latents``); ``ConvLayer`` (blur then
stride-2 ``EqualConv2d`` when down-sampling, fused leaky ReLU), ``ResBlock`` (two convs and a
1x1 down-sampling skip, summed and divided by sqrt 2), ``Discriminator`` (``ConvLayer(1x1)``, the
ResBlocks, the minibatch standard deviation over groups of 4, ``final_conv``, two
``EqualLinear``); ``train.py``: ``requires_grad`` toggling, ``d_logistic_loss``,
``d_r1_loss`` (``autograd.grad(create_graph=True)`` of the real predictions' sum),
``g_nonsaturating_loss``, ``g_path_regularize`` (decay 0.01), ``mixing_noise`` (probability
0.9), ``accumulate`` for the EMA, the loop's order (D step; lazy R1 step with ``r1 / 2 * r1_loss
* d_reg_every + 0 * real_pred[0]``; G step; lazy path step with ``path_regularize * g_reg_every
* path_loss + 0 * fake_img[0, 0, 0, 0]`` on ``batch // path_batch_shrink`` samples; EMA update),
``discriminator.zero_grad()``/``generator.zero_grad()`` before each backward; Adam at ``lr *
reg_ratio`` with betas ``(0 ** ratio, 0.99 ** ratio)``, ``reg_ratio = every / (every + 1)``;
``lr`` 0.002, ``r1`` 10, ``path_regularize`` 2, ``path_batch_shrink`` 2, ``d_reg_every`` 16,
``g_reg_every`` 4, batch 16, ``lr_mlp`` 0.01; images through ``ToTensor`` + ``Normalize(0.5,
0.5)``; ``g_ema`` in eval mode, initialised by ``accumulate(g_ema, generator, 0)``; the
samples drawn from ``g_ema``.
Shrunk: scikit-learn's 8x8 digits, one channel (``ToRGB`` and the discriminator's first layer
have 1 channel instead of 3), instead of an LMDB of 256x256 photographs; ``size`` 8 (one
up-sampling level: 4 -> 8); ``style_dim`` 32 and ``n_mlp`` 2 instead of 512 and 8; every
resolution 32 channels instead of 512; 300 iterations instead of 800,000; ``r1`` 1 instead of 10
(the R1 weight is meant to shrink with the resolution: StyleGAN2-ADA's heuristic gives far
less than 1 at 8x8; at 10 the 300-iteration healthy run reaches a Frechet distance of 109
against 62 at 1); the EMA half-life
1,000 images instead of 10,000 (``accum = 0.5 ** (32 / 1000)``); no horizontal flips (digits
are not mirror-symmetric), no adaptive augmentation (off by default in the original), no
DDP, no checkpoints, no wandb, no sample files.
Measure only (not in the program): a small CNN classifier trained on the real digits (the one
the SN-GAN port uses, :func:`bench.programs.sngan.measure`); on 1,000 samples of ``g_ema`` (as
the program samples) the Frechet distance between the classifier's penultimate features of
the samples and of the real digits, and an inception-score-like number. Healthy (seeds 0 / 1
/ 2): Frechet distance 62.3 / 77.7 / 63.8, inception-like score 2.9 / 3.2 / 3.3.

nndx, as a GAN author would add it (like the SN-GAN and WGAN-GP ports): a preflight
``nndx.probe`` of the discriminator, the one model with a loss of its own, on 32 real and 32
generated images with the program's logistic loss written as ``loss_fn(score, is_real)``; one
``nndx.Monitor`` per model/optimizer pair, ``d_loss``/``g_loss`` logged to them each
iteration; after training ``nndx.probe(discriminator, ..., monitor=mon_d)`` and the generator
Monitor's report, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import autograd, nn, optim
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from bench.programs.sngan import measure as digit_measure
from nndx.report import CauseCode as C

NAME = "stylegan2"
SOURCE = Source("rosinality/stylegan2-pytorch", "train.py", "bef283a1c24087da704d16c30abc8e36e63efa0e", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, 32 channels, 300 iterations)"),
        Variant(
            "pixels_not_scaled",
            "the dataset hands the discriminator raw 0-255 pixel values (ToTensor and Normalize((0.5,), (0.5,)) "
            "left out) while the generator and the sampling assume images in [-1, 1]",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/voletiv/self-attention-GAN-pytorch/issues/6",
             "https://github.com/keras-team/keras-io/issues/830",
             "https://github.com/rosinality/stylegan2-pytorch/issues/68"),
            Measure("frechet", "Frechet distance of g_ema's samples in the digit classifier's feature space at "
                    "least 1.5x the healthy run's: 398.5 / 307.5 / 336.9 against 62.3 / 77.7 / 63.8 healthy on "
                    "seeds 0 / 1 / 2", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "gen_grads_never_zeroed",
            "the two generator.zero_grad() calls left out (before the non-saturating loss's backward and before "
            "the path-length penalty's): the generator's .grad keeps summing every earlier step's gradient",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557"),
            Measure("frechet", "Frechet distance of g_ema's samples in the digit classifier's feature space at "
                    "least 1.5x the healthy run's: 189.6 / 291.1 / 205.3 against 62.3 / 77.7 / 63.8 healthy on "
                    "seeds 0 / 1 / 2", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

SIZE, LATENT, N_MLP, CHANNEL, IMG_CHANNELS = 8, 32, 2, 32, 1
ITERS, BATCH, LR, R1, PATH_REGULARIZE, PATH_BATCH_SHRINK = 300, 16, 0.002, 1.0, 2.0, 2
D_REG_EVERY, G_REG_EVERY, MIXING, LR_MLP = 16, 4, 0.9, 0.01
EMA_ACCUM = 0.5 ** (32 / 1000)
PROBE, N_SAMPLES = 32, 1000
BLUR = (1, 3, 3, 1)


# --------------------------------------------------------------------------- op/ (the CPU paths)


def fused_leaky_relu(x: torch.Tensor, bias: torch.Tensor | None = None, negative_slope: float = 0.2,
                     scale: float = 2 ** 0.5) -> torch.Tensor:  # fmt: skip
    if bias is not None:
        x = x + bias.view(1, bias.shape[0], *([1] * (x.ndim - 2)))
    return F.leaky_relu(x, negative_slope=negative_slope) * scale


class FusedLeakyReLU(nn.Module):
    def __init__(self, channel: int, bias: bool = True) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channel)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_leaky_relu(x, self.bias)


def upfirdn2d(x: torch.Tensor, kernel: torch.Tensor, up: int = 1, down: int = 1,
              pad: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """Up-sample by zero insertion, pad, filter with the (flipped) FIR kernel, down-sample."""
    b, c, h, w = x.shape
    out = x.reshape(b * c, 1, h, w)
    if up > 1:
        spread = out.new_zeros(b * c, 1, h * up, w * up)
        spread[:, :, ::up, ::up] = out
        out = spread
    p0, p1 = pad
    out = F.pad(out, [max(p0, 0), max(p1, 0), max(p0, 0), max(p1, 0)])
    out = out[:, :, max(-p0, 0): out.shape[2] - max(-p1, 0), max(-p0, 0): out.shape[3] - max(-p1, 0)]
    out = F.conv2d(out, torch.flip(kernel, [0, 1]).view(1, 1, *kernel.shape))
    out = out[:, :, ::down, ::down]
    return out.reshape(b, c, out.shape[2], out.shape[3])


# --------------------------------------------------------------------------- model.py


class PixelNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-8)


def make_kernel(k: tuple[int, ...]) -> torch.Tensor:
    k = torch.tensor(k, dtype=torch.float32)
    if k.ndim == 1:
        k = k[None, :] * k[:, None]
    return k / k.sum()


class Upsample(nn.Module):
    def __init__(self, kernel: tuple[int, ...], factor: int = 2) -> None:
        super().__init__()
        self.factor = factor
        self.register_buffer("kernel", make_kernel(kernel) * factor ** 2)
        p = self.kernel.shape[0] - factor
        self.pad = ((p + 1) // 2 + factor - 1, p // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, up=self.factor, down=1, pad=self.pad)


class Blur(nn.Module):
    def __init__(self, kernel: tuple[int, ...], pad: tuple[int, int], upsample_factor: int = 1) -> None:
        super().__init__()
        k = make_kernel(kernel)
        if upsample_factor > 1:
            k = k * upsample_factor ** 2
        self.register_buffer("kernel", k)
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, pad=self.pad)


class EqualConv2d(nn.Module):
    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channel, in_channel, kernel_size, kernel_size))
        self.scale = 1 / math.sqrt(in_channel * kernel_size ** 2)
        self.stride, self.padding = stride, padding
        self.bias = nn.Parameter(torch.zeros(out_channel)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.scale, bias=self.bias, stride=self.stride, padding=self.padding)


class EqualLinear(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, bias_init: float = 0, lr_mul: float = 1,
                 activation: str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_dim, in_dim).div_(lr_mul))
        self.bias = nn.Parameter(torch.zeros(out_dim).fill_(bias_init)) if bias else None
        self.activation = activation
        self.scale = (1 / math.sqrt(in_dim)) * lr_mul
        self.lr_mul = lr_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation:
            return fused_leaky_relu(F.linear(x, self.weight * self.scale), self.bias * self.lr_mul)
        return F.linear(x, self.weight * self.scale, bias=self.bias * self.lr_mul)


class ModulatedConv2d(nn.Module):
    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, style_dim: int, demodulate: bool = True,
                 upsample: bool = False, blur_kernel: tuple[int, ...] = BLUR) -> None:  # fmt: skip
        super().__init__()
        self.eps = 1e-8
        self.kernel_size, self.in_channel, self.out_channel = kernel_size, in_channel, out_channel
        self.upsample = upsample
        if upsample:
            factor = 2
            p = (len(blur_kernel) - factor) - (kernel_size - 1)
            self.blur = Blur(blur_kernel, pad=((p + 1) // 2 + factor - 1, p // 2 + 1), upsample_factor=factor)
        self.scale = 1 / math.sqrt(in_channel * kernel_size ** 2)
        self.padding = kernel_size // 2
        self.weight = nn.Parameter(torch.randn(1, out_channel, in_channel, kernel_size, kernel_size))
        self.modulation = EqualLinear(style_dim, in_channel, bias_init=1)
        self.demodulate = demodulate

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        batch, in_channel, height, width = x.shape
        style = self.modulation(style).view(batch, 1, in_channel, 1, 1)
        weight = self.scale * self.weight * style
        if self.demodulate:
            demod = torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8)
            weight = weight * demod.view(batch, self.out_channel, 1, 1, 1)
        weight = weight.view(batch * self.out_channel, in_channel, self.kernel_size, self.kernel_size)
        if self.upsample:
            x = x.view(1, batch * in_channel, height, width)
            weight = weight.view(batch, self.out_channel, in_channel, self.kernel_size, self.kernel_size)
            weight = weight.transpose(1, 2).reshape(batch * in_channel, self.out_channel, self.kernel_size,
                                                    self.kernel_size)  # fmt: skip
            out = F.conv_transpose2d(x, weight, padding=0, stride=2, groups=batch)
            out = out.view(batch, self.out_channel, out.shape[2], out.shape[3])
            return self.blur(out)
        x = x.view(1, batch * in_channel, height, width)
        out = F.conv2d(x, weight, padding=self.padding, groups=batch)
        return out.view(batch, self.out_channel, out.shape[2], out.shape[3])


class NoiseInjection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, image: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        if noise is None:
            batch, _, height, width = image.shape
            noise = image.new_empty(batch, 1, height, width).normal_()
        return image + self.weight * noise


class ConstantInput(nn.Module):
    def __init__(self, channel: int, size: int = 4) -> None:
        super().__init__()
        self.input = nn.Parameter(torch.randn(1, channel, size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.input.repeat(x.shape[0], 1, 1, 1)


class StyledConv(nn.Module):
    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, style_dim: int,
                 upsample: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.conv = ModulatedConv2d(in_channel, out_channel, kernel_size, style_dim, upsample=upsample)
        self.noise = NoiseInjection()
        self.activate = FusedLeakyReLU(out_channel)

    def forward(self, x: torch.Tensor, style: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        return self.activate(self.noise(self.conv(x, style), noise=noise))


class ToRGB(nn.Module):
    def __init__(self, in_channel: int, style_dim: int, upsample: bool = True) -> None:
        super().__init__()
        if upsample:
            self.upsample = Upsample(BLUR)
        self.conv = ModulatedConv2d(in_channel, IMG_CHANNELS, 1, style_dim, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(1, IMG_CHANNELS, 1, 1))

    def forward(self, x: torch.Tensor, style: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        out = self.conv(x, style) + self.bias
        if skip is not None:
            out = out + self.upsample(skip)
        return out


class Generator(nn.Module):
    def __init__(self, size: int, style_dim: int, n_mlp: int, lr_mlp: float = LR_MLP) -> None:
        super().__init__()
        self.size, self.style_dim = size, style_dim
        layers: list[nn.Module] = [PixelNorm()]
        for _ in range(n_mlp):
            layers.append(EqualLinear(style_dim, style_dim, lr_mul=lr_mlp, activation="fused_lrelu"))
        self.style = nn.Sequential(*layers)
        self.channels = {4: CHANNEL, 8: CHANNEL}
        self.input = ConstantInput(self.channels[4])
        self.conv1 = StyledConv(self.channels[4], self.channels[4], 3, style_dim)
        self.to_rgb1 = ToRGB(self.channels[4], style_dim, upsample=False)
        self.log_size = int(math.log(size, 2))
        self.num_layers = (self.log_size - 2) * 2 + 1
        self.convs, self.to_rgbs = nn.ModuleList(), nn.ModuleList()
        in_channel = self.channels[4]
        for i in range(3, self.log_size + 1):
            out_channel = self.channels[2 ** i]
            self.convs.append(StyledConv(in_channel, out_channel, 3, style_dim, upsample=True))
            self.convs.append(StyledConv(out_channel, out_channel, 3, style_dim))
            self.to_rgbs.append(ToRGB(out_channel, style_dim))
            in_channel = out_channel
        self.n_latent = self.log_size * 2 - 2

    def forward(self, styles: list[torch.Tensor], return_latents: bool = False,
                inject_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        styles = [self.style(s) for s in styles]
        noise = [None] * self.num_layers
        if len(styles) < 2:
            latent = styles[0].unsqueeze(1).repeat(1, self.n_latent, 1)
        else:
            if inject_index is None:
                inject_index = random.randint(1, self.n_latent - 1)
            latent = torch.cat([styles[0].unsqueeze(1).repeat(1, inject_index, 1),
                                styles[1].unsqueeze(1).repeat(1, self.n_latent - inject_index, 1)], 1)  # fmt: skip
        out = self.input(latent)
        out = self.conv1(out, latent[:, 0], noise=noise[0])
        skip = self.to_rgb1(out, latent[:, 1])
        i = 1
        for conv1, conv2, noise1, noise2, to_rgb in zip(self.convs[::2], self.convs[1::2], noise[1::2], noise[2::2],
                                                         self.to_rgbs):  # fmt: skip
            out = conv1(out, latent[:, i], noise=noise1)
            out = conv2(out, latent[:, i + 1], noise=noise2)
            skip = to_rgb(out, latent[:, i + 2], skip)
            i += 2
        return (skip, latent) if return_latents else (skip, None)


class ConvLayer(nn.Sequential):
    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, downsample: bool = False,
                 bias: bool = True, activate: bool = True) -> None:  # fmt: skip
        layers: list[nn.Module] = []
        if downsample:
            factor = 2
            p = (len(BLUR) - factor) + (kernel_size - 1)
            layers.append(Blur(BLUR, pad=((p + 1) // 2, p // 2)))
            stride, padding = 2, 0
        else:
            stride, padding = 1, kernel_size // 2
        layers.append(EqualConv2d(in_channel, out_channel, kernel_size, padding=padding, stride=stride,
                                  bias=bias and not activate))  # fmt: skip
        if activate:
            layers.append(FusedLeakyReLU(out_channel, bias=bias))
        super().__init__(*layers)


class ResBlock(nn.Module):
    def __init__(self, in_channel: int, out_channel: int) -> None:
        super().__init__()
        self.conv1 = ConvLayer(in_channel, in_channel, 3)
        self.conv2 = ConvLayer(in_channel, out_channel, 3, downsample=True)
        self.skip = ConvLayer(in_channel, out_channel, 1, downsample=True, activate=False, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.conv2(self.conv1(x)) + self.skip(x)) / math.sqrt(2)


class Discriminator(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        channels = {4: CHANNEL, 8: CHANNEL}
        convs: list[nn.Module] = [ConvLayer(IMG_CHANNELS, channels[size], 1)]
        in_channel = channels[size]
        for i in range(int(math.log(size, 2)), 2, -1):
            out_channel = channels[2 ** (i - 1)]
            convs.append(ResBlock(in_channel, out_channel))
            in_channel = out_channel
        self.convs = nn.Sequential(*convs)
        self.stddev_group, self.stddev_feat = 4, 1
        self.final_conv = ConvLayer(in_channel + 1, channels[4], 3)
        self.final_linear = nn.Sequential(EqualLinear(channels[4] * 4 * 4, channels[4], activation="fused_lrelu"),
                                          EqualLinear(channels[4], 1))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.convs(x)
        batch, channel, height, width = out.shape
        group = min(batch, self.stddev_group)
        stddev = out.view(group, -1, self.stddev_feat, channel // self.stddev_feat, height, width)
        stddev = torch.sqrt(stddev.var(0, unbiased=False) + 1e-8)
        stddev = stddev.mean([2, 3, 4], keepdim=True).squeeze(2)
        stddev = stddev.repeat(group, 1, height, width)
        out = self.final_conv(torch.cat([out, stddev], 1))
        return self.final_linear(out.view(batch, -1))


# --------------------------------------------------------------------------- train.py


def requires_grad(model: nn.Module, flag: bool = True) -> None:
    for p in model.parameters():
        p.requires_grad = flag


def accumulate(model1: nn.Module, model2: nn.Module, decay: float = 0.999) -> None:
    par1, par2 = dict(model1.named_parameters()), dict(model2.named_parameters())
    for k in par1:
        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)


def sample_data(loader: DataLoader):  # noqa: ANN201
    while True:
        yield from loader


def d_logistic_loss(real_pred: torch.Tensor, fake_pred: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()


def d_r1_loss(real_pred: torch.Tensor, real_img: torch.Tensor) -> torch.Tensor:
    (grad_real,) = autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
    return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()


def g_nonsaturating_loss(fake_pred: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake_pred).mean()


def g_path_regularize(fake_img: torch.Tensor, latents: torch.Tensor, mean_path_length: float | torch.Tensor,
                      decay: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    noise = torch.randn_like(fake_img) / math.sqrt(fake_img.shape[2] * fake_img.shape[3])
    (grad,) = autograd.grad(outputs=(fake_img * noise).sum(), inputs=latents, create_graph=True)
    path_lengths = torch.sqrt(grad.pow(2).sum(2).mean(1))
    path_mean = mean_path_length + decay * (path_lengths.mean() - mean_path_length)
    path_penalty = (path_lengths - path_mean).pow(2).mean()
    return path_penalty, path_mean.detach(), path_lengths


def make_noise(batch: int, latent_dim: int, n_noise: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
    if n_noise == 1:
        return torch.randn(batch, latent_dim)
    return torch.randn(n_noise, batch, latent_dim).unbind(0)


def mixing_noise(batch: int, latent_dim: int, prob: float) -> list[torch.Tensor]:
    if prob > 0 and random.random() < prob:
        return list(make_noise(batch, latent_dim, 2))
    return [make_noise(batch, latent_dim, 1)]


def logistic_loss_fn(score: torch.Tensor, is_real: torch.Tensor) -> torch.Tensor:
    """The program's discriminator loss on a mixed batch, as loss_fn(output, target)."""
    real, fake = is_real.view(-1) == 1, is_real.view(-1) == 0
    return d_logistic_loss(score[real], score[fake])


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    random.seed(seed)
    images, labels, _, _ = digits.digit_images(seed=seed, test_size=0)
    if variant == "pixels_not_scaled":
        real = images.unsqueeze(1).float()  # raw 0..255 pixels
    else:
        real = (digits.to_tensor(images) - 0.5) / 0.5  # ToTensor + Normalize((0.5,), (0.5,))
    dataset = TensorDataset(real)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    zero_gen = variant != "gen_grads_never_zeroed"

    generator = Generator(SIZE, LATENT, N_MLP)
    discriminator = Discriminator(SIZE)
    g_ema = Generator(SIZE, LATENT, N_MLP)
    g_ema.eval()
    accumulate(g_ema, generator, 0)

    g_reg_ratio = G_REG_EVERY / (G_REG_EVERY + 1)
    d_reg_ratio = D_REG_EVERY / (D_REG_EVERY + 1)
    g_optim = optim.Adam(generator.parameters(), lr=LR * g_reg_ratio, betas=(0 ** g_reg_ratio, 0.99 ** g_reg_ratio))
    d_optim = optim.Adam(discriminator.parameters(), lr=LR * d_reg_ratio,
                         betas=(0 ** d_reg_ratio, 0.99 ** d_reg_ratio))  # fmt: skip

    with torch.no_grad():  # the preflight batch: real digits and the untrained generator's samples
        probe_fake, _ = generator([torch.randn(PROBE, LATENT, generator=torch.Generator().manual_seed(seed + 1))])
    probe_batch = (torch.cat([real[:PROBE], probe_fake]), torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]))
    nx.preflight(discriminator, probe_batch, logistic_loss_fn, optimizer=d_optim)
    mon_d = nx.monitor(discriminator, d_optim, every=10)
    mon_g = nx.monitor(generator, g_optim, every=10)

    batches = sample_data(loader)
    mean_path_length = 0.0
    d_losses: list[float] = []
    g_losses: list[float] = []
    r1_values: list[float] = []
    for i in range(ITERS):
        (real_img,) = next(batches)

        requires_grad(generator, False)
        requires_grad(discriminator, True)
        noise = mixing_noise(BATCH, LATENT, MIXING)
        fake_img, _ = generator(noise)
        fake_pred = discriminator(fake_img)
        real_pred = discriminator(real_img)
        d_loss = d_logistic_loss(real_pred, fake_pred)
        discriminator.zero_grad()
        d_loss.backward()
        d_optim.step()
        nx.timed(lambda: mon_d.log(d_loss))
        d_losses.append(d_loss.item())

        if i % D_REG_EVERY == 0:
            real_img.requires_grad = True
            real_pred = discriminator(real_img)
            r1_loss = d_r1_loss(real_pred, real_img)
            discriminator.zero_grad()
            (R1 / 2 * r1_loss * D_REG_EVERY + 0 * real_pred[0]).backward()
            d_optim.step()
            r1_values.append(r1_loss.item())

        requires_grad(generator, True)
        requires_grad(discriminator, False)
        noise = mixing_noise(BATCH, LATENT, MIXING)
        fake_img, _ = generator(noise)
        fake_pred = discriminator(fake_img)
        g_loss = g_nonsaturating_loss(fake_pred)
        if zero_gen:
            generator.zero_grad()
        g_loss.backward()
        g_optim.step()
        nx.timed(lambda: mon_g.log(g_loss))
        g_losses.append(g_loss.item())

        if i % G_REG_EVERY == 0:
            path_batch_size = max(1, BATCH // PATH_BATCH_SHRINK)
            noise = mixing_noise(path_batch_size, LATENT, MIXING)
            fake_img, latents = generator(noise, return_latents=True)
            path_loss, mean_path_length, _ = g_path_regularize(fake_img, latents, mean_path_length)
            if zero_gen:
                generator.zero_grad()
            weighted_path_loss = PATH_REGULARIZE * G_REG_EVERY * path_loss
            weighted_path_loss = weighted_path_loss + 0 * fake_img[0, 0, 0, 0]
            weighted_path_loss.backward()
            g_optim.step()

        accumulate(g_ema, generator, EMA_ACCUM)

    requires_grad(discriminator, True)
    nx.finish(mon_d, discriminator, probe_batch, logistic_loss_fn, optimizer=d_optim)
    nx.finish(mon_g)

    with torch.no_grad():  # samples as the program draws them: from g_ema, in eval mode
        z = torch.randn(N_SAMPLES, LATENT, generator=torch.Generator().manual_seed(seed + 2))
        sample, _ = g_ema([z])
    sample = sample.clamp(-1, 1)  # utils.save_image(normalize=True, range=(-1, 1))
    return {
        "late_d_loss": float(np.mean(d_losses[-50:])),
        "late_g_loss": float(np.mean(g_losses[-50:])),
        "late_r1": float(np.mean(r1_values[-5:])),
        **digit_measure(sample, seed),
    }
