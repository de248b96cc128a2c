"""Port of pytorch/examples ``fast_neural_style``: a TransformerNet trained with perceptual losses.

Source: github.com/pytorch/examples, ``fast_neural_style/neural_style/neural_style.py``,
``transformer_net.py``, ``vgg.py`` and ``utils.py`` at commit
77f55b912142e11fcfdf5b530231fb9c52f181e8 (the four files last changed in
993a98a67a4850d6b2d45cb35a0e9d29332a66c3; BSD-3-Clause, Copyright (c) 2017 PyTorch
contributors). Written anew from the facts of those files; no code copied.

Kept: ``TransformerNet`` = ``ConvLayer`` (``ReflectionPad2d(k // 2)`` + ``Conv2d``) 9x9 stride 1,
two 3x3 stride-2 ``ConvLayer`` s, each followed by ``InstanceNorm2d(affine=True)`` and ReLU,
``ResidualBlock`` s (conv, instance norm, ReLU, conv, instance norm, ``out + residual``), two
``UpsampleConvLayer`` s (``interpolate(mode="nearest", scale_factor=2)`` then a reflection-padded
3x3 conv) with instance norm and ReLU, and a last 9x9 ``ConvLayer`` to 3 channels with no
activation; ``Vgg16``'s four slices returned as the namedtuple ``(relu1_2, relu2_2, relu3_3,
relu4_3)`` with ``requires_grad=False``; ``utils.gram_matrix`` (``view(b, ch, h * w)``, ``bmm``
with its transpose, divided by ``ch * h * w``) and ``utils.normalize_batch`` (the in-place
``div_(255)`` then the ImageNet mean/std); ``train``: the seeds, the transform ``Resize`` +
``CenterCrop`` + ``ToTensor`` + ``Lambda(x.mul(255))``, an unshuffled ``DataLoader`` of
batch 4, ``Adam(transformer.parameters(), lr=1e-3)``, ``MSELoss``, the style image in 0..255
repeated ``batch_size`` times and its Gram matrices computed once; per batch
``optimizer.zero_grad()``, ``y = transformer(x)``, both normalised with ``normalize_batch``,
``content_weight * mse(features_y.relu2_2, features_x.relu2_2)``, the style loss summed over
the four Gram matrices against ``gm_s[:n_batch]`` times ``style_weight``, ``backward``,
``step``; the aggregated content/style losses and the log line every ``log_interval``
(kept as a record instead of printed). ``stylize``'s content transform (``ToTensor`` +
``mul(255)``) for the held-out images.
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16, grey in 3 equal channels (512 for
training, 64 held out), instead of COCO at 256x256; a 16x16 synthetic two-colour diagonal
pattern as the style image instead of ``mosaic.jpg``; TransformerNet widths 8/16/32 instead
of 32/64/128 and 2 residual blocks instead of 5; the ``Vgg16`` stand-in: no pretrained weights
can be downloaded, so the four slices are the same kind of layers (3x3 convolutions + ReLU,
max-pooling between slices; 2/2/3/3 convolutions, widths 8/16/32/32 instead of 64/128/256/512)
drawn once from a fixed seed (Kaiming init) and frozen; ``style_weight`` 2e5 instead of 1e10
(the random network's Gram matrices are far larger than VGG's: at 1e10, or 1e7, the style
term is 100x the content term and the transformer learns to ignore content; at 2e5 the style
term starts ~1.7x the content term);
2 epochs of 128 batches; ``log_interval`` 50 (batches, as the loop counts it); no checkpoints or model saving.
Measure only (not in the program): the held-out perceptual loss (content + style, the
program's own weighting) of the trained transformer on 64 held-out digits fed as ``stylize``
feeds them (``ToTensor`` + ``mul(255)``), and its content and style parts.

nndx, as the author would add it: a preflight ``nndx.probe`` of the transformer on the first
training batch, with the content images as both the input and the target and the program's
perceptual loss (content + style against the fixed Gram matrices) as ``loss_fn(y, x)``;
``nndx.Monitor(transformer, optimizer)`` around the epochs, every batch's ``total_loss``
logged; after training ``nndx.probe(..., monitor=mon)`` on the same batch and
``nndx.diagnose``.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fast_neural_style"
SOURCE = Source("pytorch/examples", "fast_neural_style/neural_style/neural_style.py",
                "77f55b912142e11fcfdf5b530231fb9c52f181e8", "BSD-3-Clause")  # fmt: skip

_HELD_OUT = ("held-out perceptual loss (content_weight * content + style_weight * style, as trained) of "
             "the transformer on 64 held-out digits fed in 0..255 as stylize() feeds them, 1.5x the healthy "
             "run's or more (seed 0: 126,587 healthy; 388,511 no_mul_255; 234,868 missing_zero_grad)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16x16 digits, widths 8/16/32, 2 residual blocks)"),
        Variant(
            "no_mul_255",
            "the training transform without transforms.Lambda(lambda x: x.mul(255)): the images stay in [0, 1] "
            "while normalize_batch divides them by 255 again, so the loss network sees near-constant images "
            "and the transformer learns on inputs 255x smaller than stylize() gives it",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/abhiskk/fast-neural-style/issues/26",
             "https://github.com/pytorch/examples/issues/187",
             "https://github.com/lengstrom/fast-style-transfer/issues/18"),
            Measure("heldout_loss", _HELD_OUT, lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "missing_zero_grad",
            "optimizer.zero_grad() left out of the batch loop: every backward adds to the gradients of all "
            "earlier batches and Adam steps along their running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/udacity/deep-learning-v2-pytorch/pull/160",
             "https://github.com/rll/deepul/issues/12",
             "https://github.com/dscripka/openWakeWord/issues/316"),
            Measure("heldout_loss", _HELD_OUT, lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

ARGS = {"epochs": 2, "batch_size": 4, "image_size": 16, "content_weight": 1e5, "style_weight": 2e5, "lr": 1e-3,
        "log_interval": 50, "n_train": 512, "n_test": 64}  # fmt: skip
WIDTHS, N_RES = (8, 16, 32), 2
VGG_WIDTHS = (8, 16, 32, 32)


# --------------------------------------------------------------------------- transformer_net.py


class ConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2d(self.reflection_pad(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in1 = nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in2 = nn.InstanceNorm2d(channels, affine=True)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        out = self.relu(self.in1(self.conv1(x)))
        out = self.in2(self.conv2(out))
        return out + residual


class UpsampleConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int,
                 upsample: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.upsample = upsample
        self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample:
            x = F.interpolate(x, mode="nearest", scale_factor=self.upsample)
        return self.conv2d(self.reflection_pad(x))


class TransformerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        a, b, c = WIDTHS
        self.conv1 = ConvLayer(3, a, kernel_size=9, stride=1)
        self.in1 = nn.InstanceNorm2d(a, affine=True)
        self.conv2 = ConvLayer(a, b, kernel_size=3, stride=2)
        self.in2 = nn.InstanceNorm2d(b, affine=True)
        self.conv3 = ConvLayer(b, c, kernel_size=3, stride=2)
        self.in3 = nn.InstanceNorm2d(c, affine=True)
        self.res = nn.Sequential(*[ResidualBlock(c) for _ in range(N_RES)])
        self.deconv1 = UpsampleConvLayer(c, b, kernel_size=3, stride=1, upsample=2)
        self.in4 = nn.InstanceNorm2d(b, affine=True)
        self.deconv2 = UpsampleConvLayer(b, a, kernel_size=3, stride=1, upsample=2)
        self.in5 = nn.InstanceNorm2d(a, affine=True)
        self.deconv3 = ConvLayer(a, 3, kernel_size=9, stride=1)
        self.relu = nn.ReLU()

    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803 - the source's name
        y = self.relu(self.in1(self.conv1(X)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.relu(self.in3(self.conv3(y)))
        y = self.res(y)
        y = self.relu(self.in4(self.deconv1(y)))
        y = self.relu(self.in5(self.deconv2(y)))
        return self.deconv3(y)


# --------------------------------------------------------------------------- vgg.py (a fixed random stand-in)

VggOutputs = namedtuple("VggOutputs", ["relu1_2", "relu2_2", "relu3_3", "relu4_3"])


class Vgg16(nn.Module):
    """Four slices of 3x3 conv + ReLU (2/2/3/3 convs), max-pooling before slices 2-4; weights
    drawn once from a fixed generator (no pretrained VGG can be downloaded) and frozen."""

    def __init__(self, requires_grad: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        counts, inp = (2, 2, 3, 3), 3
        slices = []
        for i, (n, w) in enumerate(zip(counts, VGG_WIDTHS)):
            layers: list[nn.Module] = [nn.MaxPool2d(2, 2)] if i > 0 else []
            for _ in range(n):
                conv = nn.Conv2d(inp, w, 3, padding=1)
                with torch.no_grad():
                    conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * (2.0 / (9 * inp)) ** 0.5)
                    conv.bias.zero_()
                layers += [conv, nn.ReLU(inplace=True)]
                inp = w
            slices.append(nn.Sequential(*layers))
        self.slice1, self.slice2, self.slice3, self.slice4 = slices
        if not requires_grad:
            for param in self.parameters():
                param.requires_grad = False

    def forward(self, X: torch.Tensor) -> VggOutputs:  # noqa: N803
        h_relu1_2 = self.slice1(X)
        h_relu2_2 = self.slice2(h_relu1_2)
        h_relu3_3 = self.slice3(h_relu2_2)
        h_relu4_3 = self.slice4(h_relu3_3)
        return VggOutputs(h_relu1_2, h_relu2_2, h_relu3_3, h_relu4_3)


# --------------------------------------------------------------------------- utils.py


def gram_matrix(y: torch.Tensor) -> torch.Tensor:
    b, ch, h, w = y.size()
    features = y.view(b, ch, w * h)
    return features.bmm(features.transpose(1, 2)) / (ch * h * w)


def normalize_batch(batch: torch.Tensor) -> torch.Tensor:
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    batch = batch.div_(255.0)
    return (batch - mean) / std


# --------------------------------------------------------------------------- the data


def digit_pictures(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) as ``ToTensor`` gives them: (N, 3, 16, 16) in [0, 1]."""
    train_raw, _, test_raw, _ = data.digit_images(seed=seed)
    size = ARGS["image_size"]
    train = data.upscaled(train_raw[: ARGS["n_train"]], size).expand(-1, 3, -1, -1).contiguous()
    test = data.upscaled(test_raw[: ARGS["n_test"]], size).expand(-1, 3, -1, -1).contiguous()
    return train, test


