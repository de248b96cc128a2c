"""Port of christiancosgrove's pytorch-spectral-normalization-gan: a DCGAN-like generator with
batch norm, a discriminator with spectral normalisation on every convolution and on its
linear layer, the hinge loss, five discriminator steps per generator step, Adam(2e-4,
betas (0.0, 0.9)) with an exponential learning-rate decay per epoch.

Source: github.com/christiancosgrove/pytorch-spectral-normalization-gan, ``main.py`` and
``model.py`` at commit 12dcf945a6359301d63d1e0da3708cd0f0590b19 (MIT, Copyright (c) 2017
Christian Cosgrove). Written anew from the facts of those files; no code copied.

Kept: ``Generator`` = ``ConvTranspose2d(z_dim, w, 4, stride=1)`` from ``z.view(-1, z_dim, 1,
1)``, then ``ConvTranspose2d(4, stride=2, padding=1)`` blocks halving the width, each followed
by ``BatchNorm2d`` and ``ReLU``, a last ``ConvTranspose2d(3, stride=1, padding=1)`` to the
image channels and ``Tanh``; ``Discriminator`` = seven convolutions alternating 3x3 stride 1
and 4x4 stride 2 (padding 1), each with ``LeakyReLU(0.1)``, then a ``Linear(w_g * w_g * C,
1)``, every one of them spectrally normalised (one power iteration per forward; here
``torch.nn.utils.spectral_norm``, whose ``u``/``v`` are buffers where the repository's own
``SpectralNorm`` wrapper made them parameters without gradient); the discriminator's
optimizer built over ``filter(lambda p: p.requires_grad, D.parameters())``; ``Adam(lr=2e-4,
betas=(0.0, 0.9))`` for both; ``ExponentialLR(gamma=0.99)`` for both, stepped once per epoch
after the batch loop; ``disc_iters = 5``; batches of 64, the partial last batch skipped;
images through ``ToTensor`` + ``Normalize(0.5, 0.5)``; per batch, five times: a fresh ``z``,
``optim_disc.zero_grad()``, ``optim_gen.zero_grad()``, the hinge loss
``relu(1 - D(x)).mean() + relu(1 + D(G(z))).mean()`` (``G(z)`` not detached), backward,
``optim_disc.step()``; then a fresh ``z``, both ``zero_grad``, ``gen_loss = -D(G(z)).mean()``,
backward, ``optim_gen.step()``; the samples of a fixed ``z`` drawn from the generator in
training mode (the program never calls ``eval()``).
Shrunk: scikit-learn's 8x8 digits, one channel, instead of 32x32 CIFAR-10; ``Z_dim`` 32
instead of 128; generator widths 64-32 (two up-sampling blocks fewer: 1 -> 4 -> 8) instead of
512-256-128-64; five discriminator convolutions (3x3, 4x4/2, 3x3, 4x4/2, 3x3) of widths
8-8-16-16-32 instead of seven of 64-64-128-128-256-256-512, ``w_g`` 2; 8 epochs of 28 batches
instead of 2,000 of 781. No image files, plots or checkpoints.
Measure only (not in the program): a small CNN classifier trained on the fly on the real
8x8 digits (the same for every variant of a seed); on 1,000 generated samples (training
mode, as the program samples) an inception-score-like number ``exp(E KL(p(y|x) || p(y)))``
(10 at most) and the Frechet distance between the classifier's penultimate features of the
samples and of the real digits.

nndx, as a GAN author would add it (like the WGAN-GP port): a preflight ``nndx.probe`` of the
discriminator, the one model with a loss of its own, on 32 real and 32 generated images with
the program's hinge loss written as ``loss_fn(score, is_real)``; one ``nndx.Monitor`` per
model/optimizer pair, ``disc_loss``/``gen_loss`` logged to them; after training
``nndx.probe(discriminator, ..., monitor=mon_disc)`` and the generator Monitor's report, each
diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn.utils import spectral_norm
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "sngan"
SOURCE = Source("christiancosgrove/pytorch-spectral-normalization-gan", "main.py",
                "12dcf945a6359301d63d1e0da3708cd0f0590b19", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits, narrow nets, 8 epochs)"),
        Variant(
            "scheduler_step_per_batch",
            "scheduler_d.step() and scheduler_g.step() moved into the batch loop: the ExponentialLR(0.99) meant "
            "per epoch decays per iteration, so the LR falls from 2e-4 to ~2e-5 over the run",
            (C.LR_SCHEDULE_MISUSE,),
            ("https://github.com/Lornatang/SRGAN-PyTorch/issues/1",
             "https://github.com/pytorch/vision/issues/1261",
             "https://github.com/pytorch/pytorch/issues/3814"),
            Measure("frechet", "Frechet distance in the digit classifier's feature space at least 1.5x the healthy "
                    "run's: 24.6 against 14.5 healthy on seed 0", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "gen_grads_never_zeroed",
            "the optim_gen.zero_grad() calls left out: the generator's .grad keeps summing every discriminator "
            "loss's gradient (G(z) is not detached there) and every earlier generator loss's",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557"),
            Measure("frechet", "Frechet distance in the digit classifier's feature space at least 1.5x the healthy "
                    "run's: 443.6 (inception-like score 1.02) against 14.5 (4.41) healthy on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

batch_size, lr = 64, 2e-4
Z_dim = 32
disc_iters = 5
EPOCHS = 8
channels, leak, w_g = 1, 0.1, 2
SIZE = 8
PROBE = 32
N_SAMPLES = 1000


# --------------------------------------------------------------------------- model.py


class Generator(nn.Module):
    def __init__(self, z_dim: int) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.model = nn.Sequential(
            nn.ConvTranspose2d(z_dim, 64, 4, stride=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 32, 4, stride=2, padding=(1, 1)), nn.BatchNorm2d(32), nn.ReLU(),
            nn.ConvTranspose2d(32, channels, 3, stride=1, padding=(1, 1)), nn.Tanh(),
        )  # fmt: skip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z.view(-1, self.z_dim, 1, 1))


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(channels, 8, 3, stride=1, padding=(1, 1)))
        self.conv2 = spectral_norm(nn.Conv2d(8, 8, 4, stride=2, padding=(1, 1)))
        self.conv3 = spectral_norm(nn.Conv2d(8, 16, 3, stride=1, padding=(1, 1)))
        self.conv4 = spectral_norm(nn.Conv2d(16, 16, 4, stride=2, padding=(1, 1)))
        self.conv5 = spectral_norm(nn.Conv2d(16, 32, 3, stride=1, padding=(1, 1)))
        self.fc = spectral_norm(nn.Linear(w_g * w_g * 32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4, self.conv5):
            m = nn.LeakyReLU(leak)(conv(m))
        return self.fc(m.view(-1, w_g * w_g * 32))


def hinge_disc_loss(score: torch.Tensor, is_real: torch.Tensor) -> torch.Tensor:
    """The program's discriminator loss on a mixed batch, as loss_fn(output, target)."""
    real, fake = is_real.view(-1) == 1, is_real.view(-1) == 0
    return nn.ReLU()(1.0 - score[real]).mean() + nn.ReLU()(1.0 + score[fake]).mean()


