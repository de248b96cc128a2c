"""Port of MorvanZhou/PyTorch-Tutorial's 406_GAN.py: a GAN whose generator learns to paint
curves lying between two parabolas (the "famous artist" draws ``a x^2 + (a - 1)`` with ``a``
uniform on [1, 2]); a generator MLP and a discriminator MLP with a sigmoid output, two Adam
optimizers, the losses written by hand from ``prob_artist0`` / ``prob_artist1``.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/406_GAN.py`` at commit
dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written anew
from the facts of that file; no code copied.

Kept: ``BATCH_SIZE`` 64, ``LR_G`` = ``LR_D`` = 0.0001, ``N_IDEAS`` 5, ``ART_COMPONENTS`` 15,
``PAINT_POINTS`` (``linspace(-1, 1, 15)`` stacked 64 times, float64 numpy); ``artist_works``
(``a = np.random.uniform(1, 2, size=(64, 1))``, ``a * PAINT_POINTS**2 + (a - 1)``, then
``torch.from_numpy(...).float()``); ``G = Sequential(Linear(5, 128), ReLU, Linear(128, 15))``;
``D = Sequential(Linear(15, 128), ReLU, Linear(128, 1), Sigmoid)``; ``opt_D =
Adam(D.parameters(), lr=LR_D)``, ``opt_G = Adam(G.parameters(), lr=LR_G)``; the loop as
published since the torch-1.5 update: ``G_ideas = torch.randn(64, 5, requires_grad=True)``,
``G_paintings = G(G_ideas)``, ``prob_artist1 = D(G_paintings)``, ``G_loss =
torch.mean(torch.log(1. - prob_artist1))``, ``opt_G.zero_grad()``, ``G_loss.backward()``,
``opt_G.step()``; then ``prob_artist0 = D(artist_paintings)``, ``prob_artist1 =
D(G_paintings.detach())``, ``D_loss = - torch.mean(torch.log(prob_artist0) + torch.log(1. -
prob_artist1))``, ``opt_D.zero_grad()``, ``D_loss.backward(retain_graph=True)``,
``opt_D.step()``; every 50 steps the author's plot (the painting, "D accuracy" =
``prob_artist0.mean()`` and "D score" = ``-D_loss``).
Shrunk: 6,000 steps instead of 10,000; ``np.random.seed`` / ``torch.manual_seed`` set (the
file has them commented out); no matplotlib: at the plotting point the two numbers the author
draws are kept instead.
Measure only (not in the program): after training, 2,000 paintings from ``G`` on fresh ideas;
each painting is fitted (least squares) by the artist's family ``a x^2 + (a - 1)`` with ``a``
clipped to [1, 2]; ``paint_error`` is the mean squared residual of that fit, ``in_band`` the
fraction of points between the lower (``x^2``) and upper (``2 x^2 + 1``) bounds the author
plots, and ``d_real_prob`` the discriminator's mean probability on 2,000 real paintings.

nndx, as the author would add it: two models, two optimizers, so two Monitors:
``nndx.Monitor(G, opt_G)`` and ``nndx.Monitor(D, opt_D)``, each logging its loss where the
author plots (every 50 steps). The losses as (output, target) functions: the generator's
``mean(log(1 - D(paintings)))`` (target unused), the discriminator's author loss written over
a batch of real and fake paintings with targets 1 / 0 (``-mean(t log p + (1 - t) log(1 -
p))``). A preflight ``nndx.probe`` of each before the loop with its optimizer on the first
ideas / paintings, ``nndx.probe(..., monitor=mon)`` + ``nndx.diagnose`` of each after it; the
author reads both, ranked together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_gan"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/406_GAN.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "406_GAN.py as published (shrunk: 6,000 steps, seeded, no plots)"),
        Variant(
            "opt_D_over_G_params",
            "the discriminator's optimizer is built over G.parameters() (copy-paste of the opt_G line): "
            "opt_D.step() never moves D, so D stays at its random init and G learns to please a random critic",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/zhaoyuzhi/deepfillv2/pull/3",
             "https://github.com/bohaohuang/mrs/issues/68",
             "https://github.com/line/open-universe/issues/5",
             "https://github.com/wiseodd/controlled-text-generation/issues/15"),
            Measure("paint_error", "mean squared residual of the generated paintings to the artist's family at "
                    "least 3x the healthy run's", lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
        Variant(
            "no_zero_grad_D",
            "opt_D.zero_grad() left out: D's gradients accumulate over every step, and the generator's "
            "backward through D (G_loss.backward()) adds its opposite-signed gradient into them too",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25"),
            Measure("paint_error", "mean squared residual of the generated paintings to the artist's family at "
                    "least 3x the healthy run's", lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
    )
}

BATCH_SIZE, LR_G, LR_D, N_IDEAS, ART_COMPONENTS = 64, 0.0001, 0.0001, 5, 15
STEPS, PLOT_EVERY = 6000, 50
PAINT_POINTS = np.vstack([np.linspace(-1, 1, ART_COMPONENTS) for _ in range(BATCH_SIZE)])


def artist_works(n: int = BATCH_SIZE) -> torch.Tensor:
    points = PAINT_POINTS if n == BATCH_SIZE else np.vstack([PAINT_POINTS[0]] * n)
    a = np.random.uniform(1, 2, size=n)[:, np.newaxis]
    paintings = a * np.power(points, 2) + (a - 1)
    return torch.from_numpy(paintings).float()


def paint_quality(paintings: np.ndarray) -> tuple[float, float]:
    """(mean squared residual to the best a x^2 + (a - 1), a in [1, 2]; fraction of points in the band)."""
    x = PAINT_POINTS[0]
    basis = x**2 + 1.0  # y = a (x^2 + 1) - 1
    a = ((paintings + 1.0) @ basis) / (basis @ basis)
    a = np.clip(a, 1.0, 2.0)
    fit = a[:, None] * basis[None, :] - 1.0
    err = float(np.mean((paintings - fit) ** 2))
    lower, upper = x**2, 2 * x**2 + 1
    in_band = float(np.mean((paintings >= lower - 1e-6) & (paintings <= upper + 1e-6)))
    return err, in_band


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    np.random.seed(seed)

    G = nn.Sequential(nn.Linear(N_IDEAS, 128), nn.ReLU(), nn.Linear(128, ART_COMPONENTS))
    D = nn.Sequential(nn.Linear(ART_COMPONENTS, 128), nn.ReLU(), nn.Linear(128, 1), nn.Sigmoid())
    d_params = G.parameters() if variant == "opt_D_over_G_params" else D.parameters()
    opt_D = torch.optim.Adam(d_params, lr=LR_D)
    opt_G = torch.optim.Adam(G.parameters(), lr=LR_G)

    def g_loss_fn(paintings: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.log(1.0 - D(paintings)))

    def d_loss_fn(prob: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return -torch.mean(target * torch.log(prob) + (1.0 - target) * torch.log(1.0 - prob))

    with torch.random.fork_rng():  # the probe batches leave the program's random streams alone
        np_state = np.random.get_state()
        probe_ideas = torch.randn(BATCH_SIZE, N_IDEAS)
        probe_real = artist_works()
        np.random.set_state(np_state)
    with torch.no_grad():
        probe_fake = G(probe_ideas)
    g_batch = (probe_ideas, torch.zeros(BATCH_SIZE, 1))
    d_batch = (torch.cat([probe_real, probe_fake]), torch.cat([torch.ones(BATCH_SIZE, 1), torch.zeros(BATCH_SIZE, 1)]))
    nx.preflight(G, g_batch, g_loss_fn, optimizer=opt_G)
    nx.preflight(D, d_batch, d_loss_fn, optimizer=opt_D)
    mon_G = nx.monitor(G, opt_G, every=10)
    mon_D = nx.monitor(D, opt_D, every=10)

    d_accuracy = d_score = float("nan")
    for step in range(STEPS):
        artist_paintings = artist_works()  # real painting from artist
        G_ideas = torch.randn(BATCH_SIZE, N_IDEAS, requires_grad=True)  # random ideas
        G_paintings = G(G_ideas)  # fake painting from G (random ideas)
        prob_artist1 = D(G_paintings)  # D try to reduce this prob
        G_loss = torch.mean(torch.log(1.0 - prob_artist1))
        opt_G.zero_grad()
        G_loss.backward()
        opt_G.step()

        prob_artist0 = D(artist_paintings)  # D try to increase this prob
        prob_artist1 = D(G_paintings.detach())  # D try to reduce this prob
        D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
        if variant != "no_zero_grad_D":
            opt_D.zero_grad()
        D_loss.backward(retain_graph=True)  # reusing computational graph
        opt_D.step()

        if step % PLOT_EVERY == 0:  # plotting
            nx.timed(lambda: mon_G.log(G_loss))  # noqa: B023
            nx.timed(lambda: mon_D.log(D_loss))  # noqa: B023
            d_accuracy = prob_artist0.data.numpy().mean()
            d_score = -D_loss.data.numpy()

    nx.finish(mon_G, G, g_batch, g_loss_fn, optimizer=opt_G)
    nx.finish(mon_D, D, d_batch, d_loss_fn, optimizer=opt_D)

    with torch.no_grad():  # measure only
        gen = torch.Generator().manual_seed(10_000 + seed)
        paintings = G(torch.randn(2000, N_IDEAS, generator=gen)).numpy().astype(np.float64)
        rng_state = np.random.get_state()
        np.random.seed(20_000 + seed)
        real = artist_works(2000)
        np.random.set_state(rng_state)
        d_real = float(D(real).mean())
    err, in_band = paint_quality(paintings)
    return {"paint_error": err, "in_band": in_band, "d_real_prob": d_real, "d_accuracy_plot": float(d_accuracy),
            "d_score_plot": float(d_score)}  # fmt: skip
