"""Port of MorvanZhou/PyTorch-Tutorial's 406_conditional_GAN.py: a conditional GAN whose
generator paints curves between two parabolas given a class label (upper / lower half of the
artist's range); the label is concatenated to G's random ideas and to D's painting; the losses
are written by hand from ``prob_artist0`` / ``prob_artist1``.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/406_conditional_GAN.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, LICENCE, Copyright (c) 2017). Written anew
from the facts of that file; no code copied.

Kept: ``BATCH_SIZE`` 64, ``LR_G`` = ``LR_D`` = 0.0001, ``N_IDEAS`` 5, ``ART_COMPONENTS`` 15,
``PAINT_POINTS`` (``linspace(-1, 1, 15)`` stacked 64 times, numpy); ``artist_works_with_labels``
(``a = np.random.uniform(1, 2, size=64)[:, None]``, ``paintings = a * PAINT_POINTS**2 + (a - 1)``,
``labels = (a - 1) > 0.5`` as float32, both ``torch.from_numpy``); ``G = Sequential(Linear(6,
128), ReLU, Linear(128, 15))``; ``D = Sequential(Linear(16, 128), ReLU, Linear(128, 1),
Sigmoid)``; ``opt_D``/``opt_G`` = ``Adam(lr=0.0001)``; per step ``G_inputs = cat(randn(64, 5),
labels)``, ``D_inputs0 = cat(artist_paintings, labels)``, ``D_inputs1 = cat(G_paintings,
labels)``, ``D_score0 = log(prob_artist0)``, ``D_score1 = log(1 - prob_artist1)``, ``D_loss =
-mean(D_score0 + D_score1)``, ``G_loss = mean(D_score1)``, ``D_loss.backward(retain_graph=True)``;
the author's plotted numbers every 200 steps.
Changed, because the file as published no longer runs: it steps ``opt_D`` and then calls
``G_loss.backward()`` through the same D graph, which torch >= 1.5 refuses (D's weights were
modified in place). The port uses the order Morvan's own update of the unconditional
``406_GAN.py`` uses: the G step first (``G_loss`` on ``D(cat(G_paintings, labels))``,
``opt_G.zero_grad()``, ``backward``, ``step``), then the D step on ``G_paintings.detach()``.
Shrunk: 3,000 steps instead of 10,000; ``np.random.seed`` / ``torch.manual_seed`` set (commented
out in the file); no matplotlib.
Measure only (not in the program): 1,000 paintings of each class from ``G`` on fresh ideas,
each fitted (least squares) by the artist's family ``a x^2 + (a - 1)``; ``paint_error`` is the
mean squared residual of that fit and ``class_acc`` the fraction of paintings whose fitted
``a - 1`` falls on the side of 0.5 their label asks for.

nndx, as the author would add it: two models, two optimizers, so two Monitors,
``nndx.Monitor(G, opt_G)`` and ``nndx.Monitor(D, opt_D)``, each loss logged every step after its
optimizer step. A preflight ``nndx.probe`` of D (the model whose loss has a target) on 32 real
and 32 generated labelled paintings against 1 / 0 with the author's loss written as a function
of (output, target) and ``opt_D``; after training ``nndx.probe(D, ..., monitor=mon_D)`` on the
same batch and the generator Monitor's report, each diagnosed; the author reads both, ranked
together.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_cgan"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/406_conditional_GAN.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (G step before D step, as in 406_GAN.py; 3,000 steps)"),
        Variant(
            "g_loss_sign_flipped",
            "G_loss = -torch.mean(D_score1): the generator maximises log(1 - D(G(z))), i.e. helps the "
            "discriminator call its paintings fake, instead of minimising it",
            (C.WRONG_LOSS,),
            ("https://github.com/llSourcell/Generative_Adversarial_networks_LIVE/issues/5",
             "https://github.com/caogang/wgan-gp/issues/58",
             "https://github.com/rosinality/style-based-gan-pytorch/pull/60"),
            Measure("paint_error", "paintings' residual to the artist's family at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
        Variant(
            "no_generator_zero_grad",
            "opt_G.zero_grad() left out: G's gradients accumulate over every step, so each Adam step of G "
            "follows the sum of all past generator gradients",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Adversarial-Deep-Learning/code-soup/issues/69",
             "https://github.com/ajbrock/BigGAN-PyTorch/issues/25",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/557"),
            Measure("paint_error", "paintings' residual to the artist's family at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3 * healthy),
        ),
    )
}

BATCH_SIZE = 64
LR_G = 0.0001
LR_D = 0.0001
N_IDEAS = 5
ART_COMPONENTS = 15
STEPS = 3000


def _fit(paintings: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares ``a`` for ``a x^2 + (a - 1)`` = ``a (x^2 + 1) - 1``; residual per painting."""
    basis = x**2 + 1
    a = ((paintings + 1) * basis).sum(1) / (basis**2).sum()
    resid = ((paintings - (a[:, None] * basis - 1)) ** 2).mean(1)
    return a, resid


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    np.random.seed(seed)
    torch.manual_seed(seed)
    flipped = variant == "g_loss_sign_flipped"
    no_g_zero = variant == "no_generator_zero_grad"

    PAINT_POINTS = np.vstack([np.linspace(-1, 1, ART_COMPONENTS) for _ in range(BATCH_SIZE)])

    def artist_works_with_labels() -> tuple[torch.Tensor, torch.Tensor]:
        a = np.random.uniform(1, 2, size=BATCH_SIZE)[:, np.newaxis]
        paintings = a * np.power(PAINT_POINTS, 2) + (a - 1)
        labels = (a - 1) > 0.5
        paintings = torch.from_numpy(paintings).float()
        labels = torch.from_numpy(labels.astype(np.float32))
        return paintings, labels

    G = nn.Sequential(nn.Linear(N_IDEAS + 1, 128), nn.ReLU(), nn.Linear(128, ART_COMPONENTS))
    D = nn.Sequential(nn.Linear(ART_COMPONENTS + 1, 128), nn.ReLU(), nn.Linear(128, 1), nn.Sigmoid())
    opt_D = torch.optim.Adam(D.parameters(), lr=LR_D)
    opt_G = torch.optim.Adam(G.parameters(), lr=LR_G)

    def d_loss_fn(prob: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The author's D loss over a labelled batch of real (1) and fake (0) paintings."""
        return -torch.mean(target * torch.log(prob) + (1 - target) * torch.log(1.0 - prob))

    with torch.random.fork_rng():
        state = np.random.get_state()
        real, lab = artist_works_with_labels()
        np.random.set_state(state)
        with torch.no_grad():
            fake = G(torch.cat((torch.randn(BATCH_SIZE, N_IDEAS), lab), 1))
    probe_batch = (torch.cat([torch.cat((real, lab), 1)[:32], torch.cat((fake, lab), 1)[:32]]),
                   torch.cat([torch.ones(32, 1), torch.zeros(32, 1)]))  # fmt: skip
    nx.preflight(D, probe_batch, d_loss_fn, optimizer=opt_D)
    mon_G = nx.monitor(G, opt_G)
    mon_D = nx.monitor(D, opt_D)

    prob_artist0 = D_loss = None
    for _step in range(STEPS):
        artist_paintings, labels = artist_works_with_labels()
        G_ideas = torch.randn(BATCH_SIZE, N_IDEAS)
        G_inputs = torch.cat((G_ideas, labels), 1)
        G_paintings = G(G_inputs)
        prob_artist1 = D(torch.cat((G_paintings, labels), 1))
        G_loss = torch.mean(torch.log(1.0 - prob_artist1))
        if flipped:
            G_loss = -G_loss
        if not no_g_zero:
            opt_G.zero_grad()
        G_loss.backward()
        opt_G.step()
        nx.timed(lambda: mon_G.log(G_loss))  # noqa: B023

        D_inputs0 = torch.cat((artist_paintings, labels), 1)
        D_inputs1 = torch.cat((G_paintings.detach(), labels), 1)
        prob_artist0 = D(D_inputs0)
        prob_artist1 = D(D_inputs1)
        D_score0 = torch.log(prob_artist0)
        D_score1 = torch.log(1.0 - prob_artist1)
        D_loss = -torch.mean(D_score0 + D_score1)
        opt_D.zero_grad()
        D_loss.backward(retain_graph=True)
        opt_D.step()
        nx.timed(lambda: mon_D.log(D_loss))  # noqa: B023

    nx.finish(mon_D, D, probe_batch, d_loss_fn, optimizer=opt_D)
    nx.finish(mon_G)

    x = PAINT_POINTS[0]
    errs, accs = [], []
    with torch.no_grad():
        for cls in (0.0, 1.0):
            z = torch.randn(1000, N_IDEAS)
            out = G(torch.cat((z, torch.full((1000, 1), cls)), 1)).double().numpy()
            a, resid = _fit(out, x)
            errs.append(resid.mean())
            accs.append((((a - 1) > 0.5) == bool(cls)).mean())
    return {"paint_error": float(np.mean(errs)), "class_acc": float(np.mean(accs)),
            "d_real_prob": prob_artist0.mean().item(), "d_loss": D_loss.item()}  # fmt: skip