def style_picture() -> torch.Tensor:
    """The style image after ``ToTensor``: diagonal bands of two colours, (3, 16, 16) in [0, 1]."""
    size = ARGS["image_size"]
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    band = ((i + j) // 3) % 2
    a, b = np.array([0.9, 0.3, 0.1]), np.array([0.1, 0.4, 0.8])
    img = np.where(band[None] == 1, a[:, None, None], b[:, None, None])
    return torch.tensor(img, dtype=torch.float32)


# --------------------------------------------------------------------------- neural_style.py: train


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    np.random.seed(seed)
    torch.manual_seed(seed)
    train_images, test_images = digit_pictures(seed)
    scale = 1.0 if variant == "no_mul_255" else 255.0  # transforms.Lambda(lambda x: x.mul(255))
    train_dataset = TensorDataset(train_images * scale, torch.zeros(len(train_images), dtype=torch.long))
    train_loader = DataLoader(train_dataset, batch_size=args["batch_size"])

    transformer = TransformerNet()
    optimizer = Adam(transformer.parameters(), args["lr"])
    mse_loss = nn.MSELoss()

    vgg = Vgg16(requires_grad=False)
    style = style_picture().mul(255)
    style = style.repeat(args["batch_size"], 1, 1, 1)
    features_style = vgg(normalize_batch(style))
    gram_style = [gram_matrix(y) for y in features_style]

    def perceptual_loss(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The loop's total loss as a function of the transformer's output and its input (for nndx and
        the held-out measure; the loop itself computes it inline)."""
        n_batch = len(x)
        features_y = vgg(normalize_batch(y.clone()))
        features_x = vgg(normalize_batch(x.clone()))
        content = args["content_weight"] * mse_loss(features_y.relu2_2, features_x.relu2_2)
        style_loss = 0.0
        for ft_y, gm_s in zip(features_y, gram_style):
            style_loss = style_loss + mse_loss(gram_matrix(ft_y), gm_s[:n_batch, :, :])
        return content + args["style_weight"] * style_loss

    first_x = train_dataset.tensors[0][: args["batch_size"]].clone()
    probe_batch = (first_x, first_x.clone())
    nx.preflight(transformer, probe_batch, perceptual_loss, optimizer=optimizer)
    mon = nx.monitor(transformer, optimizer, every=10)

    log: list[str] = []
    for e in range(args["epochs"]):
        transformer.train()
        agg_content_loss = agg_style_loss = 0.0
        count = 0
        for batch_id, (x, _) in enumerate(train_loader):
            n_batch = len(x)
            count += n_batch
            if variant != "missing_zero_grad":
                optimizer.zero_grad()

            y = transformer(x)
            y = normalize_batch(y)
            x = normalize_batch(x)
            features_y = vgg(y)
            features_x = vgg(x)

            content_loss = args["content_weight"] * mse_loss(features_y.relu2_2, features_x.relu2_2)
            style_loss = 0.0
            for ft_y, gm_s in zip(features_y, gram_style):
                gm_y = gram_matrix(ft_y)
                style_loss += mse_loss(gm_y, gm_s[:n_batch, :, :])
            style_loss *= args["style_weight"]

            total_loss = content_loss + style_loss
            total_loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(total_loss))

            agg_content_loss += content_loss.item()
            agg_style_loss += style_loss.item()
            if (batch_id + 1) % args["log_interval"] == 0:
                log.append(f"Epoch {e + 1}:\t[{count}/{len(train_dataset)}]\tcontent: "
                           f"{agg_content_loss / (batch_id + 1):.6f}\tstyle: {agg_style_loss / (batch_id + 1):.6f}")

    nx.finish(mon, transformer, probe_batch, perceptual_loss, optimizer=optimizer)

    transformer.eval()  # measure only: stylize()'s feeding, ToTensor then mul(255)
    with torch.no_grad():
        x = test_images * 255.0
        y = transformer(x)
        features_y = vgg(normalize_batch(y.clone()))
        features_x = vgg(normalize_batch(x.clone()))
        content = args["content_weight"] * mse_loss(features_y.relu2_2, features_x.relu2_2).item()
        style_part = args["style_weight"] * sum(
            mse_loss(gram_matrix(ft_y), gm_s[:1].expand(len(x), -1, -1)).item()
            for ft_y, gm_s in zip(features_y, gram_style))  # fmt: skip
    return {
        "heldout_loss": content + style_part,
        "heldout_content": content,
        "heldout_style": style_part,
        "final_train_content": agg_content_loss / (batch_id + 1),
        "final_train_style": agg_style_loss / (batch_id + 1),
    }
