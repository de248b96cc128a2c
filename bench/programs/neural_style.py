"""Port of the PyTorch neural style transfer tutorial (Gatys, Ecker and Bethge): the input image
itself is optimised with L-BFGS; ``ContentLoss`` and ``StyleLoss`` modules, inserted after
convolutions of a frozen feature extractor, store their losses as the image goes through;
Gram matrices normalised by the number of elements; a ``Normalization`` module first; a
closure that clamps the image into [0, 1] before each evaluation.

Source: github.com/pytorch/tutorials, ``advanced_source/neural_style_tutorial.py`` at commit
0a7e68666de5faceafa90276ad2b7874cd32c5e0 (the version stored for this port; BSD-3-Clause),
with the later tutorial's ``run_style_transfer`` preamble (``input_img.requires_grad_(True)``,
``model.eval()``, ``model.requires_grad_(False)``, ``LBFGS([input_img])``, the clamp under
``torch.no_grad()``), which the current tutorial has. Written anew from the facts of that
file; no code copied.

Kept: ``ContentLoss`` (the detached target, ``F.mse_loss`` stored in ``self.loss``, the input
returned unchanged); ``gram_matrix`` (``view(a * b, c * d)``, ``mm`` with its transpose,
divided by ``a * b * c * d``); ``StyleLoss`` (the target's Gram matrix detached, ``mse_loss``
of the Gram matrices); ``Normalization`` (``(img - mean) / std`` with ImageNet's mean and
std viewed as ``(-1, 1, 1)``); ``get_style_model_and_losses`` (a deep copy of the extractor,
a new ``nn.Sequential`` starting with the normalization, its layers renamed ``conv_i``,
``bn_i``, ``relu_i`` (replaced by ``ReLU(inplace=False)``), ``pool_i``, a ``ContentLoss``
after ``conv_4`` and a ``StyleLoss`` after ``conv_1`` ... ``conv_5``, their targets computed
by running the model built so far on the content and style images, the layers after the last
loss module trimmed); the extractor loaded in evaluation mode; ``input_img =
content_img.clone()``; ``run_style_transfer`` (``num_steps=300``, ``style_weight=1000000``,
``content_weight=1``; ``optim.LBFGS([input_img])`` with its defaults; ``while run[0] <=
num_steps`` around ``optimizer.step(closure)``; the closure clamps the image, ``zero_grad``,
runs the model, sums the style and content losses, weights them, ``backward``, counts the
run, returns the weighted sum); the last clamp.
Shrunk: a small randomly initialised VGG-with-batch-norm-like extractor (five 3x3
convolutions of widths 16-16-32-32-64, each followed by ``BatchNorm2d`` and
``ReLU(inplace=True)``, ``MaxPool2d(2)`` after the second and the fourth, as in
``vgg19_bn().features``; its batch-norm running statistics set once from 64 generated
images, a stand-in for pretrained statistics) instead of the pretrained VGG19; generated
32x32 RGB content (a smooth background with a disc and a rectangle) and style (coloured
oriented stripes with noise) images instead of ``dancing.jpg`` and ``picasso.jpg`` at 128x128;
no plots.
Measure only (not in the program): images scored with the program's own objective as the
healthy program defines it (normalised Gram matrices, the extractor in evaluation mode):
``style_weight * style + content_weight * content``; ``late_objective`` is the median over
the images at the tutorial's progress prints of runs 200, 250 and 300 and the output
(L-BFGS with the clamp inside the closure jumps now and then: the healthy seed 2's output
alone scores 298,903 after a last jump, its late median 1.89); ``final_objective`` is the
output's alone. Healthy (seeds 0 / 1 / 2): the content image's own objective ~9,000 / 2,500
/ 9,000, the late objective 3.76 / 1.03 / 1.89.

nndx, as the author would add it: the program's loss lives in the modules it inserted, so
the author hands nndx the model together with those modules: ``objective`` (an
``nn.Module`` whose forward runs the style model on the image and returns the weighted style
and content terms, read from its own loss modules) with ``loss_fn(output, _) =
output.sum()``, the batch being the image and a placeholder target; a preflight
``nndx.probe(objective, (input_img, placeholder), loss_fn, optimizer=optimizer)`` before the
optimisation, ``nndx.Monitor(objective, optimizer)`` around the loop with each closure's loss
logged, then ``nndx.probe(..., monitor=mon)`` on the final image and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "neural_style"
SOURCE = Source("pytorch/tutorials", "advanced_source/neural_style_tutorial.py",
                "0a7e68666de5faceafa90276ad2b7874cd32c5e0", "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 32x32 generated images, a small random VGG-BN-like "
                "extractor)"),
        Variant(
            "gram_not_normalized",
            "gram_matrix returns torch.mm(features, features.t()) without G.div(a * b * c * d): the style term is "
            "scaled by (b * c * d)^2 per layer (the first layers most), and at style_weight 1e6 it swamps the "
            "content term",
            (C.WRONG_LOSS,),
            ("https://github.com/leongatys/PytorchNeuralStyleTransfer/issues/14",
             "https://github.com/rrmina/neural-style-pytorch/issues/1",
             "https://github.com/jcjohnson/neural-style/issues/376"),
            Measure("late_objective", "the late images' objective (normalised Gram matrices, extractor in eval "
                    "mode; median of the images at runs 200, 250, 300 and the output) at least 1.3x the healthy "
                    "run's: 71.8 / 1.45 / 48.7 against 3.76 / 1.03 / 1.89 healthy on seeds 0 / 1 / 2",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "extractor_not_eval",
            "the extractor used in training mode (the .eval() when loading it and model.eval() in "
            "run_style_transfer left out): its BatchNorm layers normalise with the single image's own statistics "
            "and overwrite their running statistics at every closure, so the targets and the optimised image see "
            "another network than the pretrained one",
            (C.EVAL_MODE_FORGOTTEN,),
            ("https://github.com/pytorch/tutorials/pull/2371",
             "https://github.com/pytorch/tutorials/issues/1736",
             "https://github.com/NVIDIA/pix2pixHD/issues/175"),
            Measure("late_objective", "the late images' objective (normalised Gram matrices, extractor in eval "
                    "mode; median of the images at runs 200, 250, 300 and the output) at least 1.5x the healthy "
                    "run's: 40.2 / 1255 / 47.6 against 3.76 / 1.03 / 1.89 healthy on seeds 0 / 1 / 2",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

IMSIZE, NUM_STEPS, STYLE_WEIGHT, CONTENT_WEIGHT = 32, 300, 1000000, 1
WIDTHS = (16, 16, 32, 32, 64)
CNN_NORMALIZATION_MEAN = (0.485, 0.456, 0.406)
CNN_NORMALIZATION_STD = (0.229, 0.224, 0.225)
content_layers_default = ["conv_4"]
style_layers_default = ["conv_1", "conv_2", "conv_3", "conv_4", "conv_5"]


# --------------------------------------------------------------------------- the images (stand-ins)


def make_images(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(content, style), each (1, 3, IMSIZE, IMSIZE) in [0, 1]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, IMSIZE), np.linspace(0, 1, IMSIZE), indexing="ij")
    content = np.stack([0.2 + 0.5 * xx, 0.3 + 0.4 * yy, 0.6 - 0.3 * xx], 0)
    cy, cx, r = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7), rng.uniform(0.15, 0.25)
    disc = (yy - cy) ** 2 + (xx - cx) ** 2 < r**2
    content[:, disc] = rng.uniform(0, 1, size=(3, 1))
    y0, x0 = rng.uniform(0.05, 0.5, size=2)
    rect = (yy > y0) & (yy < y0 + 0.3) & (xx > x0) & (xx < x0 + 0.4) & ~disc
    content[:, rect] = rng.uniform(0, 1, size=(3, 1))
    angle, freq = rng.uniform(0, math.pi), rng.uniform(3, 6)
    phase = 2 * math.pi * freq * (np.cos(angle) * xx + np.sin(angle) * yy)
    palette = rng.uniform(0, 1, size=(3, 3))
    wave = 0.5 + 0.5 * np.sin(phase)
    style = palette[0][:, None, None] * wave + palette[1][:, None, None] * (1 - wave)
    style = style + 0.15 * rng.standard_normal((3, IMSIZE, IMSIZE)) * (np.sin(3 * phase) > 0)
    to = lambda a: torch.tensor(np.clip(a, 0, 1), dtype=torch.float32).unsqueeze(0)  # noqa: E731
    return to(content), to(style)


def make_cnn(seed: int) -> nn.Sequential:
    """The stand-in for ``models.vgg19_bn(...).features``: random weights, batch-norm running
    statistics set once from generated images (as a pretrained network's would be)."""
    g = torch.Generator().manual_seed(seed + 100)
    layers: list[nn.Module] = []
    in_ch = 3
    for i, width in enumerate(WIDTHS):
        conv = nn.Conv2d(in_ch, width, 3, padding=1)
        with torch.no_grad():
            conv.weight.normal_(0, math.sqrt(2.0 / (9 * in_ch)), generator=g)
            conv.bias.zero_()
        layers += [conv, nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
        if i in (1, 3):
            layers.append(nn.MaxPool2d(2))
        in_ch = width
    cnn = nn.Sequential(*layers)
    for m in cnn.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None  # a cumulative average over the calibration batch
    calib = torch.cat([torch.cat(make_images(seed + 1000 + k)) for k in range(32)])
    with torch.no_grad():
        cnn.train()
        cnn((calib - torch.tensor(CNN_NORMALIZATION_MEAN).view(-1, 1, 1))
            / torch.tensor(CNN_NORMALIZATION_STD).view(-1, 1, 1))  # fmt: skip
    for m in cnn.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    return cnn


# --------------------------------------------------------------------------- the tutorial


class ContentLoss(nn.Module):
    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.target = target.detach()

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        self.loss = F.mse_loss(input, self.target)
        return input


def gram_matrix(input: torch.Tensor, normalize: bool = True) -> torch.Tensor:  # noqa: A002
    a, b, c, d = input.size()
    features = input.view(a * b, c * d)
    G = torch.mm(features, features.t())
    return G.div(a * b * c * d) if normalize else G


class StyleLoss(nn.Module):
    def __init__(self, target_feature: torch.Tensor, normalize: bool = True) -> None:
        super().__init__()
        self.normalize = normalize
        self.target = gram_matrix(target_feature, normalize).detach()

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        self.loss = F.mse_loss(gram_matrix(input, self.normalize), self.target)
        return input


class Normalization(nn.Module):
    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return (img - self.mean) / self.std


def get_style_model_and_losses(cnn: nn.Sequential, normalization_mean: tuple[float, ...],
                               normalization_std: tuple[float, ...], style_img: torch.Tensor,
                               content_img: torch.Tensor, content_layers: list[str] = content_layers_default,
                               style_layers: list[str] = style_layers_default, normalize_gram: bool = True,
                               ) -> tuple[nn.Sequential, list[StyleLoss], list[ContentLoss]]:  # fmt: skip
    cnn = copy.deepcopy(cnn)
    normalization = Normalization(normalization_mean, normalization_std)
    content_losses: list[ContentLoss] = []
    style_losses: list[StyleLoss] = []
    model = nn.Sequential(normalization)
    i = 0
    for layer in cnn.children():
        if isinstance(layer, nn.Conv2d):
            i += 1
            name = f"conv_{i}"
        elif isinstance(layer, nn.ReLU):
            name = f"relu_{i}"
            layer = nn.ReLU(inplace=False)
        elif isinstance(layer, nn.MaxPool2d):
            name = f"pool_{i}"
        elif isinstance(layer, nn.BatchNorm2d):
            name = f"bn_{i}"
        else:
            raise RuntimeError(f"Unrecognized layer: {layer.__class__.__name__}")
        model.add_module(name, layer)
        if name in content_layers:
            target = model(content_img).detach()
            content_loss = ContentLoss(target)
            model.add_module(f"content_loss_{i}", content_loss)
            content_losses.append(content_loss)
        if name in style_layers:
            target_feature = model(style_img).detach()
            style_loss = StyleLoss(target_feature, normalize_gram)
            model.add_module(f"style_loss_{i}", style_loss)
            style_losses.append(style_loss)
    for i in range(len(model) - 1, -1, -1):
        if isinstance(model[i], (ContentLoss, StyleLoss)):
            break
    model = model[: (i + 1)]
    return model, style_losses, content_losses


class Objective(nn.Module):
    """What the author hands nndx: the style model with its loss modules; the output is the
    closure's two weighted terms, read from this module's own loss modules."""

    def __init__(self, model: nn.Sequential, style_weight: float, content_weight: float) -> None:
        super().__init__()
        self.model = model
        self.style_weight, self.content_weight = style_weight, content_weight

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        self.model(img)
        style = sum(m.loss for m in self.model.modules() if isinstance(m, StyleLoss))
        content = sum(m.loss for m in self.model.modules() if isinstance(m, ContentLoss))
        return torch.stack([style * self.style_weight, content * self.content_weight])


def objective_loss(output: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
    return output.sum()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    content_img, style_img = make_images(seed)
    cnn = make_cnn(seed)
    use_eval = variant != "extractor_not_eval"
    if use_eval:
        cnn = cnn.eval()  # models.vgg19(...).features.eval()
    pristine = copy.deepcopy(cnn).eval()  # measure only: the extractor as loaded
    input_img = content_img.clone()

    # run_style_transfer(cnn, mean, std, content_img, style_img, input_img)
    num_steps, style_weight, content_weight = NUM_STEPS, STYLE_WEIGHT, CONTENT_WEIGHT
    model, style_losses, content_losses = get_style_model_and_losses(
        cnn, CNN_NORMALIZATION_MEAN, CNN_NORMALIZATION_STD, style_img, content_img,
        normalize_gram=variant != "gram_not_normalized")  # fmt: skip
    input_img.requires_grad_(True)
    if use_eval:
        model.eval()
    model.requires_grad_(False)
    optimizer = optim.LBFGS([input_img])

    objective = Objective(model, style_weight, content_weight)
    placeholder = torch.zeros(2)
    nx.preflight(objective, (input_img.detach().clone(), placeholder), objective_loss, optimizer=optimizer)
    mon = nx.monitor(objective, optimizer, every=10)

    run = [0]
    scores: list[tuple[float, float]] = []
    snapshots: list[torch.Tensor] = []
    while run[0] <= num_steps:

        def closure() -> torch.Tensor:
            with torch.no_grad():
                input_img.clamp_(0, 1)
            optimizer.zero_grad()
            model(input_img)
            style_score = 0
            content_score = 0
            for sl in style_losses:
                style_score += sl.loss
            for cl in content_losses:
                content_score += cl.loss
            style_score *= style_weight
            content_score *= content_weight
            loss = style_score + content_score
            loss.backward()
            nx.timed(lambda: mon.log(loss))
            run[0] += 1
            if run[0] % 50 == 0:
                scores.append((style_score.item(), content_score.item()))
                snapshots.append(input_img.detach().clone())  # measure only
            return style_score + content_score

        optimizer.step(closure)

    with torch.no_grad():
        input_img.clamp_(0, 1)

    nx.finish(mon, objective, (input_img.detach().clone(), placeholder), objective_loss, optimizer=optimizer)
    return {"closure_calls": float(run[0]), "last_printed_loss": float(sum(scores[-1])) if scores else math.nan,
            **measure(input_img.detach(), snapshots, pristine, content_img, style_img)}  # fmt: skip


# --------------------------------------------------------------------------- measure only


def _objective(img: torch.Tensor, cnn: nn.Sequential, content_img: torch.Tensor,
               style_img: torch.Tensor) -> tuple[float, float]:  # fmt: skip
    """(style, content) of ``img`` as the healthy program defines them: normalised Gram
    matrices, the extractor as loaded (evaluation mode)."""
    with torch.no_grad():
        model, style_losses, content_losses = get_style_model_and_losses(
            cnn, CNN_NORMALIZATION_MEAN, CNN_NORMALIZATION_STD, style_img, content_img)  # fmt: skip
        model.eval()
        model(img.clamp(0, 1))
        return float(sum(sl.loss for sl in style_losses)), float(sum(cl.loss for cl in content_losses))


def measure(output: torch.Tensor, snapshots: list[torch.Tensor], cnn: nn.Sequential, content_img: torch.Tensor,
            style_img: torch.Tensor) -> dict[str, float]:  # fmt: skip
    """The output, and the images at the tutorial's progress prints (every 50 closure calls),
    scored by the healthy program's objective. L-BFGS with the clamp in the closure jumps now
    and then, so the median over the last four images (runs 200, 250, 300 and the output) is
    the steadier number."""
    style, content = _objective(output, cnn, content_img, style_img)
    objectives = [STYLE_WEIGHT * s + CONTENT_WEIGHT * c
                  for s, c in (_objective(x, cnn, content_img, style_img) for x in snapshots[-3:] + [output])]
    style_of_content, _ = _objective(content_img, cnn, content_img, style_img)
    return {
        "final_objective": STYLE_WEIGHT * style + CONTENT_WEIGHT * content,
        "late_objective": float(np.median(objectives)),
        "final_style": style,
        "final_content": content,
        "style_of_content_image": style_of_content,
    }
