"""Port of ermongroup/ncsn (Song & Ermon 2019): a noise-conditional score network trained
by denoising score matching over a geometric ladder of noise levels, sampled by annealed
Langevin dynamics.

Source: github.com/ermongroup/ncsn, ``runners/anneal_runner.py``, ``losses/dsm.py``
(``anneal_dsm_score_estimation``), ``models/cond_refinenet_dilated.py`` and
``configs/anneal.yml`` at commit 7f27f4a16471d20a0af3be8b8b4c2ec57c8a0bc1 (GPL-3.0,
Copyright (c) 2019 Yang Song). Written anew from the facts of those files; no code copied.

Kept: ``anneal_dsm_score_estimation``: ``used_sigmas = sigmas[labels]`` broadcast over the
image, ``perturbed = X + randn_like(X) * used_sigmas``, the target ``-(perturbed - X) /
used_sigmas ** 2``, the scores of ``scorenet(perturbed, labels)``, both flattened, the loss
``1/2 * sum((scores - target) ** 2, -1) * used_sigmas ** anneal_power`` averaged over the
batch, ``anneal_power = 2``; the sigmas ``exp(linspace(log(sigma_begin), log(sigma_end),
num_classes))`` with 1 -> 0.01 over 10 levels; ``AnnealRunner.train``: ``ToTensor`` pixels,
a shuffled loader, the dequantisation ``X / 256 * 255 + rand_like(X) / 256``, labels
``randint(0, len(sigmas))`` per image, ``optimizer.zero_grad()`` / ``loss.backward()`` /
``optimizer.step()``, the loss logged every step, every 100 steps a test batch (shuffled
test loader, ``drop_last``, the iterator restarted when spent) scored in ``score.eval()``
under ``no_grad`` as ``test_dsm_loss``, training stopped at ``n_iters``; the optimizer
``Adam(lr=1e-3, weight_decay=0, betas=(0.9, 0.999), amsgrad=False)``; the network's parts:
``ConditionalInstanceNorm2dPlus`` (per-channel means normalised across channels, instance
norm without affine, an ``Embedding(num_classes, 3 * C)`` giving gamma, alpha ~ N(1, 0.02)
and beta = 0: ``gamma * (h + alpha * means) + beta``), ``ConditionalResidualBlock``
(norm -> ELU -> conv3x3 -> norm -> ELU -> conv3x3, plus the shortcut), ``begin_conv``, the
final normalizer + ELU + ``end_conv``, and the input map ``2 * x - 1`` (no logit
transform); ``anneal_Langevin_dynamics`` (for each sigma, ``step_size = step_lr * (sigma /
sigmas[-1]) ** 2``, ``n_steps_each`` steps of ``x + step_size * score(x, c) +
sqrt(2 * step_size) * randn``, from uniform noise; the images kept clamped to [0, 1]).
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of 28x28 MNIST; the
RefineNet's dilated down-sampling stages and refine blocks replaced by two conditional
residual blocks at full resolution (8x8 has nothing to down-sample), ``ngf`` 16 instead of
64; batch 64 instead of 128; 400 iterations instead of 200,001; Langevin with
``n_steps_each`` 30 instead of 100 and ``step_lr`` 2e-4 instead of 2e-5 (ten times the step
for a third of the steps), on 64 samples; no tensorboard, no checkpoints.
Measure only (not in the program): the DSM loss (``anneal_power = 2``, the paper's
weighting) on all 360 held-out digits at fixed draws of noise and levels, eval mode; 64
Langevin samples read by a logistic regression trained on the train digits (mean
top-class probability, ``sample_confidence``) and each sample's distance to its nearest
held-out digit per pixel (``sample_nearest_real``), both in [0, 1] pixel units.

nndx, as the author would add it: the loss needs the noise and the levels, so the batch
the author hands nndx is one drawn as the loop draws it, ``((perturbed, labels), (target,
used_sigmas))`` from the first training batch, and ``loss_fn`` is the last two lines of
``anneal_dsm_score_estimation`` as a function of the scores; a preflight ``nndx.probe`` of
the score network with the optimizer, ``nndx.Monitor(score, optimizer)`` around the loop,
each step's loss logged and each ``test_dsm_loss`` logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "ncsn"
SOURCE = Source("ermongroup/ncsn", "runners/anneal_runner.py", "7f27f4a16471d20a0af3be8b8b4c2ec57c8a0bc1", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (configs/anneal.yml, MNIST settings)"),
        Variant(
            "pixels_not_scaled",
            "the images handed to the loop as raw 0..255 pixels (ToTensor's division by 255 lost, e.g. a "
            "custom Dataset returning uint8 arrays as float): the sigma ladder 1 -> 0.01 is negligible "
            "against the data's range and the sampler's uniform [0, 1] start is far from the data",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/lucidrains/denoising-diffusion-pytorch/issues/20",
             "https://github.com/yang-song/score_sde_pytorch/issues/12",
             "https://github.com/crowsonkb/k-diffusion/issues/10"),
            Measure("heldout_dsm_loss", "held-out DSM loss (sigma^2 weighting, fixed draws, eval mode; the "
                    "zero score scores 32 at any data scale) 1.5x the healthy run's or more: 32.1 (nothing "
                    "learnt) against 16.4 healthy on seed 0 (samples 0.39 from the nearest digit against 0.28)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "no_sigma_weighting",
            "anneal_dsm_score_estimation called with anneal_power=0 (the lambda(sigma) = sigma^2 weighting "
            "dropped): the terms of the smallest sigma, ~1/sigma^2 = 10^4 times larger, dominate the loss and "
            "the large-sigma scores are barely fit",
            (C.WRONG_LOSS,),
            ("https://github.com/chenlin9/high_order_dsm/issues/1",
             "https://github.com/jychoi118/P2-weighting/issues/5",
             "https://github.com/mila-iqia/diffusion_for_multi_scale_molecular_dynamics/pull/60"),
            Measure("sample_nearest_real", "Langevin samples at least 1.5x farther (per pixel) from their nearest "
                    "held-out digit than the healthy run's: 0.60 against 0.28 on seed 0 (held-out sigma^2-weighted "
                    "DSM loss 22.0 against 16.4)",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

CONFIG = {"batch_size": 64, "n_iters": 400, "anneal_power": 2.0, "sigma_begin": 1.0, "sigma_end": 0.01,
          "num_classes": 10, "ngf": 16, "lr": 1e-3, "beta1": 0.9, "weight_decay": 0.0, "test_freq": 100}  # fmt: skip
N_STEPS_EACH, STEP_LR, N_SAMPLES = 30, 2e-4, 64


# --------------------------------------------------------------------------- losses/dsm.py


def anneal_dsm_score_estimation(scorenet, samples, labels, sigmas, anneal_power=2.0):
    used_sigmas = sigmas[labels].view(samples.shape[0], *([1] * len(samples.shape[1:])))
    perturbed_samples = samples + torch.randn_like(samples) * used_sigmas
    target = -1 / (used_sigmas**2) * (perturbed_samples - samples)
    scores = scorenet(perturbed_samples, labels)
    return dsm_on_scores(scores, (target, used_sigmas), anneal_power)


def dsm_on_scores(scores, targets, anneal_power=2.0):
    """The loss's last lines: flattened scores against the target, weighted by sigma ** power."""
    target, used_sigmas = targets
    target = target.view(target.shape[0], -1)
    scores = scores.view(scores.shape[0], -1)
    loss = 1 / 2.0 * ((scores - target) ** 2).sum(dim=-1) * used_sigmas.squeeze() ** anneal_power
    return loss.mean(dim=0)