# --------------------------------------------------------------------------- main.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    images, labels, _, _ = digits.digit_images(seed=seed, test_size=0)
    real_01 = digits.to_tensor(images)  # ToTensor
    dataset = TensorDataset((real_01 - 0.5) / 0.5, labels)  # Normalize((0.5,), (0.5,))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))

    discriminator = Discriminator()
    generator = Generator(Z_dim)
    optim_disc = optim.Adam(filter(lambda p: p.requires_grad, discriminator.parameters()), lr=lr, betas=(0.0, 0.9))
    optim_gen = optim.Adam(generator.parameters(), lr=lr, betas=(0.0, 0.9))
    scheduler_d = optim.lr_scheduler.ExponentialLR(optim_disc, gamma=0.99)
    scheduler_g = optim.lr_scheduler.ExponentialLR(optim_gen, gamma=0.99)
    zero_gen = variant != "gen_grads_never_zeroed"
    per_batch = variant == "scheduler_step_per_batch"

    with torch.no_grad():  # the preflight batch: real digits and the untrained generator's samples
        probe_fake = generator(torch.randn(PROBE, Z_dim, generator=torch.Generator().manual_seed(seed + 1)))
    probe_batch = (torch.cat([dataset.tensors[0][:PROBE], probe_fake]),
                   torch.cat([torch.ones(PROBE, 1), torch.zeros(PROBE, 1)]))  # fmt: skip
    nx.preflight(discriminator, probe_batch, hinge_disc_loss, optimizer=optim_disc)
    mon_disc = nx.monitor(discriminator, optim_disc, every=10)
    mon_gen = nx.monitor(generator, optim_gen, every=10)

    d_losses: list[float] = []
    g_losses: list[float] = []
    for epoch in range(EPOCHS):
        for batch_idx, (data, target) in enumerate(loader):
            if data.size()[0] != batch_size:
                continue
            # update the discriminator
            for _ in range(disc_iters):
                z = torch.randn(batch_size, Z_dim)
                optim_disc.zero_grad()
                if zero_gen:
                    optim_gen.zero_grad()
                disc_loss = (nn.ReLU()(1.0 - discriminator(data)).mean()
                             + nn.ReLU()(1.0 + discriminator(generator(z))).mean())  # fmt: skip
                disc_loss.backward()
                optim_disc.step()
                nx.timed(lambda: mon_disc.log(disc_loss))
            d_losses.append(disc_loss.item())

            z = torch.randn(batch_size, Z_dim)
            # update the generator
            optim_disc.zero_grad()
            if zero_gen:
                optim_gen.zero_grad()
            gen_loss = -discriminator(generator(z)).mean()
            gen_loss.backward()
            optim_gen.step()
            nx.timed(lambda: mon_gen.log(gen_loss))
            g_losses.append(gen_loss.item())
            if per_batch:
                scheduler_d.step()
                scheduler_g.step()
        if not per_batch:
            scheduler_d.step()
            scheduler_g.step()

    nx.finish(mon_disc, discriminator, probe_batch, hinge_disc_loss, optimizer=optim_disc)
    nx.finish(mon_gen)

    with torch.no_grad():  # samples as evaluate() draws them: the generator in training mode
        fake = generator(torch.randn(N_SAMPLES, Z_dim, generator=torch.Generator().manual_seed(seed + 2)))
    return {
        "late_disc_loss": float(np.mean(d_losses[-20:])),
        "late_gen_loss": float(np.mean(g_losses[-20:])),
        "final_lr": optim_gen.param_groups[0]["lr"],
        **measure(fake, seed),
    }


