"""Port of rasbt/deeplearning-models: the fully connected variational autoencoder. An encoder
(``hidden_1`` Linear, ``leaky_relu(negative_slope=0.0001)``, two heads ``z_mean`` and
``z_log_var``), ``reparameterize`` (``z_mu + eps * torch.exp(z_log_var/2.)`` with
``eps = torch.randn(...)``), a decoder (``linear_3``, leaky ReLU, ``linear_4``, ``torch.sigmoid``);
the cost is the KL divergence written by hand, ``(0.5 * (z_mean**2 + torch.exp(z_log_var) -
z_log_var - 1)).sum()``, plus ``F.binary_cross_entropy(decoded, features, reduction='sum')``; Adam,
``optimizer.zero_grad()``, ``cost.backward()``, ``optimizer.step()``.

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/autoencoder/ae-var.ipynb`` at commit
18e046926551378cd691fd871dda0f21dcd272ab (MIT, Copyright (c) 2019-2022 Sebastian Raschka). Written
anew from the facts of that notebook; no code copied.

Kept: the model and its sizes' shape (features -> hidden -> latent -> hidden -> features), the
notebook's cost, ``learning_rate`` 0.001, Adam, ``batch_size`` 128 with a shuffling ``DataLoader``,
``features.view(-1, n)`` on each batch, ``torch.manual_seed(random_seed)`` before the model,
``random_seed`` 0 (the harness's seed).
Shrunk: scikit-learn's 8x8 digits scaled to [0, 1] (``ToTensor``'s /255 on the 0..255 pixels;
1,437 train / 360 test) instead of MNIST, so ``num_features`` 64 instead of 784; ``num_hidden_1``
128 instead of 500; ``num_latent`` 15 kept; ``num_epochs`` 40 instead of 50 (12 batches an epoch
instead of 469); CPU; no plots.
Measure only (not in the program): after training, on the test images in eval mode, the summed
per-image reconstruction BCE and KL of the notebook's cost, and the mean squared reconstruction
error.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch, with
the notebook's cost as ``loss_fn`` on what the model returns and the Adam; ``nndx.Monitor(model,
optimizer)`` around the loop, the cost logged where the notebook logs; ``nndx.probe(...,
monitor=mon)`` + ``diagnose`` after training on the same batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "raschka_vae"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/autoencoder/ae-var.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 8x8 digits, 64-128-15 VAE, 40 epochs)"),
        Variant(
            "bce_mean_kl_sum",
            "the reconstruction term is F.binary_cross_entropy(decoded, features) with the default "
            "reduction='mean' while the KL term stays summed over the batch and the latent units: the KL "
            "outweighs the reconstruction ~8,000-fold and the posterior collapses (blurry, sample-independent "
            "reconstructions)",
            (C.WRONG_LOSS,),
            ("https://github.com/pytorch/examples/issues/817",
             "https://github.com/orybkin/sigma-vae-pytorch/pull/12",
             "https://github.com/zdebruine/MMVAE/pull/19"),
            Measure("test_kl_per_image", "posterior collapse: the test KL per image below 0.1x the healthy run's",
                    lambda healthy, buggy: buggy < 0.1 * healthy),
        ),
        Variant(
            "kl_sign_flipped",
            "the KL term is written from the paper's Appendix B, 0.5 * (1 + z_log_var - z_mean**2 - "
            "exp(z_log_var)).sum(), which is -KL, and added to the BCE as if it were the KL: the cost rewards a "
            "large divergence, so z_mean and z_log_var are driven without bound",
            (C.WRONG_LOSS,),
            ("https://github.com/FluxML/model-zoo/pull/147",
             "https://github.com/ssemeniuta/textvae/issues/4",
             "https://github.com/wiseodd/generative-models/issues/43"),
            Measure("test_recon_mse", "test reconstruction MSE at least 1.5x the healthy run's, or not finite",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

learning_rate = 0.001
num_epochs = 40
batch_size = 128
num_features = 64
num_hidden_1 = 128
num_latent = 15


class VariationalAutoencoder(torch.nn.Module):
    def __init__(self, num_features, num_hidden_1, num_latent):
        super(VariationalAutoencoder, self).__init__()
        # ENCODER
        self.hidden_1 = torch.nn.Linear(num_features, num_hidden_1)
        self.z_mean = torch.nn.Linear(num_hidden_1, num_latent)
        self.z_log_var = torch.nn.Linear(num_hidden_1, num_latent)
        # DECODER
        self.linear_3 = torch.nn.Linear(num_latent, num_hidden_1)
        self.linear_4 = torch.nn.Linear(num_hidden_1, num_features)

    def reparameterize(self, z_mu, z_log_var):
        eps = torch.randn(z_mu.size(0), z_mu.size(1))
        z = z_mu + eps * torch.exp(z_log_var / 2.0)
        return z

    def encoder(self, features):
        x = self.hidden_1(features)
        x = F.leaky_relu(x, negative_slope=0.0001)
        z_mean = self.z_mean(x)
        z_log_var = self.z_log_var(x)
        encoded = self.reparameterize(z_mean, z_log_var)
        return z_mean, z_log_var, encoded

    def decoder(self, encoded):
        x = self.linear_3(encoded)
        x = F.leaky_relu(x, negative_slope=0.0001)
        x = self.linear_4(x)
        decoded = torch.sigmoid(x)
        return decoded

    def forward(self, features):
        z_mean, z_log_var, encoded = self.encoder(features)
        decoded = self.decoder(encoded)
        return z_mean, z_log_var, encoded, decoded


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    bce_mean = variant == "bce_mean_kl_sum"
    kl_flipped = variant == "kl_sign_flipped"

    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    # transforms.ToTensor(): 0..255 -> [0, 1]
    train_images, test_images = digits.to_tensor(tr_raw), digits.to_tensor(te_raw)
    train_dataset = TensorDataset(train_images, tr_y)
    train_loader = DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=True)

    torch.manual_seed(seed)
    model = VariationalAutoencoder(num_features, num_hidden_1, num_latent)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    def cost_fn(outputs, features):  # the notebook's cost on what the model returns
        z_mean, z_log_var, encoded, decoded = outputs
        if kl_flipped:
            kl_divergence = (0.5 * (1 + z_log_var - z_mean**2 - torch.exp(z_log_var))).sum()
        else:
            kl_divergence = (0.5 * (z_mean**2 + torch.exp(z_log_var) - z_log_var - 1)).sum()
        if bce_mean:
            pixelwise_bce = F.binary_cross_entropy(decoded, features)
        else:
            pixelwise_bce = F.binary_cross_entropy(decoded, features, reduction="sum")
        return kl_divergence + pixelwise_bce

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_features, _ = next(iter(train_loader))
    probe_features = probe_features.view(-1, num_features)
    probe_batch = (probe_features, probe_features)
    nx.preflight(model, probe_batch, cost_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    costs = []
    for epoch in range(num_epochs):
        for batch_idx, (features, targets) in enumerate(train_loader):
            features = features.view(-1, num_features)
            cost = cost_fn(model(features), features)

            optimizer.zero_grad()
            cost.backward()
            optimizer.step()

            nx.timed(lambda: mon.log(cost))  # noqa: B023
            costs.append(cost.item())

    nx.finish(mon, model, probe_batch, cost_fn, optimizer=optimizer)

    # measure only: the test images in eval mode, against the [0, 1] pixels
    model.eval()
    with torch.no_grad():
        test_x = target01 = test_images.view(-1, num_features)
        z_mean, z_log_var, encoded, decoded = model(test_x)
        n = test_x.shape[0]
        test_kl = float((0.5 * (z_mean**2 + torch.exp(z_log_var) - z_log_var - 1)).sum()) / n
        test_bce = float(F.binary_cross_entropy(decoded, target01, reduction="sum")) / n
        test_mse = float(((decoded - target01) ** 2).mean())
    return {"test_recon_mse": test_mse, "test_bce_per_image": test_bce, "test_kl_per_image": test_kl,
            "last_cost": costs[-1], "first_cost": costs[0]}  # fmt: skip
