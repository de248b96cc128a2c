"""Port of cloneofsimo's minDiffusion ``superminddpm.py``: a minimal DDPM (noise-prediction
MSE, a conv net that ignores the timestep, a linear beta schedule).

Source: github.com/cloneofsimo/minDiffusion, ``superminddpm.py`` at commit
a960adb696a242e0da1797a6253a755cfb1e9399 (the file's newest version; the repository's
HEAD is 00a3c8066d25a34d3d472ef6c87c7b6b238ea444). The repository states no licence.
Written anew from the facts of that file; no code copied.

Kept: ``ddpm_schedules(beta1, beta2, T)``: ``beta_t`` linear over ``arange(0, T + 1) / T``,
``alpha_t = 1 - beta_t``, ``alphabar_t`` as the exp of the cumulative sum of
``log(alpha_t)``, and the derived ``sqrtab``, ``sqrtmab``, ``oneover_sqrta``,
``sqrt_beta_t``, ``mab_over_sqrtmab``, each registered as a buffer of ``DDPM``; ``blk`` a
lambda building ``Conv2d(ic, oc, 7, padding=3)`` -> ``BatchNorm2d`` -> ``LeakyReLU()``;
``DummyEpsModel``: seven ``blk`` widening then narrowing, then ``Conv2d(.., n_channel, 3,
padding=1)``, ``forward(x, t)`` ignoring ``t``; ``DDPM.forward(x)``: ``_ts ~ randint(1,
n_T)``, ``eps = randn_like(x)``, ``x_t = sqrtab[_ts] * x + sqrtmab[_ts] * eps``, returns
``criterion(eps, eps_model(x_t, _ts / n_T))`` with ``criterion = nn.MSELoss()`` (the model
returns its own loss); ``DDPM.sample`` (Algorithm 2, ``z = 0`` at the last step);
``transforms.Normalize((0.5,), (1.0))`` after ``ToTensor`` (pixels in [-0.5, 0.5], as the
author wrote it); a shuffled ``DataLoader``; ``Adam(lr=2e-4)``; each epoch ``ddpm.train()``,
the loop ``optim.zero_grad()``, ``loss = ddpm(x)``, ``loss.backward()``, the loss EMA
(0.9 / 0.1) shown in the progress bar, ``optim.step()``; then ``ddpm.eval()`` and, under
``torch.no_grad()``, ``ddpm.sample(16, ...)`` (saved as an image grid in the original).
Shrunk: scikit-learn's 8x8 digits (1,437 training images) instead of 28x28 MNIST; the
widths 4-8-16-32-16-8-4 instead of 64-128-256-512-256-128-64; batch 32 instead of 128;
``n_T`` 200 instead of 1,000 with the betas scaled by the same factor 5, (5e-4, 0.1)
instead of (1e-4, 0.02), so the schedule still ends near pure noise (alphabar_T 3e-5
against 4e-5) and the per-epoch sampling costs 200 forwards; 6 epochs (270 steps) instead
of 100 (46,900 steps), at lr 2e-3 instead of 2e-4 (at 2e-4 the shrunk run leaves the
held-out MSE at 0.48, against 0.15 at 2e-3, seed 0).
Measure only (not in the program): the noise-prediction MSE on the 360 held-out digits at
fixed draws of ``t`` and ``eps``, the model in eval mode as when it samples; 64 samples
of the trained model against the real digits (both as [0, 1] pixels).

nndx, as the author would add it: ``DDPM`` returns its loss, so ``loss_fn`` is
``lambda loss, _: loss`` (the loader's labels ride along as the unused targets, as in
``for x, _ in dataloader``); a preflight ``nndx.probe(ddpm, first_batch, ...)`` with the
optimizer, ``nndx.Monitor(ddpm, optim)`` around the epochs, each step's loss logged (the
program has no validation loss); then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ddpm"
SOURCE = Source("cloneofsimo/minDiffusion", "superminddpm.py", "a960adb696a242e0da1797a6253a755cfb1e9399",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "no_zero_grad",
            "optim.zero_grad() left out of the loop: every step's gradient is the sum of all the gradients so far "
            "(Adam then steps along that running sum)",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/salesforce/corr_based_prediction/issues/1",
             "https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/tenstorrent/tt-blacksmith/pull/711"),
            Measure("heldout_eps_mse", "held-out noise-prediction MSE (eval mode, fixed t and eps), 1.2x the "
                    "healthy run's or more: 0.97/0.98/0.80 against 0.15/0.17/0.18 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < 1.2 * healthy),
        ),
        Variant(
            "pixels_not_scaled",
            "the images built from the raw 0..255 pixels without ToTensor's division by 255 (then Normalize((0.5,), "
            "(1.0)) as before): x in [-0.5, 254.5], so the added noise is tiny against the signal",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/lucidrains/denoising-diffusion-pytorch/issues/20",
             "https://github.com/mks0601/3DMPPE_POSENET_RELEASE/issues/69",
             "https://github.com/www0wwwjs1/Matrix-Capsules-EM-Tensorflow/issues/51"),
            Measure("heldout_eps_mse", "held-out noise-prediction MSE (eval mode, fixed t and eps), 1.5x the "
                    "healthy run's or more: 0.99/1.00/1.00 (the noise is not predicted at all) against "
                    "0.15/0.17/0.18 healthy on seeds 0-2",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

n_T = 200
betas = (5e-4, 0.1)  # (1e-4, 0.02) at n_T = 1000, scaled with n_T
WIDTHS = (4, 8, 16, 32, 16, 8, 4)
batch_size = 32
n_epoch = 6
lr = 2e-3  # 2e-4 in the original: at 270 steps instead of 47,000 it leaves the held-out MSE at 0.48 (0.15 at 2e-3)
n_sample = 16
N_MEASURE_SAMPLES = 64


def ddpm_schedules(beta1: float, beta2: float, T: int) -> dict[str, torch.Tensor]:
    """The DDPM schedules, indexed 0..T, precomputed for training and sampling."""
    assert beta1 < beta2 < 1.0, "beta1 and beta2 must be in (0, 1)"
    beta_t = (beta2 - beta1) * torch.arange(0, T + 1, dtype=torch.float32) / T + beta1
    alpha_t = 1 - beta_t
    alphabar_t = torch.cumsum(torch.log(alpha_t), dim=0).exp()
    sqrtmab = torch.sqrt(1 - alphabar_t)
    return {
        "alpha_t": alpha_t,
        "oneover_sqrta": 1 / torch.sqrt(alpha_t),
        "sqrt_beta_t": torch.sqrt(beta_t),
        "alphabar_t": alphabar_t,
        "sqrtab": torch.sqrt(alphabar_t),
        "sqrtmab": sqrtmab,
        "mab_over_sqrtmab": (1 - alpha_t) / sqrtmab,
    }


blk = lambda ic, oc: nn.Sequential(nn.Conv2d(ic, oc, 7, padding=3), nn.BatchNorm2d(oc), nn.LeakyReLU())  # noqa: E731


class DummyEpsModel(nn.Module):
    """Any R^n -> R^n network will do (the original's own words, more or less): a stack of
    convolution blocks that does not look at t."""

    def __init__(self, n_channel: int) -> None:
        super().__init__()
        widths = (n_channel, *WIDTHS)
        self.conv = nn.Sequential(*[blk(a, b) for a, b in zip(widths[:-1], widths[1:])],
                                  nn.Conv2d(WIDTHS[-1], n_channel, 3, padding=1))  # fmt: skip

    def forward(self, x: torch.Tensor, t) -> torch.Tensor:
        return self.conv(x)


class DDPM(nn.Module):
    def __init__(self, eps_model: nn.Module, betas: tuple[float, float], n_T: int,
                 criterion: nn.Module = nn.MSELoss()) -> None:  # fmt: skip
        super().__init__()
        self.eps_model = eps_model
        for k, v in ddpm_schedules(betas[0], betas[1], n_T).items():
            self.register_buffer(k, v)
        self.n_T = n_T
        self.criterion = criterion

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Algorithm 1: noise x to a random step t and score the network's guess of the noise."""
        _ts = torch.randint(1, self.n_T, (x.shape[0],)).to(x.device)
        eps = torch.randn_like(x)
        x_t = self.sqrtab[_ts, None, None, None] * x + self.sqrtmab[_ts, None, None, None] * eps
        return self.criterion(eps, self.eps_model(x_t, _ts / self.n_T))

    def sample(self, n_sample: int, size, device, generator: torch.Generator | None = None) -> torch.Tensor:
        """Algorithm 2, from x_T ~ N(0, I) down to x_0."""
        x_i = torch.randn(n_sample, *size, generator=generator).to(device)
        for i in range(self.n_T, 0, -1):
            z = torch.randn(n_sample, *size, generator=generator).to(device) if i > 1 else 0
            eps = self.eps_model(x_i, i / self.n_T)
            x_i = self.oneover_sqrta[i] * (x_i - eps * self.mab_over_sqrtmab[i]) + self.sqrt_beta_t[i] * z
        return x_i


def transform(raw: torch.Tensor, variant: str) -> torch.Tensor:
    """``ToTensor`` then ``Normalize((0.5,), (1.0))``; the bug skips ToTensor's scaling."""
    x = raw.unsqueeze(1).float() if variant == "pixels_not_scaled" else data.to_tensor(raw)
    return (x - 0.5) / 1.0


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    train_images, train_labels, test_images, _ = data.digit_images(seed=seed)
    dataset = TensorDataset(transform(train_images, variant), train_labels)
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))

    ddpm = DDPM(eps_model=DummyEpsModel(1), betas=betas, n_T=n_T)
    optim = torch.optim.Adam(ddpm.parameters(), lr=lr)

    def loss_fn(loss: torch.Tensor, _labels: torch.Tensor) -> torch.Tensor:
        return loss  # DDPM.forward returns the loss itself

    first_batch = next(iter(DataLoader(dataset, batch_size=batch_size)))
    nx.preflight(ddpm, first_batch, loss_fn, optimizer=optim)
    mon = nx.monitor(ddpm, optim, every=10)

    sample_rng = torch.Generator().manual_seed(seed + 1)
    losses: list[float] = []
    for i in range(n_epoch):
        ddpm.train()
        loss_ema = None
        for x, _ in dataloader:
            if variant != "no_zero_grad":
                optim.zero_grad()
            loss = ddpm(x)
            loss.backward()
            loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
            optim.step()
            mon.log(loss)
            losses.append(loss.item())
        ddpm.eval()
        with torch.no_grad():
            xh = ddpm.sample(n_sample, (1, 8, 8), "cpu", generator=sample_rng)  # saved as a grid in the original

    nx.finish(mon, ddpm, first_batch, loss_fn, optimizer=optim)
    return {"last_loss_ema": loss_ema, "last_sample_std": float(xh.std()), **measure(ddpm, test_images, variant, seed)}


