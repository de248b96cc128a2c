"""Port of vsitzmann/siren's image-fitting notebook: a sine-activated MLP (SIREN) mapping pixel
coordinates in [-1, 1] to grey values, fitted with MSE and Adam.

Source: github.com/vsitzmann/siren, ``explore_siren.ipynb`` ("Fitting an image") and the
init functions of ``modules.py`` (``sine_init``, ``first_layer_sine_init``) at commit
4df34baee3f0f9c8f351630992c1fe1f69114b5f (MIT, Copyright (c) 2020 Vincent Sitzmann).
Written anew from the facts of those files; no code copied. The cameraman image
(``skimage.data.camera()``) is replaced by a mosaic of four of scikit-learn's 8x8 digits,
each resized (bilinear) to 32x32, making one 64x64 grey image (the data, not the program).

Kept: ``get_mgrid`` (``linspace(-1, 1, sidelen)`` per axis, ``meshgrid`` in 'ij' order,
flattened to (sidelen**2, 2)); ``SineLayer`` (``nn.Linear`` then ``sin(omega_0 * linear(x))``,
the first layer's weights ``U(-1/in, 1/in)``, the others' ``U(-sqrt(6/in)/omega_0,
sqrt(6/in)/omega_0)``, biases left at PyTorch's default); ``Siren`` (a first ``SineLayer``
with ``first_omega_0`` 30, ``hidden_layers`` more with ``hidden_omega_0`` 30, an outermost
``nn.Linear`` with the hidden init, ``outermost_linear=True``; ``forward`` clones and detaches
the coordinates, sets ``requires_grad`` and returns ``(output, coords)``); ``ImageFitting``
(the image through ``ToTensor`` + ``Normalize(0.5, 0.5)`` into [-1, 1], ``permute(1, 2, 0)
.view(-1, 1)``, one item: all coordinates and all pixels); the loop: ``Adam(lr=1e-4)``, each
step the whole image as one batch, ``loss = ((model_output - ground_truth)**2).mean()``, the
print every ``steps_til_summary`` steps (kept as a record; the gradient/laplacian plots are
left out), ``zero_grad``/``backward``/``step``.
Shrunk: hidden width 128 instead of 256 (3 hidden layers kept); a 64x64 image of which the
model is fitted on the even pixels (a 32x32 grid, 1,024 coordinates) instead of all
256x256 pixels of the cameraman; 500 steps kept.
Measure only (not in the program): PSNR (on the [0, 1] scale) of the fitted image at the
train coordinates and at the held-out ones (the other 3,072 pixels of the 64x64 grid, between
the train coordinates).

nndx, as the author would add it: the batch is ``(coords, pixels)``, the loss function the
notebook's MSE on the model's first output; a preflight ``nndx.probe`` before the loop with the
train and held-out coordinates/pixels as the data splits; ``nndx.Monitor(img_siren, optim)``
around the loop, each step's loss logged, the held-out MSE logged as ``split="val"`` every
``steps_til_summary`` steps; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "siren"
SOURCE = Source("vsitzmann/siren", "explore_siren.ipynb", "4df34baee3f0f9c8f351630992c1fe1f69114b5f", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's image fit as published (shrunk: width 128, a 64x64 image, even pixels)"),
        Variant(
            "default_linear_init",
            "SineLayer.init_weights never called: every layer keeps nn.Linear's default init "
            "U(-1/sqrt(in), 1/sqrt(in)), so the hidden pre-activations are omega_0 = 30 times too large and the "
            "first layer's frequencies ~15x too high",
            (C.BAD_INIT,),
            ("https://github.com/lucidrains/siren-pytorch/issues/1",
             "https://github.com/NVlabs/tiny-cuda-nn/issues/216",
             "https://github.com/vsitzmann/siren/issues/4"),
            Measure("psnr_heldout", "held-out PSNR at least 3 dB below the healthy run's: 8.4 dB against 28.3 "
                    "healthy on seed 0 (train PSNR 58.7 against 78.8: it memorises the fitted pixels)",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
        Variant(
            "pixel_coordinates",
            "get_mgrid built from the pixel indices (linspace(0, sidelen - 1)) instead of linspace(-1, 1): "
            "coordinates up to 63, so sin(30 * W x) oscillates far faster than the image",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/ankurhanda/nerf2D/issues/3",
             "https://github.com/mkocabas/CoordConv-pytorch/issues/11",
             "https://github.com/Robotics-STAR-Lab/H2-Mapping/issues/3"),
            Measure("psnr_heldout", "held-out PSNR at least 3 dB below the healthy run's: 8.0 dB against 28.3 "
                    "healthy on seed 0 (train PSNR 61.8 against 78.8)",
                    lambda healthy, buggy: not buggy > healthy - 3.0),
        ),
    )
}

SIDE, HIDDEN, HIDDEN_LAYERS, TOTAL_STEPS, STEPS_TIL_SUMMARY, LR = 64, 128, 3, 500, 10, 1e-4


# --------------------------------------------------------------------------- the notebook's helpers


def get_mgrid(sidelen: int, dim: int = 2, pixel_units: bool = False) -> torch.Tensor:
    """A flattened grid of coordinates in [-1, 1] (``pixel_units``: the bug, 0..sidelen-1)."""
    axis = torch.linspace(0, sidelen - 1, steps=sidelen) if pixel_units else torch.linspace(-1, 1, steps=sidelen)
    mgrid = torch.stack(torch.meshgrid(*(dim * [axis]), indexing="ij"), dim=-1)
    return mgrid.reshape(-1, dim)


class SineLayer(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, is_first: bool = False,
                 omega_0: float = 30, siren_init: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.omega_0 = omega_0
        self.is_first = is_first
        self.in_features = in_features
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        if siren_init:  # the bug: never called
            self.init_weights()

    def init_weights(self) -> None:
        with torch.no_grad():
            if self.is_first:
                self.linear.weight.uniform_(-1 / self.in_features, 1 / self.in_features)
            else:
                bound = np.sqrt(6 / self.in_features) / self.omega_0
                self.linear.weight.uniform_(-bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.omega_0 * self.linear(input))


class Siren(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, hidden_layers: int, out_features: int,
                 outermost_linear: bool = False, first_omega_0: float = 30, hidden_omega_0: float = 30.0,
                 siren_init: bool = True) -> None:  # fmt: skip
        super().__init__()
        net: list[nn.Module] = [SineLayer(in_features, hidden_features, is_first=True, omega_0=first_omega_0,
                                          siren_init=siren_init)]  # fmt: skip
        for _ in range(hidden_layers):
            net.append(SineLayer(hidden_features, hidden_features, is_first=False, omega_0=hidden_omega_0,
                                 siren_init=siren_init))  # fmt: skip
        if outermost_linear:
            final_linear = nn.Linear(hidden_features, out_features)
            if siren_init:
                with torch.no_grad():
                    bound = np.sqrt(6 / hidden_features) / hidden_omega_0
                    final_linear.weight.uniform_(-bound, bound)
            net.append(final_linear)
        else:
            net.append(SineLayer(hidden_features, out_features, is_first=False, omega_0=hidden_omega_0,
                                 siren_init=siren_init))  # fmt: skip
        self.net = nn.Sequential(*net)

    def forward(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        coords = coords.clone().detach().requires_grad_(True)  # allows derivatives w.r.t. the input
        output = self.net(coords)
        return output, coords


def mosaic(seed: int) -> torch.Tensor:
    """The stand-in for the cameraman: four digits, each 32x32, in a 64x64 grey image in [0, 1]."""
    images, _, _, _ = data.digit_images(seed=seed)
    tiles = data.upscaled(images[:4], SIDE // 2)[:, 0]
    top, bottom = torch.cat([tiles[0], tiles[1]], dim=1), torch.cat([tiles[2], tiles[3]], dim=1)
    return torch.cat([top, bottom], dim=0)


class ImageFitting:
    """One item: all coordinates and all pixels (Normalize(0.5, 0.5): values in [-1, 1])."""

    def __init__(self, sidelength: int, seed: int, pixel_units: bool = False) -> None:
        img = (mosaic(seed).unsqueeze(0) - 0.5) / 0.5  # ToTensor, Normalize
        self.pixels = img.permute(1, 2, 0).reshape(-1, 1)
        self.coords = get_mgrid(sidelength, 2, pixel_units=pixel_units)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if idx > 0:
            raise IndexError
        return self.coords, self.pixels


def psnr(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Measure only: PSNR of values in [-1, 1] mapped back to [0, 1]."""
    mse = float((((pred.clamp(-1, 1) + 1) / 2 - (target + 1) / 2) ** 2).mean())
    return 10 * math.log10(1.0 / max(mse, 1e-12))


