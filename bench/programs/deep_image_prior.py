"""Port of Deep Image Prior's blind denoising: an encoder-decoder 'skip' network, fitted to
one noisy image from a fixed noise tensor, its structure acting as the prior.

Source: github.com/DmitryUlyanov/deep-image-prior, ``denoising.ipynb`` (the F16 branch),
``models/skip.py``, ``models/common.py``, ``models/__init__.py`` (``get_net``),
``utils/common_utils.py`` and ``utils/denoising_utils.py`` at commit
042e0d4c1e93f4b1eb0932781de55b8cff5e0f40 (Apache-2.0). Written anew from the facts of those
files; no code copied.

Kept: ``skip(...)`` as ``get_net(input_depth, 'skip', pad, skip_n33d, skip_n33u, skip_n11,
num_scales, upsample_mode='bilinear')`` builds it: per scale a ``Concat(1, skip, deeper)``
(centre-cropping to the smaller map), a ``BatchNorm2d`` of the concatenation, the skip branch
``conv 1x1`` + BN + ``LeakyReLU(0.2, inplace=True)``, the deeper branch ``conv 3x3 stride
2`` + BN + LeakyReLU, ``conv 3x3`` + BN + LeakyReLU, the next scale, ``nn.Upsample(scale 2,
bilinear)``; after the concatenation ``conv 3x3`` + BN + LeakyReLU and the ``need1x1_up``
``conv 1x1`` + BN + LeakyReLU; a last ``conv 1x1`` to the output channels and ``Sigmoid``;
every conv with bias and, for ``pad='reflection'``, a ``ReflectionPad2d`` in front of it;
``get_noise(input_depth, 'noise', size)``: uniform noise times 0.1; ``get_noisy_image``:
``clip(img + N(0, sigma), 0, 1)`` with ``sigma = 25 / 255``; the notebook's setup
(``INPUT='noise'``, ``OPT_OVER='net'``, ``reg_noise_std=1/30``, ``LR=0.01``, Adam,
``exp_weight=0.99``, ``MSELoss``, ``show_every=100``) and its ``closure``: the input
re-perturbed each step (``net_input_saved + noise.normal_() * reg_noise_std``), the
exponential average ``out_avg`` of detached outputs, ``total_loss = mse(out,
img_noisy_torch)``, ``backward``, the three PSNRs (noisy, clean, clean of the average;
``compare_psnr``'s data range 1 for images in [0, 1]), and the backtracking (off the
``show_every`` iterations, a drop of the noisy PSNR by more than 5 dB copies the last saved
parameters back and returns ``total_loss * 0``, else the parameters are saved);
``optimize('adam', ...)``: ``Adam(parameters, lr=LR)``, then per iteration ``zero_grad``,
``closure()``, ``step``; the final ``net(net_input)``.
Shrunk: a 64x64 crop of scikit-learn's shipped ``china.jpg`` (area-downsampled by 6 from
its central 384x384) instead of the 512x512 F16 photograph; 16 channels at each of the 5
scales (``skip_n33d = skip_n33u = 16``) instead of 128, ``input_depth`` 8 instead of 32;
500 iterations instead of 3,000; no plots.
Measure: ``psnr_gt_sm``, the PSNR of the final exponential average against the clean image
(what the notebook prints last), and ``psnr_gt_final``, the PSNR of the notebook's last cell,
``net(net_input)``, against the clean image; the PSNR of the noisy image itself is returned
for reference.

nndx, as the author would add it: a preflight ``nndx.probe(net, (net_input, img_noisy_torch),
mse)`` before ``optimize``; inside ``optimize``, once the Adam exists,
``nndx.Monitor(net, optimizer)`` around the iterations, each iteration's loss logged and,
every ``show_every`` iterations, the MSE of the output against the clean image (the
notebook's ``PSNR_gt`` signal) as ``split="val"``; then ``nndx.probe(..., monitor=mon)`` on
the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "deep_image_prior"
SOURCE = Source("DmitryUlyanov/deep-image-prior", "denoising.ipynb", "042e0d4c1e93f4b1eb0932781de55b8cff5e0f40",
                "Apache-2.0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: a 64x64 image, 16 channels a scale, 500 iterations)"),
        Variant(
            "zero_grad_dropped",
            "optimize() written without optimizer.zero_grad(): every closure's backward adds to the gradients of "
            "all earlier iterations, and Adam steps on the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/LoreGoetschalckx/GANalyze/issues/7",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/IDEA-Research/DN-DETR/issues/19"),
            Measure("psnr_gt_sm", "PSNR of the averaged output against the clean image at least 1.5 dB below the "
                    "healthy run's: 13.4 dB against 24.2 dB healthy on seed 0 (the noisy image: 20.8 dB)",
                    lambda healthy, buggy: not buggy > healthy - 1.5),
        ),
        Variant(
            "lr_too_high",
            "LR = 0.1 instead of 0.01 for Adam",
            (C.LR_TOO_HIGH,),
            ("https://github.com/DmitryUlyanov/deep-image-prior/issues/70",
             "https://github.com/milesial/Pytorch-UNet/issues/117",
             "https://github.com/Jongchan/tensorflow-vdsr/issues/7"),
            Measure("psnr_gt_final", "PSNR of the final output (the notebook's last cell) against the clean image "
                    "at least 1 dB below the healthy run's: 22.1 dB against 24.2 dB healthy on seed 0",
                    lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
    )
}

imsize = 64
sigma = 25
sigma_ = sigma / 255.0
INPUT = "noise"
pad = "reflection"
OPT_OVER = "net"
reg_noise_std = 1.0 / 30.0
LR = 0.01
OPTIMIZER = "adam"
show_every = 100
exp_weight = 0.99
num_iter = 500
input_depth = 8


# --------------------------------------------------------------------------- models/common.py


class Concat(nn.Module):
    def __init__(self, dim: int, *args: nn.Module) -> None:
        super().__init__()
        self.dim = dim
        for idx, module in enumerate(args):
            self.add_module(str(idx), module)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        inputs = [module(input) for module in self._modules.values()]
        h = min(x.shape[2] for x in inputs)
        w = min(x.shape[3] for x in inputs)
        if all(x.shape[2] == h and x.shape[3] == w for x in inputs):
            cropped = inputs
        else:
            cropped = []
            for inp in inputs:
                d2, d3 = (inp.size(2) - h) // 2, (inp.size(3) - w) // 2
                cropped.append(inp[:, :, d2 : d2 + h, d3 : d3 + w])
        return torch.cat(cropped, dim=self.dim)

    def __len__(self) -> int:
        return len(self._modules)


def add(seq: nn.Sequential, module: nn.Module) -> None:
    """The repository's ``Module.add``: append under the next number."""
    seq.add_module(str(len(seq) + 1), module)