# --------------------------------------------------------------------------- measure only


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.features(x)
        return self.head(f), f


@functools.lru_cache(maxsize=4)
def _judge(seed: int) -> tuple[_Classifier, torch.Tensor, torch.Tensor, float]:
    """The classifier (trained on the real digits in [-1, 1]), the real features' mean and
    covariance, and its held-out accuracy."""
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1000)
        tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed + 1000, test_size=300)
        tr = (digits.to_tensor(tr_x) - 0.5) / 0.5
        te = (digits.to_tensor(te_x) - 0.5) / 0.5
        clf = _Classifier()
        opt = torch.optim.Adam(clf.parameters(), lr=2e-3)
        for _ in range(8):
            perm = torch.randperm(len(tr))
            for i in range(0, len(tr), 64):
                idx = perm[i : i + 64]
                opt.zero_grad()
                F.cross_entropy(clf(tr[idx])[0], tr_y[idx]).backward()
                opt.step()
        clf.eval()
        with torch.no_grad():
            acc = (clf(te)[0].argmax(1) == te_y).float().mean().item()
            feats = clf(torch.cat([tr, te]))[1].double()
        return clf, feats.mean(0), torch.cov(feats.T), acc


def _sqrtm_psd(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def measure(fake: torch.Tensor, seed: int) -> dict[str, float]:
    clf, mu_r, cov_r, acc = _judge(seed)
    with torch.no_grad():
        logits, f = clf(fake)
        p = F.softmax(logits.double(), dim=1)
        py = p.mean(0, keepdim=True)
        kl = (p * (torch.log(p + 1e-12) - torch.log(py + 1e-12))).sum(1).mean()
        f = f.double()
    mu_g, cov_g = f.mean(0).numpy(), torch.cov(f.T).numpy()
    mu_r, cov_r = mu_r.numpy(), cov_r.numpy()
    s = _sqrtm_psd(cov_r)
    covmean_trace = np.trace(_sqrtm_psd(s @ cov_g @ s))
    frechet = float(((mu_g - mu_r) ** 2).sum() + np.trace(cov_g) + np.trace(cov_r) - 2 * covmean_trace)
    return {
        "inception_score": float(torch.exp(kl)),
        "frechet": frechet,
        "classifier_acc": acc,
        "mean_confidence": float(p.max(1).values.mean()),
    }
