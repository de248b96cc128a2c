"""Port of 1Konny's Beta-VAE (``solver.py``): the Burgess et al. beta-VAE ('B' model and
objective: a KL term pulled towards a growing capacity C) with a Bernoulli decoder on dSprites.

Source: github.com/1Konny/Beta-VAE, ``solver.py``, ``model.py``, ``dataset.py`` and
``run_dsprites_B_gamma100_z10.sh`` at commit 977a1ece88e190dd8a556b4e2efb665f759d0772 (MIT,
Copyright (c) 2018 WonKwang Lee). Written anew from the facts of those files; no code copied.

Kept: ``BetaVAE_B`` = an encoder of stride-2 ``Conv2d(4, 2, 1)`` + ``ReLU(True)`` blocks,
``View`` to a vector, ``Linear`` + ``ReLU`` twice and a ``Linear`` to ``2 * z_dim`` (mu, then
logvar), a decoder mirroring it (``Linear`` + ``ReLU`` three times, ``View`` to (32, 4, 4),
``ConvTranspose2d(4, 2, 1)`` + ``ReLU`` blocks, the last one to ``nc`` with no activation: the
decoder gives logits), ``.view(x.size())``; ``kaiming_init`` (Kaiming-normal weights, zero
biases on Linear and Conv2d); ``reparametrize`` = ``mu + exp(logvar / 2) * eps``, always
sampled; ``reconstruction_loss`` 'bernoulli' = ``binary_cross_entropy_with_logits`` summed,
divided by the batch size; ``kl_divergence`` -> ``total_kld`` = ``-0.5 * (1 + logvar - mu^2 -
exp(logvar))`` summed over z and averaged over the batch; objective 'B': ``C =
clamp(C_max / C_stop_iter * global_iter, 0, C_max)``, ``loss = recon + gamma * |total_kld -
C|``; ``Adam(lr=5e-4, betas=(0.9, 0.999))``, ``z_dim = 10``, ``gamma = 100``, ``C_max = 20``,
batch 64 (the dSprites script's options); the loader ``shuffle=True, drop_last=True``; the
loop (``global_iter += 1``, forward, losses, ``zero_grad``, ``backward``, ``step``, until
``max_iter``); dSprites as a float tensor of {0, 1} pixels, one channel.
Shrunk: dSprites (737,280 64x64 images) becomes 2,048 16x16 images drawn the same way
(a square, an ellipse or a heart at 6 scales, 40 orientations and 16x16 positions, rendered
anew with numpy) and 256 held out; the encoder and decoder have two conv blocks instead of
four (16 -> 8 -> 4) and 128-unit Linear layers instead of 256; ``max_iter`` 640 (20 epochs of
32 batches) instead of 1.5e6 and ``C_stop_iter`` 400 instead of 1e5. Visdom, the traversal
GIFs, tqdm and checkpoints are left out; the display step's numbers are kept as a record.

Measure only (not in the program): the negative ELBO (the published ``reconstruction_loss``,
summed over pixels, + ``total_kld``, beta = 1) of the 256 held-out shapes, under
``torch.no_grad()``, z sampled as in training (seeded).

nndx, as the author would add it: a preflight ``nndx.probe`` on the first batch with the
solver's own loss at its first iteration (the model's tuple unpacked, ``C`` = 0), batch
``(x, x)``; ``nndx.Monitor(net, optim)`` around the loop, ``beta_vae_loss`` logged; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "beta_vae"
SOURCE = Source("1Konny/Beta-VAE", "solver.py", "977a1ece88e190dd8a556b4e2efb665f759d0772", "MIT")

_MEASURE = Measure("test_neg_elbo", "negative ELBO (recon + KL) per held-out shape, 1.2x the healthy run's or more",
                   lambda healthy, buggy: not buggy < 1.2 * healthy)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "decoder_sigmoid_with_bce_logits",
            "nn.Sigmoid() appended to the decoder (to get images out of it) while reconstruction_loss still calls "
            "binary_cross_entropy_with_logits: the loss squashes the probabilities a second time, so a pixel's "
            "reconstruction can never be sure (p between 0.5 and 0.73)",
            (C.DOUBLE_SOFTMAX, C.WRONG_OUTPUT_ACTIVATION),  # filed as the dcgan/deepfm ports file a sigmoid
            ("https://github.com/yudi-mars/daisyRec/pull/15", "https://github.com/lopuhin/kaggle-imet-2019/issues/3",
             "https://github.com/alecGraves/BVAE-tf/issues/8"),
            _MEASURE,
        ),
        Variant(
            "recon_loss_mean_reduction",
            "reconstruction_loss's deprecated size_average=False dropped for the default reduction='mean': the "
            "reconstruction term becomes a per-pixel mean (256x smaller) beside gamma * |KL - C|, so the posterior "
            "is squeezed to the capacity target and the reconstructions go blurry",
            (C.WRONG_LOSS,),
            ("https://github.com/zdebruine/MMVAE/pull/19", "https://github.com/keras-team/keras/pull/3383",
             "https://github.com/AppliedDataSciencePartners/WorldModels/issues/12"),
            _MEASURE,
        ),
    )
}

# the dSprites script's options, shrunk
z_dim, beta1, beta2, lr, batch_size = 10, 0.9, 0.999, 5e-4, 64
gamma, C_max, C_stop_iter, max_iter = 100.0, 20.0, 400, 640
SIDE, N_TRAIN, N_TEST, HIDDEN, CH = 16, 2048, 256, 128, 32


# --------------------------------------------------------------------------- dSprites, drawn anew


def sprites(n: int, seed: int) -> torch.Tensor:
    """n binary SIDE x SIDE images of a square, an ellipse or a heart (dSprites' three shapes) at a
    random scale (6 values), orientation (40 values in [0, 2pi)) and position: (n, 1, SIDE, SIDE)."""
    rng = np.random.default_rng(seed)
    coords = (np.arange(SIDE) + 0.5) / SIDE * 2 - 1  # [-1, 1]
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    out = np.zeros((n, 1, SIDE, SIDE), dtype=np.float32)
    for i in range(n):
        shape = rng.integers(3)
        scale = 0.25 + 0.05 * rng.integers(6)
        angle = 2 * np.pi * rng.integers(40) / 40
        cx, cy = rng.uniform(-1 + scale, 1 - scale, size=2)
        x, y = xx - cx, yy - cy
        u = (np.cos(angle) * x + np.sin(angle) * y) / scale
        v = (-np.sin(angle) * x + np.cos(angle) * y) / scale
        if shape == 0:
            inside = (np.abs(u) <= 0.8) & (np.abs(v) <= 0.8)
        elif shape == 1:
            inside = (u / 1.0) ** 2 + (v / 0.55) ** 2 <= 1.0
        else:
            hu, hv = u * 1.2, -v * 1.2 + 0.2
            inside = (hu**2 + hv**2 - 1) ** 3 - hu**2 * hv**3 <= 0
        out[i, 0] = inside
    return torch.from_numpy(out)


# --------------------------------------------------------------------------- model.py


class View(nn.Module):
    def __init__(self, size: tuple[int, ...]) -> None:
        super().__init__()
        self.size = size

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(self.size)


def kaiming_init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Conv2d)):
        init.kaiming_normal_(m.weight)
        if m.bias is not None:
            m.bias.data.fill_(0)
    elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        m.weight.data.fill_(1)
        if m.bias is not None:
            m.bias.data.fill_(0)


def reparametrize(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    std = logvar.div(2).exp()
    eps = torch.randn_like(std)
    return mu + std * eps


class BetaVAE_B(nn.Module):  # noqa: N801
    """The Burgess et al. model, two conv blocks each way for 16x16 images."""

    def __init__(self, z_dim: int = 10, nc: int = 1, sigmoid_out: bool = False) -> None:
        super().__init__()
        self.z_dim, self.nc = z_dim, nc
        self.encoder = nn.Sequential(
            nn.Conv2d(nc, CH, 4, 2, 1), nn.ReLU(True),  # B, 32, 8, 8
            nn.Conv2d(CH, CH, 4, 2, 1), nn.ReLU(True),  # B, 32, 4, 4
            View((-1, CH * 4 * 4)),
            nn.Linear(CH * 4 * 4, HIDDEN), nn.ReLU(True),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(True),
            nn.Linear(HIDDEN, z_dim * 2),
        )  # fmt: skip
        decoder: list[nn.Module] = [
            nn.Linear(z_dim, HIDDEN), nn.ReLU(True),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(True),
            nn.Linear(HIDDEN, CH * 4 * 4), nn.ReLU(True),
            View((-1, CH, 4, 4)),
            nn.ConvTranspose2d(CH, CH, 4, 2, 1), nn.ReLU(True),  # B, 32, 8, 8
            nn.ConvTranspose2d(CH, nc, 4, 2, 1),  # B, nc, 16, 16
        ]  # fmt: skip
        if sigmoid_out:  # the bug: images out of the decoder, while the loss still expects logits
            decoder.append(nn.Sigmoid())
        self.decoder = nn.Sequential(*decoder)
        self.weight_init()

    def weight_init(self) -> None:
        for block in self._modules:
            for m in self._modules[block]:
                kaiming_init(m)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        distributions = self.encoder(x)
        mu = distributions[:, : self.z_dim]
        logvar = distributions[:, self.z_dim :]
        z = reparametrize(mu, logvar)
        x_recon = self.decoder(z).view(x.size())
        return x_recon, mu, logvar


# --------------------------------------------------------------------------- solver.py


def reconstruction_loss(x: torch.Tensor, x_recon: torch.Tensor, distribution: str = "bernoulli",
                        reduction: str = "sum") -> torch.Tensor:  # fmt: skip
    """``reduction``: "sum" as published (``size_average=False``); "mean" the bug."""
    batch_size = x.size(0)
    assert batch_size != 0
    if distribution == "bernoulli":
        loss = F.binary_cross_entropy_with_logits(x_recon, x, reduction=reduction)
        return loss.div(batch_size) if reduction == "sum" else loss
    if distribution == "gaussian":
        return F.mse_loss(torch.sigmoid(x_recon), x, reduction="sum").div(batch_size)
    raise NotImplementedError(distribution)


def kl_divergence(mu: torch.Tensor, logvar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    assert mu.size(0) != 0
    klds = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())
    total_kld = klds.sum(1).mean(0, True)
    dimension_wise_kld = klds.mean(0)
    mean_kld = klds.mean(1).mean(0, True)
    return total_kld, dimension_wise_kld, mean_kld


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(2 + seed)  # the script's --seed 2
    shapes, test_shapes = sprites(N_TRAIN, seed), sprites(N_TEST, seed + 10_000)
    data_tensor = shapes
    decoder_dist = "bernoulli"
    reduction = "mean" if variant == "recon_loss_mean_reduction" else "sum"

    net = BetaVAE_B(z_dim, 1, sigmoid_out=variant == "decoder_sigmoid_with_bce_logits")
    optim = torch.optim.Adam(net.parameters(), lr=lr, betas=(beta1, beta2))
    data_loader = torch.utils.data.DataLoader(data_tensor, batch_size=batch_size, shuffle=True, drop_last=True,
                                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
    c_max = torch.FloatTensor([C_max])

    def beta_vae_loss_at(global_iter: int):
        def loss_fn(output, x):
            x_recon, mu, logvar = output
            recon_loss = reconstruction_loss(x, x_recon, decoder_dist, reduction)
            total_kld, _, _ = kl_divergence(mu, logvar)
            c = torch.clamp(c_max / C_stop_iter * global_iter, 0, c_max.item())
            return (recon_loss + gamma * (total_kld - c).abs()).squeeze()

        return loss_fn

    first = next(iter(torch.utils.data.DataLoader(data_tensor, batch_size=batch_size)))
    first_batch = (first, first)
    nx.preflight(net, first_batch, beta_vae_loss_at(0), optimizer=optim)
    mon = nx.monitor(net, optim, every=10)

    net.train()
    global_iter, out = 0, False
    record: dict[str, list[float]] = {"recon_loss": [], "total_kld": [], "loss": []}
    while not out:
        for x in data_loader:
            global_iter += 1
            x_recon, mu, logvar = net(x)
            recon_loss = reconstruction_loss(x, x_recon, decoder_dist, reduction)
            total_kld, dim_wise_kld, mean_kld = kl_divergence(mu, logvar)
            C_now = torch.clamp(c_max / C_stop_iter * global_iter, 0, c_max.item())  # noqa: N806
            beta_vae_loss = recon_loss + gamma * (total_kld - C_now).abs()

            optim.zero_grad()
            beta_vae_loss.backward()
            optim.step()
            nx.timed(lambda: mon.log(beta_vae_loss))

            record["recon_loss"].append(recon_loss.item())
            record["total_kld"].append(total_kld.item())
            record["loss"].append(beta_vae_loss.item())
            if global_iter >= max_iter:
                out = True
                break

    nx.finish(mon, net, first_batch, beta_vae_loss_at(global_iter), optimizer=optim)

    def late(name: str) -> float:
        values = record[name][-32:]
        return sum(values) / len(values)

    torch.manual_seed(1234)
    with torch.no_grad():  # measure only: held-out negative ELBO against the {0, 1} shapes
        x_recon, mu, logvar = net(test_shapes)
        test_recon = reconstruction_loss(test_shapes, x_recon).item()  # summed over pixels, as published
        test_kld = kl_divergence(mu, logvar)[0].item()
    return {
        "late_recon_loss": late("recon_loss"),
        "late_total_kld": late("total_kld"),
        "late_loss": late("loss"),
        "test_recon": test_recon,
        "test_kld": test_kld,
        "test_neg_elbo": test_recon + test_kld,
    }