@torch.no_grad()
def measure(ddpm: DDPM, test_images: torch.Tensor, variant: str, seed: int) -> dict[str, float]:
    """Held-out noise-prediction MSE at fixed draws (eval mode, as when sampling), and 64
    samples against the real digits, both mapped back to [0, 1] pixels."""
    ddpm.eval()
    rng = torch.Generator().manual_seed(seed + 2)
    x = transform(test_images, variant)
    ts = torch.randint(1, ddpm.n_T, (len(x),), generator=rng)
    eps = torch.randn(x.shape, generator=rng)
    x_t = ddpm.sqrtab[ts, None, None, None] * x + ddpm.sqrtmab[ts, None, None, None] * eps
    heldout = float(((ddpm.eps_model(x_t, ts / ddpm.n_T) - eps) ** 2).mean())
    scale = 255.0 if variant == "pixels_not_scaled" else 1.0
    samples = ((ddpm.sample(N_MEASURE_SAMPLES, (1, 8, 8), "cpu", generator=rng) + 0.5) / scale).clamp(0, 1)
    real = data.to_tensor(test_images)
    nearest = torch.cdist(samples.flatten(1), real.flatten(1)).min(1).values.mean() / 8.0
    return {
        "heldout_eps_mse": heldout,
        "sample_mean_gap": float((samples.mean(0) - real.mean(0)).abs().mean()),
        "sample_nearest_real": float(nearest),
    }
