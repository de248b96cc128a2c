"""Reading how each term of a loss reduces the batch off its autograd graph, and NNDX626,
which names a loss that averages one term over the batch and sums another."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nndx
from nndx.collector.loss_terms import batch_reductions
from nndx.collector.probes.overfit import overfit_one_batch

N, D, Z = 16, 12, 3


class TinyVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.mu, self.logvar, self.dec = nn.Linear(D, 8), nn.Linear(8, Z), nn.Linear(8, Z), nn.Linear(Z, D)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.dec(z)), mu, logvar


def _kld(mu, logvar):
    return -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def vae_loss(recon_reduction: str, per_batch: bool = False):
    def loss_fn(output, x):
        x_hat, mu, logvar = output
        loss = F.binary_cross_entropy(x_hat, x, reduction=recon_reduction) + _kld(mu, logvar)
        return loss / x.shape[0] if per_batch else loss

    return loss_fn


def _kinds(loss_fn, model=None) -> list[str]:
    torch.manual_seed(0)
    model = model or TinyVAE()
    x = torch.rand(N, D)
    output = model(x)
    return sorted(t.reduction for t in batch_reductions(loss_fn(output, x), output, x, x))


def test_a_mean_beside_a_sum_is_read_as_both():
    assert _kinds(vae_loss("mean")) == ["mean", "sum"]


def test_terms_reduced_alike_are_read_alike():
    assert _kinds(vae_loss("sum")) == ["sum", "sum"]
    assert _kinds(lambda output, x: vae_loss("sum")(output, x).mean()) == ["sum", "sum"]  # the mean of a scalar
    # the whole sum divided by the batch size: both terms are averages over the batch
    assert _kinds(vae_loss("sum", per_batch=True)) == ["mean", "mean"]


def test_a_penalty_on_the_weights_does_not_scale_with_the_batch():
    model = nn.Linear(D, 4)

    def loss_fn(output, x):
        return F.cross_entropy(output, torch.zeros(N, dtype=torch.long)) + 1e-4 * sum(
            p.pow(2).sum() for p in model.parameters())

    assert _kinds(loss_fn, model) == ["mean"]


def test_a_sum_divided_by_a_count_of_what_it_kept_is_an_average():
    model = nn.Linear(D, 5)

    def loss_fn(output, x):
        mask = (x[:, 0] > 0.3).float()
        per_sample = F.cross_entropy(output, torch.zeros(N, dtype=torch.long), reduction="none")
        return (per_sample * mask).sum() / mask.sum().clamp(min=N) + 0.1 * output.pow(2).mean()

    assert _kinds(loss_fn, model) == ["mean", "mean"]


def test_a_pairwise_term_over_the_batch_is_no_reading():
    """AntixK's WAE-MMD: the reconstruction's mean beside kernel sums over (N, N) pairs of latents,
    weighted by 100 / (N (N - 1)): a mean over pairs times a weight, or a sum divided by N / 100? The
    numbers cannot tell a weight from a divisor there; a term over pairs of samples is not read."""

    def wae_loss(output, x):
        x_hat, z, _ = output
        prior = torch.randn_like(z)
        kernel = lambda a, b: (2.0 * Z / (2.0 * Z + torch.cdist(a, b) ** 2)).sum()  # noqa: E731
        mmd = kernel(z, z) + kernel(prior, prior) - 2 * kernel(z, prior)
        return F.mse_loss(x_hat, x) + 100.0 / (N * (N - 1)) * mmd

    assert _kinds(wae_loss) == []


def test_terms_it_cannot_read_make_the_reading_unknown():
    model = nn.Linear(D, 5)

    def product(output, x):
        return F.mse_loss(output, x[:, :5]) * output.sum()

    def norm(output, x):
        return torch.linalg.vector_norm(output - x[:, :5])

    assert _kinds(product, model) == []
    assert _kinds(norm, model) == []


def test_the_overfit_probe_records_the_first_losss_terms():
    torch.manual_seed(0)
    x = torch.rand(N, D)
    result = overfit_one_batch(TinyVAE(), (x, x), vae_loss("mean"), steps=3)
    assert sorted((t.op, t.reduction) for t in result.loss_terms) == [("BinaryCrossEntropy", "mean"), ("sum", "sum")]
    assert next(t for t in result.loss_terms if t.op == "sum").scale == pytest.approx(-0.5)


def _rules(loss_fn) -> list[str]:
    torch.manual_seed(0)
    x = torch.rand(64, D)
    report = nndx.probe(TinyVAE(), (x, x), loss_fn, probes=["overfit_one_batch"])
    return [f.rule_id for f in nndx.diagnose(report).findings]


def test_nndx626_names_a_vae_whose_reconstruction_is_averaged_and_kl_summed():
    assert "NNDX626" in _rules(vae_loss("mean"))


def test_nndx626_is_silent_on_vae_losses_reduced_alike():
    assert "NNDX626" not in _rules(vae_loss("sum"))
    assert "NNDX626" not in _rules(vae_loss("sum", per_batch=True))