# --------------------------------------------------------------------------- models/cond_refinenet_dilated.py


class ConditionalInstanceNorm2dPlus(nn.Module):
    def __init__(self, num_features: int, num_classes: int, bias: bool = True) -> None:
        super().__init__()
        self.num_features, self.bias = num_features, bias
        self.instance_norm = nn.InstanceNorm2d(num_features, affine=False, track_running_stats=False)
        self.embed = nn.Embedding(num_classes, num_features * 3)
        self.embed.weight.data[:, : 2 * num_features].normal_(1, 0.02)  # gamma and alpha ~ N(1, 0.02)
        self.embed.weight.data[:, 2 * num_features :].zero_()  # beta = 0

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        means = torch.mean(x, dim=(2, 3))
        m = torch.mean(means, dim=-1, keepdim=True)
        v = torch.var(means, dim=-1, keepdim=True)
        means = (means - m) / torch.sqrt(v + 1e-5)
        h = self.instance_norm(x)
        gamma, alpha, beta = self.embed(y).chunk(3, dim=-1)
        h = h + means[..., None, None] * alpha[..., None, None]
        return gamma.view(-1, self.num_features, 1, 1) * h + beta.view(-1, self.num_features, 1, 1)


class ConditionalResidualBlock(nn.Module):
    """The ``resample=None``, no-dilation branch: two 3x3 convolutions, a 3x3 conv shortcut
    when the width changes."""

    def __init__(self, input_dim: int, output_dim: int, num_classes: int, act: nn.Module,
                 normalization=ConditionalInstanceNorm2dPlus) -> None:  # fmt: skip
        super().__init__()
        self.non_linearity = act
        self.input_dim, self.output_dim = input_dim, output_dim
        self.conv1 = nn.Conv2d(input_dim, output_dim, kernel_size=3, stride=1, padding=1)
        self.normalize2 = normalization(output_dim, num_classes)
        self.conv2 = nn.Conv2d(output_dim, output_dim, kernel_size=3, stride=1, padding=1)
        if output_dim != input_dim:
            self.shortcut = nn.Conv2d(input_dim, output_dim, kernel_size=3, padding=1)
        self.normalize1 = normalization(input_dim, num_classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        output = self.conv1(self.non_linearity(self.normalize1(x, y)))
        output = self.conv2(self.non_linearity(self.normalize2(output, y)))
        shortcut = x if self.output_dim == self.input_dim else self.shortcut(x)
        return shortcut + output


class CondRefineNetDilated(nn.Module):
    """Shrunk: begin_conv, the two full-resolution residual blocks (``res1``), the final
    normalizer, ELU and end_conv."""

    def __init__(self, channels: int, ngf: int, num_classes: int) -> None:
        super().__init__()
        self.norm = ConditionalInstanceNorm2dPlus
        self.act = act = nn.ELU()
        self.begin_conv = nn.Conv2d(channels, ngf, 3, stride=1, padding=1)
        self.normalizer = self.norm(ngf, num_classes)
        self.end_conv = nn.Conv2d(ngf, channels, 3, stride=1, padding=1)
        self.res1 = nn.ModuleList([ConditionalResidualBlock(ngf, ngf, num_classes, act, self.norm),
                                   ConditionalResidualBlock(ngf, ngf, num_classes, act, self.norm)])  # fmt: skip

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = 2 * x - 1.0  # logit_transform is false
        output = self.begin_conv(x)
        for m in self.res1:
            output = m(output, y)
        output = self.act(self.normalizer(output, y))
        return self.end_conv(output)


# --------------------------------------------------------------------------- runners/anneal_runner.py


@torch.no_grad()
def anneal_Langevin_dynamics(x_mod, scorenet, sigmas, n_steps_each=100, step_lr=0.00002, generator=None):
    images = []
    for c, sigma in enumerate(sigmas):
        labels = (torch.ones(x_mod.shape[0]) * c).long()
        step_size = step_lr * (sigma / sigmas[-1]) ** 2
        for _ in range(n_steps_each):
            images.append(torch.clamp(x_mod, 0.0, 1.0))
            noise = torch.randn(x_mod.shape, generator=generator) * np.sqrt(step_size * 2)
            grad = scorenet(x_mod, labels)
            x_mod = x_mod + step_size * grad + noise
    images.append(torch.clamp(x_mod, 0.0, 1.0))
    return images, x_mod


def to_pixels(raw: torch.Tensor, variant: str) -> torch.Tensor:
    """``transforms.ToTensor()``; the bug keeps the 0..255 values."""
    return raw.unsqueeze(1).float() if variant == "pixels_not_scaled" else data.to_tensor(raw)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    cfg = dict(CONFIG)
    if variant == "no_sigma_weighting":
        cfg["anneal_power"] = 0.0
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    dataset = TensorDataset(to_pixels(train_images, variant), train_labels)
    test_dataset = TensorDataset(to_pixels(test_images, variant), test_labels)
    dataloader = DataLoader(dataset, batch_size=cfg["batch_size"], shuffle=True,
                            generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_loader = DataLoader(test_dataset, batch_size=cfg["batch_size"], shuffle=True, drop_last=True,
                             generator=torch.Generator().manual_seed(seed + 1))  # fmt: skip
    test_iter = iter(test_loader)

    score = CondRefineNetDilated(1, cfg["ngf"], cfg["num_classes"])
    optimizer = torch.optim.Adam(score.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                                 betas=(cfg["beta1"], 0.999), amsgrad=False)  # fmt: skip
    sigmas = torch.tensor(np.exp(np.linspace(np.log(cfg["sigma_begin"]), np.log(cfg["sigma_end"]),
                                             cfg["num_classes"]))).float()  # fmt: skip

    def loss_fn(scores: torch.Tensor, targets) -> torch.Tensor:
        return dsm_on_scores(scores, targets, cfg["anneal_power"])

    # the probe batch: the first training batch, perturbed as the loop perturbs it
    g = torch.Generator().manual_seed(seed + 3)
    X0 = dataset.tensors[0][: cfg["batch_size"]]
    X0 = X0 / 256.0 * 255.0 + torch.rand(X0.shape, generator=g) / 256.0
    labels0 = torch.randint(0, len(sigmas), (X0.shape[0],), generator=g)
    used0 = sigmas[labels0].view(-1, 1, 1, 1)
    perturbed0 = X0 + torch.randn(X0.shape, generator=g) * used0
    probe_batch = ((perturbed0, labels0), (-1 / used0**2 * (perturbed0 - X0), used0))
    nx.preflight(score, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(score, optimizer, every=10)

    step, losses, test_losses = 0, [], []
    done = False
    while not done:  # for epoch in range(n_epochs)
        for X, _y in dataloader:
            step += 1
            score.train()
            X = X / 256.0 * 255.0 + torch.rand_like(X) / 256.0
            labels = torch.randint(0, len(sigmas), (X.shape[0],))
            loss = anneal_dsm_score_estimation(score, X, labels, sigmas, cfg["anneal_power"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss)
            losses.append(loss.item())
            if step >= cfg["n_iters"]:
                done = True
                break
            if step % cfg["test_freq"] == 0:
                score.eval()
                try:
                    test_X, _ = next(test_iter)
                except StopIteration:
                    test_iter = iter(test_loader)
                    test_X, _ = next(test_iter)
                test_X = test_X / 256.0 * 255.0 + torch.rand_like(test_X) / 256.0
                test_labels = torch.randint(0, len(sigmas), (test_X.shape[0],))
                with torch.no_grad():
                    test_dsm_loss = anneal_dsm_score_estimation(score, test_X, test_labels, sigmas,
                                                                cfg["anneal_power"])  # fmt: skip
                mon.log(test_dsm_loss.item(), split="val")
                test_losses.append(test_dsm_loss.item())

    nx.finish(mon, score, probe_batch, loss_fn, optimizer=optimizer)
    return {"last_loss": float(np.mean(losses[-20:])), "last_test_dsm_loss": test_losses[-1],
            **measure(score, sigmas, train_images, train_labels, test_images, variant, seed)}  # fmt: skip


@torch.no_grad()
def measure(score, sigmas, train_images, train_labels, test_images, variant: str, seed: int) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression

    score.eval()
    g = torch.Generator().manual_seed(seed + 7)
    X = to_pixels(test_images, variant)
    X = X / 256.0 * 255.0 + torch.rand(X.shape, generator=g) / 256.0
    labels = torch.randint(0, len(sigmas), (X.shape[0],), generator=g)
    used = sigmas[labels].view(-1, 1, 1, 1)
    perturbed = X + torch.randn(X.shape, generator=g) * used
    heldout = float(dsm_on_scores(score(perturbed, labels), (-1 / used**2 * (perturbed - X), used), 2.0))

    start = torch.rand(N_SAMPLES, 1, 8, 8, generator=g)
    _, final = anneal_Langevin_dynamics(start, score, sigmas.tolist(), N_STEPS_EACH, STEP_LR, generator=g)
    scale = 255.0 if variant == "pixels_not_scaled" else 1.0
    samples = (final / scale).clamp(0, 1).flatten(1)
    real = data.to_tensor(test_images).flatten(1)
    nearest = float(torch.cdist(samples, real).min(1).values.mean() / 8.0)
    clf = LogisticRegression(max_iter=500).fit(data.to_tensor(train_images).flatten(1).numpy(), train_labels.numpy())
    confidence = float(clf.predict_proba(samples.numpy()).max(1).mean())
    return {"heldout_dsm_loss": heldout, "sample_nearest_real": nearest, "sample_confidence": confidence}