def act(act_fun: str = "LeakyReLU") -> nn.Module:
    assert act_fun == "LeakyReLU"
    return nn.LeakyReLU(0.2, inplace=True)


def bn(num_features: int) -> nn.Module:
    return nn.BatchNorm2d(num_features)


def conv(in_f: int, out_f: int, kernel_size: int, stride: int = 1, bias: bool = True, pad: str = "zero") -> nn.Module:
    to_pad = int((kernel_size - 1) / 2)
    padder = None
    if pad == "reflection":
        padder = nn.ReflectionPad2d(to_pad)
        to_pad = 0
    convolver = nn.Conv2d(in_f, out_f, kernel_size, stride, padding=to_pad, bias=bias)
    return nn.Sequential(*[m for m in (padder, convolver) if m is not None])


# --------------------------------------------------------------------------- models/skip.py


def skip(num_input_channels: int, num_output_channels: int, num_channels_down: list[int],
         num_channels_up: list[int], num_channels_skip: list[int], filter_size_down: int = 3,
         filter_size_up: int = 3, filter_skip_size: int = 1, need_sigmoid: bool = True, need_bias: bool = True,
         pad: str = "zero", upsample_mode: str = "nearest", act_fun: str = "LeakyReLU",
         need1x1_up: bool = True) -> nn.Sequential:  # fmt: skip
    assert len(num_channels_down) == len(num_channels_up) == len(num_channels_skip)
    n_scales = len(num_channels_down)
    last_scale = n_scales - 1
    model = nn.Sequential()
    model_tmp = model
    input_depth = num_input_channels
    for i in range(n_scales):
        deeper = nn.Sequential()
        skip_branch = nn.Sequential()
        if num_channels_skip[i] != 0:
            add(model_tmp, Concat(1, skip_branch, deeper))
        else:
            add(model_tmp, deeper)
        add(model_tmp, bn(num_channels_skip[i] + (num_channels_up[i + 1] if i < last_scale else num_channels_down[i])))
        if num_channels_skip[i] != 0:
            add(skip_branch, conv(input_depth, num_channels_skip[i], filter_skip_size, bias=need_bias, pad=pad))
            add(skip_branch, bn(num_channels_skip[i]))
            add(skip_branch, act(act_fun))
        add(deeper, conv(input_depth, num_channels_down[i], filter_size_down, 2, bias=need_bias, pad=pad))
        add(deeper, bn(num_channels_down[i]))
        add(deeper, act(act_fun))
        add(deeper, conv(num_channels_down[i], num_channels_down[i], filter_size_down, bias=need_bias, pad=pad))
        add(deeper, bn(num_channels_down[i]))
        add(deeper, act(act_fun))
        deeper_main = nn.Sequential()
        if i == last_scale:
            k = num_channels_down[i]
        else:
            add(deeper, deeper_main)
            k = num_channels_up[i + 1]
        add(deeper, nn.Upsample(scale_factor=2, mode=upsample_mode))
        add(model_tmp, conv(num_channels_skip[i] + k, num_channels_up[i], filter_size_up, 1, bias=need_bias, pad=pad))
        add(model_tmp, bn(num_channels_up[i]))
        add(model_tmp, act(act_fun))
        if need1x1_up:
            add(model_tmp, conv(num_channels_up[i], num_channels_up[i], 1, bias=need_bias, pad=pad))
            add(model_tmp, bn(num_channels_up[i]))
            add(model_tmp, act(act_fun))
        input_depth = num_channels_down[i]
        model_tmp = deeper_main
    add(model, conv(num_channels_up[0], num_output_channels, 1, bias=need_bias, pad=pad))
    if need_sigmoid:
        add(model, nn.Sigmoid())
    return model


