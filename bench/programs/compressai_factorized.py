"""Port of CompressAI's example training script for the bmshj2018-factorized image codec: an
analysis transform with GDN, an entropy bottleneck (additive uniform noise in training, a
learned factorized density, an auxiliary loss on its quantiles), a synthesis transform with
inverse GDN, trained on the rate-distortion loss ``lambda * 255^2 * MSE + bpp`` by a main
Adam over the network and a separate auxiliary Adam over the quantiles.

Source: github.com/InterDigitalInc/CompressAI, ``examples/train.py``,
``compressai/models/google.py`` (``FactorizedPrior``), ``compressai/models/utils.py``
(``conv``/``deconv``), ``compressai/models/base.py`` (``aux_loss``),
``compressai/entropy_models/entropy_models.py`` (``EntropyModel.quantize``,
``EntropyBottleneck``), ``compressai/layers/gdn.py`` (``GDN``),
``compressai/ops/parametrizers.py`` and ``ops/bound_ops.py`` (``NonNegativeParametrizer``,
``LowerBound``), ``compressai/losses/rate_distortion.py`` (``RateDistortionLoss``) and
``compressai/optimizers/net_aux.py`` (``net_aux_optimizer``) at commit
869a9f5d4126d015b7de8f203fe60ee9e1608193 (BSD-3-Clause-Clear, Copyright (c) 2021-2024
InterDigital Communications, Inc). Written anew from the facts of those files; no code
copied; compressai is not installed, so the pieces the model uses are written out here.

Kept: ``FactorizedPrior.forward`` (``y = g_a(x)``, ``y_hat, y_likelihoods =
entropy_bottleneck(y)``, ``x_hat = g_s(y_hat)``, the ``{"x_hat", "likelihoods": {"y"}}``
dict); ``g_a`` = four ``conv`` (5x5, stride 2, padding 2) with ``GDN`` between, ``g_s`` =
four ``deconv`` (5x5 transposed, stride 2, output padding 1) with inverse ``GDN`` between;
``GDN`` (beta and gamma through the non-negative reparametrisation with its pedestal and
``LowerBound``'s gradient rule, ``norm = conv2d(x^2, gamma, beta)``, ``rsqrt`` or ``sqrt``
for the inverse, gamma initialised to 0.1 I); ``EntropyBottleneck`` (filters (3, 3, 3, 3),
``init_scale`` 10, ``tail_mass`` 1e-9, the softplus(matrix) / bias / tanh(factor) cumulative
logits, the likelihood ``sigmoid(upper) - sigmoid(lower)`` bounded below by 1e-9, the
channel-first permutation, ``quantize`` with uniform noise in training and rounding around
the medians in eval, ``loss()`` = ``|logits(quantiles) - target|`` on detached density
parameters); ``aux_loss`` = the sum of the bottlenecks' losses; ``RateDistortionLoss``
(``bpp = sum(log(likelihoods)) / (-log(2) * N * H * W)``, ``lmbda * 255**2 * mse + bpp``,
the dict of all terms); ``net_aux_optimizer`` (the ``.quantiles`` to the aux optimizer, the
rest to the main one, both ``Adam``); ``ReduceLROnPlateau(optimizer, "min")`` stepped on the
test loss each epoch; ``train_one_epoch`` (``model.train()``, both ``zero_grad``, forward,
criterion, backward, ``clip_grad_norm_(model.parameters(), 1.0)``, ``optimizer.step()``,
then ``aux_loss().backward()`` and ``aux_optimizer.step()``); ``test_epoch`` (``model.eval()``,
``no_grad``, the averages of loss, bpp, mse and aux loss); ``lmbda`` 1e-2; batch 16;
``RandomCrop`` + ``ToTensor`` for training, ``CenterCrop`` + ``ToTensor`` for testing.
Shrunk: scikit-learn's 8x8 digits upscaled to 36x36, tinted with a random colour per image
(three channels), cropped to 32x32 patches instead of 256x256 crops of Vimeo-90k/ImageNet
photos; ``N`` 16 and ``M`` 24 instead of quality 3's 128 and 192; 4 epochs instead of 100;
learning rate 1e-3 instead of 1e-4 (the aux learning rate keeps its 1e-3); the 1,437
training and 360 test digits instead of an image folder; no checkpoints, DataParallel,
CUDA, entropy coding (``compress``/``update``) or printing.
Measure only (not in the program): ``test_epoch``'s numbers (eval mode: rounded latents)
and the PSNR of the test reconstructions on the images' own 0-1 scale.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
``(d, d)`` with the main optimizer and the criterion's ``"loss"`` entry as the loss;
``nndx.Monitor(net, optimizer)`` (the main optimizer: the one the loss trains; the aux
optimizer only fits the quantiles to the density) around the epochs, each batch's
rate-distortion loss logged and each ``test_epoch``'s loss logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn, optim
from torch.utils.data import DataLoader, Dataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "compressai_factorized"
SOURCE = Source("InterDigitalInc/CompressAI", "examples/train.py", "869a9f5d4126d015b7de8f203fe60ee9e1608193",
                "BSD-3-Clause-Clear")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (bmshj2018-factorized, shrunk: N=16, M=24, 32x32 patches)"),
        Variant(
            "pixels_0_255",
            "the images reach the model as 0-255 floats (read with np.array(img) instead of ToTensor) while "
            "RateDistortionLoss still assumes [0, 1] (lambda * 255^2 * MSE): the distortion term is 65,025x "
            "too heavy against the rate, so the codec spends far more bits than lambda 0.01 asks for",
            (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
            ("https://github.com/InterDigitalInc/CompressAI/issues/190",
             "https://github.com/InterDigitalInc/CompressAI/issues/4"),
            Measure("test_bpp", "test bits per pixel at least 1.8x the healthy run's (0.505 against 0.224 on "
                    "seed 0; test PSNR 15.7 dB against 20.2 dB)", lambda healthy, buggy: not buggy < 1.8 * healthy),
        ),
        Variant(
            "latent_rounded_in_training",
            "FactorizedPrior.forward quantises the latent with torch.round(y) before the entropy bottleneck (as at "
            "test time): round has a zero gradient, so neither the distortion nor the rate reaches g_a and the "
            "encoder never trains",
            (C.DETACHED_GRAPH,),
            ("https://github.com/Justin-Tan/generative-compression/issues/51",
             "https://github.com/Justin-Tan/generative-compression/issues/27",
             "https://github.com/InterDigitalInc/CompressAI/issues/6"),
            Measure("test_loss", "test rate-distortion loss at least 1.3x the healthy run's (17.3 against 7.1 "
                    "on seed 0; test PSNR 16.1 dB against 20.2 dB)", lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
    )
}

ARGS = {"epochs": 4, "learning_rate": 1e-3, "aux_learning_rate": 1e-3, "lmbda": 1e-2, "batch_size": 16,
        "test_batch_size": 64, "patch_size": 32, "clip_max_norm": 1.0}  # fmt: skip
N_CH, M_CH = 16, 24
SIDE = 36

# --------------------------------------------------------------------------- ops / layers


class LowerBoundFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, bound: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, bound)
        return torch.max(x, bound)

    @staticmethod
    def backward(ctx, grad_output: Tensor):  # type: ignore[override]
        x, bound = ctx.saved_tensors
        pass_through = (x >= bound) | (grad_output < 0)
        return pass_through * grad_output, None


class LowerBound(nn.Module):
    def __init__(self, bound: float) -> None:
        super().__init__()
        self.register_buffer("bound", torch.Tensor([float(bound)]))

    def forward(self, x: Tensor) -> Tensor:
        return LowerBoundFunction.apply(x, self.bound)


class NonNegativeParametrizer(nn.Module):
    def __init__(self, minimum: float = 0.0, reparam_offset: float = 2**-18) -> None:
        super().__init__()
        self.minimum, self.reparam_offset = float(minimum), float(reparam_offset)
        self.register_buffer("pedestal", torch.Tensor([self.reparam_offset**2]))
        self.lower_bound = LowerBound((self.minimum + self.reparam_offset**2) ** 0.5)

    def init(self, x: Tensor) -> Tensor:
        return torch.sqrt(torch.max(x + self.pedestal, self.pedestal))

    def forward(self, x: Tensor) -> Tensor:
        return self.lower_bound(x) ** 2 - self.pedestal


class GDN(nn.Module):
    def __init__(self, in_channels: int, inverse: bool = False, beta_min: float = 1e-6, gamma_init: float = 0.1) -> None:
        super().__init__()
        self.inverse = bool(inverse)
        self.beta_reparam = NonNegativeParametrizer(minimum=float(beta_min))
        self.beta = nn.Parameter(self.beta_reparam.init(torch.ones(in_channels)))
        self.gamma_reparam = NonNegativeParametrizer()
        self.gamma = nn.Parameter(self.gamma_reparam.init(float(gamma_init) * torch.eye(in_channels)))

    def forward(self, x: Tensor) -> Tensor:
        _, C_, _, _ = x.size()
        beta = self.beta_reparam(self.beta)
        gamma = self.gamma_reparam(self.gamma).reshape(C_, C_, 1, 1)
        norm = F.conv2d(x**2, gamma, beta)
        norm = torch.sqrt(norm) if self.inverse else torch.rsqrt(norm)
        return x * norm


def conv(in_channels: int, out_channels: int, kernel_size: int = 5, stride: int = 2) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, stride=stride, padding=kernel_size // 2)


def deconv(in_channels: int, out_channels: int, kernel_size: int = 5, stride: int = 2) -> nn.ConvTranspose2d:
    return nn.ConvTranspose2d(in_channels, out_channels, kernel_size=kernel_size, stride=stride,
                              output_padding=stride - 1, padding=kernel_size // 2)  # fmt: skip


# --------------------------------------------------------------------------- entropy_models.py


class EntropyBottleneck(nn.Module):
    def __init__(self, channels: int, tail_mass: float = 1e-9, init_scale: float = 10.0,
                 filters: tuple[int, ...] = (3, 3, 3, 3), likelihood_bound: float = 1e-9) -> None:  # fmt: skip
        super().__init__()
        self.channels, self.filters = int(channels), tuple(int(f) for f in filters)
        self.init_scale, self.tail_mass = float(init_scale), float(tail_mass)
        self.likelihood_lower_bound = LowerBound(likelihood_bound)
        filters_ = (1,) + self.filters + (1,)
        scale = self.init_scale ** (1 / (len(self.filters) + 1))
        self.matrices, self.biases, self.factors = nn.ParameterList(), nn.ParameterList(), nn.ParameterList()
        for i in range(len(self.filters) + 1):
            init = np.log(np.expm1(1 / scale / filters_[i + 1]))
            self.matrices.append(nn.Parameter(torch.full((channels, filters_[i + 1], filters_[i]), float(init))))
            bias = torch.empty(channels, filters_[i + 1], 1)
            nn.init.uniform_(bias, -0.5, 0.5)
            self.biases.append(nn.Parameter(bias))
            if i < len(self.filters):
                self.factors.append(nn.Parameter(torch.zeros(channels, filters_[i + 1], 1)))
        self.quantiles = nn.Parameter(torch.Tensor([-self.init_scale, 0, self.init_scale]).repeat(channels, 1, 1))
        target = np.log(2 / self.tail_mass - 1)
        self.register_buffer("target", torch.Tensor([-target, 0, target]))

    def _get_medians(self) -> Tensor:
        return self.quantiles[:, :, 1:2]

    @staticmethod
    def quantize(inputs: Tensor, mode: str, means: Tensor | None = None) -> Tensor:
        if mode == "noise":
            return inputs + torch.empty_like(inputs).uniform_(-0.5, 0.5)
        outputs = inputs.clone()
        if means is not None:
            outputs -= means
        outputs = torch.round(outputs)
        if means is not None:
            outputs += means
        return outputs

    def loss(self) -> Tensor:
        logits = self._logits_cumulative(self.quantiles, stop_gradient=True)
        return torch.abs(logits - self.target).sum()

    def _logits_cumulative(self, inputs: Tensor, stop_gradient: bool) -> Tensor:
        logits = inputs
        for i in range(len(self.filters) + 1):
            matrix, bias = self.matrices[i], self.biases[i]
            if stop_gradient:
                matrix, bias = matrix.detach(), bias.detach()
            logits = torch.matmul(F.softplus(matrix), logits) + bias
            if i < len(self.filters):
                factor = self.factors[i].detach() if stop_gradient else self.factors[i]
                logits = logits + torch.tanh(factor) * torch.tanh(logits)
        return logits

    def _likelihood(self, inputs: Tensor) -> Tensor:
        lower = self._logits_cumulative(inputs - 0.5, stop_gradient=False)
        upper = self._logits_cumulative(inputs + 0.5, stop_gradient=False)
        return torch.sigmoid(upper) - torch.sigmoid(lower)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        perm = [1, 0] + list(range(2, x.ndim))  # B x C x ... -> C x B x ...
        x = x.permute(*perm).contiguous()
        shape = x.size()
        values = x.reshape(x.size(0), 1, -1)
        outputs = self.quantize(values, "noise" if self.training else "dequantize", self._get_medians())
        likelihood = self.likelihood_lower_bound(self._likelihood(outputs))
        outputs = outputs.reshape(shape).permute(*perm).contiguous()
        likelihood = likelihood.reshape(shape).permute(*perm).contiguous()
        return outputs, likelihood


# --------------------------------------------------------------------------- models/google.py


class FactorizedPrior(nn.Module):
    def __init__(self, N: int, M: int, round_latent: bool = False) -> None:
        super().__init__()
        self.entropy_bottleneck = EntropyBottleneck(M)
        self.g_a = nn.Sequential(conv(3, N), GDN(N), conv(N, N), GDN(N), conv(N, N), GDN(N), conv(N, M))
        self.g_s = nn.Sequential(deconv(M, N), GDN(N, inverse=True), deconv(N, N), GDN(N, inverse=True),
                                 deconv(N, N), GDN(N, inverse=True), deconv(N, 3))  # fmt: skip
        self.N, self.M = N, M
        self.round_latent = round_latent

    def forward(self, x: Tensor) -> dict:
        y = self.g_a(x)
        if self.round_latent:
            y = torch.round(y)
        y_hat, y_likelihoods = self.entropy_bottleneck(y)
        x_hat = self.g_s(y_hat)
        return {"x_hat": x_hat, "likelihoods": {"y": y_likelihoods}}

    def aux_loss(self) -> Tensor:
        return sum(m.loss() for m in self.modules() if isinstance(m, EntropyBottleneck))


# --------------------------------------------------------------------------- losses, optimizers


class RateDistortionLoss(nn.Module):
    def __init__(self, lmbda: float = 1e-2) -> None:
        super().__init__()
        self.mse = nn.MSELoss()
        self.lmbda = lmbda

    def forward(self, output: dict, target: Tensor) -> dict:
        N, _, H, W = target.size()
        num_pixels = N * H * W
        out = {"bpp_loss": sum(torch.log(lk).sum() / (-math.log(2) * num_pixels)
                               for lk in output["likelihoods"].values())}  # fmt: skip
        out["mse_loss"] = self.mse(output["x_hat"], target)
        out["loss"] = self.lmbda * 255**2 * out["mse_loss"] + out["bpp_loss"]
        return out


def configure_optimizers(net: nn.Module, args: dict) -> tuple[optim.Optimizer, optim.Optimizer]:
    parameters = {
        "net": {n for n, p in net.named_parameters() if p.requires_grad and not n.endswith(".quantiles")},
        "aux": {n for n, p in net.named_parameters() if p.requires_grad and n.endswith(".quantiles")},
    }
    params_dict = dict(net.named_parameters())
    assert not parameters["net"] & parameters["aux"]
    assert len(parameters["net"] | parameters["aux"]) == len(params_dict)
    optimizer = optim.Adam((params_dict[n] for n in sorted(parameters["net"])), lr=args["learning_rate"])
    aux_optimizer = optim.Adam((params_dict[n] for n in sorted(parameters["aux"])), lr=args["aux_learning_rate"])
    return optimizer, aux_optimizer


# --------------------------------------------------------------------------- data (ImageFolder + transforms)


def _tinted(raw: torch.Tensor, seed: int) -> torch.Tensor:
    """The digits upscaled to SIDE x SIDE, each given a random colour: (N, 3, SIDE, SIDE) uint8-valued floats."""
    gray = digits.upscaled(raw, SIDE)  # (N, 1, S, S) in [0, 1]
    rng = np.random.default_rng(seed + 7)
    ink = torch.from_numpy(rng.uniform(0.3, 1.0, size=(len(raw), 3, 1, 1))).float()
    paper = torch.from_numpy(rng.uniform(0.0, 0.3, size=(len(raw), 3, 1, 1))).float()
    return torch.round((paper + (ink - paper) * gray) * 255.0)  # 8-bit pixel values, as read from a file


class ImageSet(Dataset):
    def __init__(self, pixels: torch.Tensor, patch: int, random_crop: bool, to_tensor: bool, seed: int) -> None:
        self.pixels, self.patch, self.random_crop, self.to_tensor = pixels, patch, random_crop, to_tensor
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, i: int) -> Tensor:
        img = self.pixels[i]
        side = img.shape[-1]
        if self.random_crop:  # RandomCrop(patch_size)
            top, left = (int(v) for v in torch.randint(0, side - self.patch + 1, (2,), generator=self.gen))
        else:  # CenterCrop(patch_size)
            top = left = (side - self.patch) // 2
        img = img[:, top : top + self.patch, left : left + self.patch]
        return img / 255.0 if self.to_tensor else img.clone()  # ToTensor, or np.array(img) as floats


# --------------------------------------------------------------------------- examples/train.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, _, test_raw, _ = digits.digit_images(seed=seed)
    to_tensor = variant != "pixels_0_255"
    train_dataset = ImageSet(_tinted(train_raw, seed), args["patch_size"], True, to_tensor, seed)
    test_dataset = ImageSet(_tinted(test_raw, seed + 1), args["patch_size"], False, to_tensor, seed)
    train_dataloader = DataLoader(train_dataset, batch_size=args["batch_size"], shuffle=True,
                                  generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_dataloader = DataLoader(test_dataset, batch_size=args["test_batch_size"], shuffle=False)

    net = FactorizedPrior(N_CH, M_CH, round_latent=variant == "latent_rounded_in_training")
    optimizer, aux_optimizer = configure_optimizers(net, args)
    lr_scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, "min")
    criterion = RateDistortionLoss(lmbda=args["lmbda"])

    def rd_loss(out_net: dict, target: Tensor) -> Tensor:
        return criterion(out_net, target)["loss"]

    first = torch.stack([train_dataset[i] for i in range(args["batch_size"])])
    first_batch = (first, first)
    nx.preflight(net, first_batch, rd_loss, optimizer=optimizer)
    mon = nx.monitor(net, optimizer, every=10)

    def train_one_epoch() -> float:
        net.train()
        losses = []
        for d in train_dataloader:
            optimizer.zero_grad()
            aux_optimizer.zero_grad()
            out_net = net(d)
            out_criterion = criterion(out_net, d)
            out_criterion["loss"].backward()
            if args["clip_max_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), args["clip_max_norm"])
            optimizer.step()
            aux_loss = net.aux_loss()
            aux_loss.backward()
            aux_optimizer.step()
            mon.log(out_criterion["loss"])
            losses.append(out_criterion["loss"].item())
        return float(np.mean(losses))

    def test_epoch() -> dict[str, float]:
        net.eval()
        sums = {"loss": 0.0, "bpp_loss": 0.0, "mse_loss": 0.0, "aux_loss": 0.0, "psnr": 0.0}
        count = 0
        with torch.no_grad():
            for d in test_dataloader:
                out_net = net(d)
                out_criterion = criterion(out_net, d)
                n = d.size(0)
                sums["aux_loss"] += net.aux_loss().item() * n
                for key in ("loss", "bpp_loss", "mse_loss"):
                    sums[key] += out_criterion[key].item() * n
                peak = 255.0 if d.max() > 1.5 else 1.0  # measure only: PSNR on the images' own scale
                x_hat = out_net["x_hat"].clamp(0, peak)
                mse = ((x_hat - d) ** 2).flatten(1).mean(1) / peak**2
                sums["psnr"] += (-10 * torch.log10(mse)).sum().item()
                count += n
        return {k: v / count for k, v in sums.items()}

    train_loss = float("nan")
    result: dict[str, float] = {}
    for _epoch in range(args["epochs"]):
        train_loss = train_one_epoch()
        result = test_epoch()
        mon.log(result["loss"], split="val")
        lr_scheduler.step(result["loss"])

    nx.finish(mon, net, first_batch, rd_loss, optimizer=optimizer)
    return {"train_loss": train_loss, "test_loss": result["loss"], "test_bpp": result["bpp_loss"],
            "test_mse": result["mse_loss"], "test_aux_loss": result["aux_loss"], "test_psnr": result["psnr"],
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