# --------------------------------------------------------------------------- the fit


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    image = ImageFitting(SIDE, seed, pixel_units=variant == "pixel_coordinates")
    coords, pixels = image[0]
    grid = torch.arange(SIDE)
    even = ((grid[:, None] % 2 == 0) & (grid[None, :] % 2 == 0)).reshape(-1)  # the fitted pixels
    model_input, ground_truth = coords[even], pixels[even]
    heldout_input, heldout_truth = coords[~even], pixels[~even]

    img_siren = Siren(in_features=2, out_features=1, hidden_features=HIDDEN, hidden_layers=HIDDEN_LAYERS,
                      outermost_linear=True, siren_init=variant != "default_linear_init")  # fmt: skip
    optim = torch.optim.Adam(lr=LR, params=img_siren.parameters())

    def image_mse(output: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        model_output = output[0] if isinstance(output, tuple) else output
        return ((model_output - target) ** 2).mean()

    batch = (model_input, ground_truth)
    splits = (model_input, ground_truth, heldout_input, heldout_truth)
    nx.preflight(img_siren, batch, image_mse, optimizer=optim, data=splits)
    mon = nx.monitor(img_siren, optim, every=10)

    printed: list[str] = []
    loss = torch.tensor(float("nan"))
    for step in range(TOTAL_STEPS):
        model_output, _coords = img_siren(model_input)
        loss = ((model_output - ground_truth) ** 2).mean()
        if not step % STEPS_TIL_SUMMARY:
            printed.append("Step %d, Total loss %0.6f" % (step, loss.item()))
            with torch.no_grad():
                heldout_mse = float(((img_siren(heldout_input)[0] - heldout_truth) ** 2).mean())
            mon.log(heldout_mse, split="val")
        optim.zero_grad()
        loss.backward()
        optim.step()
        mon.log(loss)

    nx.finish(mon, img_siren, batch, image_mse, optimizer=optim, data=splits)
    with torch.no_grad():
        fitted = img_siren(model_input)[0]
        between = img_siren(heldout_input)[0]
    return {
        "psnr_train": psnr(fitted, ground_truth),
        "psnr_heldout": psnr(between, heldout_truth),
        "final_loss": loss.item(),
    }