def get_net(input_depth: int, NET_TYPE: str, pad: str, upsample_mode: str, n_channels: int = 3,
            act_fun: str = "LeakyReLU", skip_n33d: int = 128, skip_n33u: int = 128, skip_n11: int = 4,
            num_scales: int = 5) -> nn.Sequential:  # fmt: skip
    assert NET_TYPE == "skip"
    return skip(input_depth, n_channels, num_channels_down=[skip_n33d] * num_scales,
                num_channels_up=[skip_n33u] * num_scales, num_channels_skip=[skip_n11] * num_scales,
                upsample_mode=upsample_mode, need_sigmoid=True, need_bias=True, pad=pad, act_fun=act_fun)  # fmt: skip


# --------------------------------------------------------------------------- utils


@functools.lru_cache(maxsize=1)
def _clean_image() -> np.ndarray:
    """The stand-in for F16_GT.png: a 64x64 RGB crop of scikit-learn's china.jpg, C x H x W in [0, 1]."""
    from sklearn.datasets import load_sample_image

    img = load_sample_image("china.jpg")  # (427, 640, 3) uint8
    top, left = (img.shape[0] - 384) // 2, (img.shape[1] - 384) // 2
    crop = torch.from_numpy(img[top : top + 384, left : left + 384].astype(np.float32) / 255.0).permute(2, 0, 1)
    return F.interpolate(crop[None], size=(imsize, imsize), mode="area")[0].numpy().astype(np.float32)


