"""Port of yunjey/pytorch-tutorial's variational auto-encoder: a fully connected VAE on MNIST
(encoder ``fc1`` -> ReLU -> ``fc2`` (mu) / ``fc3`` (log_var), ``reparameterize``, decoder
``fc4`` -> ReLU -> ``fc5`` -> sigmoid), trained on the summed binary cross-entropy of the
reconstruction plus the analytic KL divergence, Adam at 1e-3.

Source: github.com/yunjey/pytorch-tutorial, ``tutorials/03-advanced/variational_autoencoder/main.py``
at commit 0500d3df5a2a8080ccfccbc00aca0eacc21818db (MIT, Copyright (c) 2017 Yunjey Choi). Written
anew from the facts of that file; no code copied.

Kept: the model (``VAE(image_size, h_dim, z_dim)`` with ``encode``, ``reparameterize`` as
``mu + randn_like(std) * exp(log_var / 2)``, ``decode`` ending in ``F.sigmoid``, ``forward``
returning ``(x_reconst, mu, log_var)``); ``torch.optim.Adam(model.parameters(), lr=1e-3)``;
``transforms.ToTensor()`` data (pixels in [0, 1]) through a shuffled ``DataLoader`` with
``batch_size=128``; the loop: ``x.view(-1, image_size)``, ``reconst_loss =
F.binary_cross_entropy(x_reconst, x, size_average=False)`` (written ``reduction='sum'``,
its modern spelling), ``kl_div = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())``,
``loss = reconst_loss + kl_div``, ``zero_grad`` / ``backward`` / ``step``; every epoch the
sample from the prior (``torch.randn(batch_size, z_dim)`` decoded) and the reconstruction of
the last batch, under ``no_grad``.
Shrunk / replaced: scikit-learn's 8x8 digits (1,437 train images, 360 held out, scaled to
[0, 1] as ``ToTensor`` scales MNIST) in place of MNIST's 28x28, so ``image_size`` 64, ``h_dim``
128 (400), ``z_dim`` 8 (20); 60 epochs instead of 15 (an epoch is 12 batches here, 469 on MNIST);
images not saved.
Measure only (not in the program): on the 360 held-out digits, the summed BCE per image of
``decode(mu)`` against the [0, 1] image, its pixel MSE, and the mean KL per image.

nndx, as the author would add it after the README: the loss is written inline in the loop,
so the probes get the same computation as ``loss_fn(output, x)`` on ``output = model(x)`` and
the batch ``(x, x)`` (the target is the input); a preflight ``nndx.probe`` with the
optimizer on the first batch; ``nndx.Monitor(model, optimizer, every=10)`` around the loop
with ``mon.log(loss)`` after every step; after training ``nndx.probe(..., monitor=mon)`` on
the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "yunjey_vae"
SOURCE = Source("yunjey/pytorch-tutorial", "tutorials/03-advanced/variational_autoencoder/main.py",
                "0500d3df5a2a8080ccfccbc00aca0eacc21818db", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (shrunk: 8x8 digits, h_dim 128, z_dim 8, 60 epochs of 12 batches)"),
        Variant(
            "bce_mean_reduction",
            "reconst_loss = F.binary_cross_entropy(x_reconst, x) with the default reduction='mean' (size_average "
            "left at its default) while kl_div stays summed over the batch and the latent units: the "
            "reconstruction term is divided by batch x pixels, the KL term overwhelms it and the posterior "
            "collapses (every digit decodes to the same blur)",
            (C.WRONG_LOSS,),
            ("https://github.com/y0ast/VAE-Torch/issues/11",
             "https://github.com/pytorch/examples/issues/234",
             "https://github.com/orybkin/sigma-vae-pytorch/pull/12"),
            Measure("test_kl", "held-out KL per image below a tenth of the healthy run's (posterior collapse): "
                    "9e-05 against 2.75 nats on seed 0 (held-out summed BCE 27.9 against 20.4)",
                    lambda healthy, buggy: not buggy > 0.1 * healthy),
        ),
        Variant(
            "bce_with_logits_on_sigmoid",
            "reconst_loss = F.binary_cross_entropy_with_logits(x_reconst, x, reduction='sum') (the loss "
            "autocast accepts, the usual switch when F.binary_cross_entropy refuses mixed precision) while decode "
            "still ends in F.sigmoid: the loss applies a second sigmoid, the modelled pixel probabilities stay in "
            "[0.5, 0.73], and the reconstruction term cannot fall below that floor",
            (C.WRONG_OUTPUT_ACTIVATION, C.WRONG_LOSS),
            ("https://github.com/argusswift/YOLOv4-pytorch/issues/89",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/FluxML/model-zoo/pull/289"),
            Measure("test_mse", "held-out pixel MSE of the decoder output against the image at least 1.5x "
                    "the healthy run's: 0.113 against 0.031 on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

IMAGE_SIZE, H_DIM, Z_DIM, NUM_EPOCHS, BATCH_SIZE, LEARNING_RATE = 64, 128, 8, 60, 128, 1e-3


class VAE(nn.Module):
    def __init__(self, image_size: int = 784, h_dim: int = 400, z_dim: int = 20) -> None:
        super().__init__()
        self.fc1 = nn.Linear(image_size, h_dim)
        self.fc2 = nn.Linear(h_dim, z_dim)
        self.fc3 = nn.Linear(h_dim, z_dim)
        self.fc4 = nn.Linear(z_dim, h_dim)
        self.fc5 = nn.Linear(h_dim, image_size)

    def encode(self, x):
        h = F.relu(self.fc1(x))
        return self.fc2(h), self.fc3(h)

    def reparameterize(self, mu, log_var):
        std = torch.exp(log_var / 2)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h = F.relu(self.fc4(z))
        return torch.sigmoid(self.fc5(h))

    def forward(self, x):
        mu, log_var = self.encode(x)
        z = self.reparameterize(mu, log_var)
        x_reconst = self.decode(z)
        return x_reconst, mu, log_var


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    bce_reduction = "mean" if variant == "bce_mean_reduction" else "sum"
    with_logits = variant == "bce_with_logits_on_sigmoid"

    tr_raw, tr_y, te_raw, _ = digits.digit_images(seed=seed)
    x_train = digits.to_tensor(tr_raw)  # transforms.ToTensor(): (N, 1, 8, 8) in [0, 1]
    x_test = digits.to_tensor(te_raw).view(-1, IMAGE_SIZE)
    dataset = TensorDataset(x_train, tr_y)
    data_loader = DataLoader(dataset=dataset, batch_size=BATCH_SIZE, shuffle=True)

    model = VAE(IMAGE_SIZE, H_DIM, Z_DIM)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    def loss_fn(output, x):  # the loop's loss, as a function for the probes
        x_reconst, mu, log_var = output
        if with_logits:
            reconst_loss = F.binary_cross_entropy_with_logits(x_reconst, x, reduction="sum")
        else:
            reconst_loss = F.binary_cross_entropy(x_reconst, x, reduction=bce_reduction)
        kl_div = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())
        return reconst_loss + kl_div

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        first = next(iter(data_loader))[0].view(-1, IMAGE_SIZE)
    probe_batch = (first, first)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)

    mon = nx.monitor(model, optimizer, every=10)
    losses = []
    for epoch in range(NUM_EPOCHS):
        for i, (x, _) in enumerate(data_loader):
            x = x.view(-1, IMAGE_SIZE)
            x_reconst, mu, log_var = model(x)

            if with_logits:
                reconst_loss = F.binary_cross_entropy_with_logits(x_reconst, x, reduction="sum")
            else:
                reconst_loss = F.binary_cross_entropy(x_reconst, x, reduction=bce_reduction)
            kl_div = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())

            loss = reconst_loss + kl_div
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            losses.append(loss.item())

        with torch.no_grad():
            z = torch.randn(BATCH_SIZE, Z_DIM)
            out = model.decode(z).view(-1, 1, 8, 8)  # save_image(out, ...) in the original
            out, _, _ = model(x)  # the reconstruction of the last batch, saved in the original

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)

    with torch.no_grad():
        mu, log_var = model.encode(x_test)
        rec = model.decode(mu)
        test_bce = F.binary_cross_entropy(rec, x_test, reduction="sum").item() / len(x_test)
        test_mse = F.mse_loss(rec, x_test).item()
        test_kl = (-0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())).item() / len(x_test)
    return {"test_bce": test_bce, "test_mse": test_mse, "test_kl": test_kl,
            "final_loss": sum(losses[-12:]) / 12, "first_loss": losses[0]}  # fmt: skip