def get_noisy_image(img_np: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(img_np + rng.normal(scale=sigma, size=img_np.shape), 0, 1).astype(np.float32)


def get_noise(input_depth: int, method: str, spatial_size: tuple[int, int], var: float = 1.0 / 10) -> torch.Tensor:
    assert method == "noise"
    net_input = torch.zeros([1, input_depth, spatial_size[0], spatial_size[1]])
    net_input.uniform_()
    net_input *= var
    return net_input


def get_params(opt_over: str, net: nn.Module, net_input: torch.Tensor) -> list[torch.Tensor]:
    params: list[torch.Tensor] = []
    for opt in opt_over.split(","):
        if opt == "net":
            params += list(net.parameters())
        elif opt == "input":
            net_input.requires_grad = True
            params += [net_input]
        else:
            raise AssertionError("what is it?")
    return params


def np_to_torch(img_np: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(img_np)[None, :]


def compare_psnr(im_true: np.ndarray, im_test: np.ndarray) -> float:
    """skimage's compare_psnr on float images in [0, 1] (data range 1)."""
    mse = float(np.mean((im_true.astype(np.float64) - im_test.astype(np.float64)) ** 2))
    return 10 * np.log10(1.0 / mse)


def optimize(optimizer_type: str, parameters: list[torch.Tensor], closure, LR: float, num_iter: int,
             nx: Nndx, net: nn.Module, monitors: list, zero_grad: bool = True):  # fmt: skip
    """utils' optimize for 'adam', with the author's Monitor made once the Adam exists."""
    assert optimizer_type == "adam"
    optimizer = torch.optim.Adam(parameters, lr=LR)
    mon = nx.monitor(net, optimizer, every=10)
    monitors.append(mon)
    for _j in range(num_iter):
        if zero_grad:
            optimizer.zero_grad()
        total_loss = closure()
        optimizer.step()
        nx.timed(lambda: mon.log(total_loss))  # noqa: B023
    return optimizer, mon


# --------------------------------------------------------------------------- denoising.ipynb


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    img_np = _clean_image()
    img_noisy_np = get_noisy_image(img_np, sigma_, rng)
    lr = 0.1 if variant == "lr_too_high" else LR

    net = get_net(input_depth, "skip", pad, skip_n33d=16, skip_n33u=16, skip_n11=4, num_scales=5,
                  upsample_mode="bilinear")  # fmt: skip
    net_input = get_noise(input_depth, INPUT, (imsize, imsize)).detach()
    mse = torch.nn.MSELoss()
    img_noisy_torch = np_to_torch(img_noisy_np)
    img_torch = np_to_torch(img_np)

    net_input_saved = net_input.detach().clone()
    noise = net_input.detach().clone()
    state = {"i": 0, "out_avg": None, "last_net": None, "psrn_noisy_last": 0.0, "net_input": net_input}
    history: dict[str, list[float]] = {"psnr_gt": [], "psnr_gt_sm": [], "fallbacks": []}

    def closure():
        if reg_noise_std > 0:
            state["net_input"] = net_input_saved + (noise.normal_() * reg_noise_std)
        out = net(state["net_input"])
        if state["out_avg"] is None:
            state["out_avg"] = out.detach()
        else:
            state["out_avg"] = state["out_avg"] * exp_weight + out.detach() * (1 - exp_weight)
        total_loss = mse(out, img_noisy_torch)
        total_loss.backward()

        out_np = out.detach().numpy()[0]
        psrn_noisy = compare_psnr(img_noisy_np, out_np)
        psrn_gt = compare_psnr(img_np, out_np)
        psrn_gt_sm = compare_psnr(img_np, state["out_avg"].numpy()[0])
        history["psnr_gt"].append(psrn_gt)
        history["psnr_gt_sm"].append(psrn_gt_sm)
        i = state["i"]
        if i % show_every == 0:  # the notebook plots here; the author's nndx line logs the clean-image error
            gt_mse = F.mse_loss(out.detach(), img_torch).item()
            nx.timed(lambda: mon_holder[0].log(gt_mse, split="val") if mon_holder else None)
        if i % show_every:  # backtracking
            if psrn_noisy - state["psrn_noisy_last"] < -5:
                history["fallbacks"].append(i)
                for new_param, net_param in zip(state["last_net"], net.parameters()):
                    net_param.data.copy_(new_param)
                return total_loss * 0  # before the i += 1, as in the notebook
            state["last_net"] = [x.detach().clone() for x in net.parameters()]
            state["psrn_noisy_last"] = psrn_noisy
        state["i"] += 1
        return total_loss

    mon_holder: list = []
    nx.preflight(net, (net_input_saved, img_noisy_torch), mse)
    p = get_params(OPT_OVER, net, net_input)
    optimizer, mon = optimize(OPTIMIZER, p, closure, lr, num_iter, nx, net, mon_holder,
                              zero_grad=variant != "zero_grad_dropped")  # fmt: skip

    nx.finish(mon, net, (net_input_saved, img_noisy_torch), mse, optimizer=optimizer)

    with torch.no_grad():  # the notebook's last cell: net(net_input), the last perturbed input, train mode
        out_final = net(state["net_input"])
    return {
        "psnr_gt_sm": history["psnr_gt_sm"][-1],
        "psnr_gt_final": compare_psnr(img_np, out_final.numpy()[0]),
        "psnr_gt_best": max(history["psnr_gt"]),
        "psnr_noisy_input": compare_psnr(img_np, img_noisy_np),
        "fallbacks": float(len(history["fallbacks"])),
    }
