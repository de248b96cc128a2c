"""Port of emited's VariationalRecurrentNeuralNetwork: the Variational RNN of Chung et al.
(2015) -- at each timestep a prior, an encoder and a decoder network conditioned on a GRU
state, a reparameterised latent sample, the KL divergence between two diagonal Gaussians
plus a Bernoulli negative log-likelihood, both summed over time, batch and units.

Source: github.com/emited/VariationalRecurrentNeuralNetwork, ``model.py`` and ``train.py`` at
commit 0f23c87d11597ecf50ecbbf1dd37429861fd7aca (no licence stated: the repository has no
LICENSE file). Written anew from the facts of those files; no code copied.

Kept: ``VRNN(x_dim, h_dim, z_dim, n_layers)``: ``phi_x`` = Linear-ReLU-Linear-ReLU,
``phi_z`` = Linear-ReLU; the encoder (Linear-ReLU-Linear-ReLU over ``[phi_x_t, h[-1]]``,
``enc_mean`` a Linear, ``enc_std`` Linear + Softplus); the prior (Linear-ReLU over
``h[-1]``, ``prior_mean`` a Linear, ``prior_std`` Linear + Softplus); the decoder
(Linear-ReLU-Linear-ReLU over ``[phi_z_t, h[-1]]``, ``dec_std`` Linear + Softplus,
``dec_mean`` Linear + Sigmoid); the recurrence ``nn.GRU(h_dim + h_dim, h_dim, n_layers,
bias)`` with the model's ``bias=False`` passed positionally (so the GRU has no biases), fed
``[phi_x_t, phi_z_t]``; ``forward(x)`` over a time-major ``x`` (seq, batch, elem) from a
zero state, returning ``(kld_loss, nll_loss, (enc means, enc stds), (dec means, dec stds))``;
``_reparameterized_sample`` (``eps ~ N(0, 1)``, ``eps * std + mean``); ``_kld_gauss`` (the
closed form with ``EPS`` inside the logs, summed); ``_nll_bernoulli`` (``-sum(x log(theta +
EPS) + (1 - x) log(1 - theta - EPS))``); ``sample(seq_len)`` from the prior; ``train.py``'s
loop: ``data.squeeze().transpose(0, 1)`` to (seq, batch, elem), the per-batch min-max
rescaling ``(data - data.min()) / (data.max() - data.min())``, ``optimizer.zero_grad()``,
``loss = kld_loss + nll_loss``, ``backward``, ``optimizer.step()`` and then -- as published,
after the step (the repository's issue #3) -- ``clip_grad_norm_(model.parameters(), clip=10)``;
``test(epoch)`` under ``torch.no_grad()`` with the same transforms, KLD and NLL divided by
the dataset size; ``Adam(lr=1e-3)``; ``batch_size`` 8; ``n_layers`` 1; images read row by
row, one row per timestep (the MNIST rows in the original).
Shrunk: scikit-learn's 8x8 digits upscaled to 16x16 (1,437 train / 360 test) instead of
28x28 MNIST, so ``x_dim`` 16 and 16 timesteps instead of 28; ``h_dim`` 32 instead of 100,
``z_dim`` 8 instead of 16; 3 epochs instead of 25; no plots of samples, no checkpoints, no
printing.
Measure only (not in the program): the held-out negative ELBO per image (KLD + NLL of the
360 test digits, laid out time-major as the model expects), averaged over 4 draws of the
latent noise; the program's own ``test`` numbers are returned too.

nndx, as the author would add it: the model returns its own loss terms, so ``loss_fn`` is
``lambda out, _: out[0] + out[1]`` (the loader's labels ride along as the unused targets, as
in ``for batch_idx, (data, _) in enumerate(train_loader)``); a preflight ``nndx.probe`` on
the first training batch as the loop prepares it, with the optimizer; ``nndx.Monitor(model,
optimizer)`` around the epochs, each batch's loss logged and the test loss per image as
``split="val"``; then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "vrnn"
SOURCE = Source("emited/VariationalRecurrentNeuralNetwork", "train.py", "0f23c87d11597ecf50ecbbf1dd37429861fd7aca",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 16x16 digits, h_dim 32, 3 epochs)"),
        Variant(
            "not_transposed",
            "data.squeeze() without .transpose(0, 1): the batch-major (batch, rows, elem) tensor reaches a model "
            "that reads dim 0 as time, so it steps through the 8 images of a batch as timesteps and treats the "
            "16 rows as the batch; every shape still fits",
            (C.WRONG_RESHAPE,),
            ("https://github.com/threelittlemonkeys/seq2seq-pytorch/issues/2",
             "https://github.com/Cadene/vqa.pytorch/issues/40",
             "https://github.com/hunkim/PyTorchZeroToAll/issues/15"),
            Measure("heldout_nelbo", "held-out negative ELBO per image (time-major test digits) at least 5 nats "
                    "above the healthy run's: 118.6 against 98.2 healthy on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 5.0),
        ),
        Variant(
            "hidden_state_detached",
            "the recurrent state repackaged (detached) at every timestep, as the repository first did: "
            "h = h.detach() after each GRU step, so no gradient flows through time",
            (C.DETACHED_GRAPH,),
            ("https://github.com/emited/VariationalRecurrentNeuralNetwork/issues/1",),
            Measure("heldout_nelbo", "held-out negative ELBO per image at least 3 nats above the healthy run's: "
                    "113.6 against 98.2 healthy on seed 0", lambda healthy, buggy: not buggy < healthy + 3.0),
        ),
    )
}

EPS = torch.finfo(torch.float).eps
x_dim, h_dim, z_dim, n_layers = 16, 32, 8, 1
n_epochs = 3
clip = 10
learning_rate = 1e-3
batch_size = 8


# --------------------------------------------------------------------------- model.py


class VRNN(nn.Module):
    def __init__(self, x_dim: int, h_dim: int, z_dim: int, n_layers: int, bias: bool = False,
                 detach_state: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.x_dim, self.h_dim, self.z_dim, self.n_layers = x_dim, h_dim, z_dim, n_layers
        self.detach_state = detach_state
        self.phi_x = nn.Sequential(nn.Linear(x_dim, h_dim), nn.ReLU(), nn.Linear(h_dim, h_dim), nn.ReLU())
        self.phi_z = nn.Sequential(nn.Linear(z_dim, h_dim), nn.ReLU())
        self.enc = nn.Sequential(nn.Linear(h_dim + h_dim, h_dim), nn.ReLU(), nn.Linear(h_dim, h_dim), nn.ReLU())
        self.enc_mean = nn.Linear(h_dim, z_dim)
        self.enc_std = nn.Sequential(nn.Linear(h_dim, z_dim), nn.Softplus())
        self.prior = nn.Sequential(nn.Linear(h_dim, h_dim), nn.ReLU())
        self.prior_mean = nn.Linear(h_dim, z_dim)
        self.prior_std = nn.Sequential(nn.Linear(h_dim, z_dim), nn.Softplus())
        self.dec = nn.Sequential(nn.Linear(h_dim + h_dim, h_dim), nn.ReLU(), nn.Linear(h_dim, h_dim), nn.ReLU())
        self.dec_std = nn.Sequential(nn.Linear(h_dim, x_dim), nn.Softplus())
        self.dec_mean = nn.Sequential(nn.Linear(h_dim, x_dim), nn.Sigmoid())
        self.rnn = nn.GRU(h_dim + h_dim, h_dim, n_layers, bias)

    def forward(self, x: torch.Tensor):
        all_enc_mean, all_enc_std, all_dec_mean, all_dec_std = [], [], [], []
        kld_loss = 0
        nll_loss = 0
        h = torch.zeros(self.n_layers, x.size(1), self.h_dim)
        for t in range(x.size(0)):
            phi_x_t = self.phi_x(x[t])
            enc_t = self.enc(torch.cat([phi_x_t, h[-1]], 1))
            enc_mean_t = self.enc_mean(enc_t)
            enc_std_t = self.enc_std(enc_t)
            prior_t = self.prior(h[-1])
            prior_mean_t = self.prior_mean(prior_t)
            prior_std_t = self.prior_std(prior_t)
            z_t = self._reparameterized_sample(enc_mean_t, enc_std_t)
            phi_z_t = self.phi_z(z_t)
            dec_t = self.dec(torch.cat([phi_z_t, h[-1]], 1))
            dec_mean_t = self.dec_mean(dec_t)
            dec_std_t = self.dec_std(dec_t)
            _, h = self.rnn(torch.cat([phi_x_t, phi_z_t], 1).unsqueeze(0), h)
            if self.detach_state:  # the bug: the state repackaged every step
                h = h.detach()
            kld_loss += self._kld_gauss(enc_mean_t, enc_std_t, prior_mean_t, prior_std_t)
            nll_loss += self._nll_bernoulli(dec_mean_t, x[t])
            all_enc_std.append(enc_std_t)
            all_enc_mean.append(enc_mean_t)
            all_dec_mean.append(dec_mean_t)
            all_dec_std.append(dec_std_t)
        return kld_loss, nll_loss, (all_enc_mean, all_enc_std), (all_dec_mean, all_dec_std)

    def sample(self, seq_len: int) -> torch.Tensor:
        sample = torch.zeros(seq_len, self.x_dim)
        h = torch.zeros(self.n_layers, 1, self.h_dim)
        for t in range(seq_len):
            prior_t = self.prior(h[-1])
            z_t = self._reparameterized_sample(self.prior_mean(prior_t), self.prior_std(prior_t))
            phi_z_t = self.phi_z(z_t)
            dec_mean_t = self.dec_mean(self.dec(torch.cat([phi_z_t, h[-1]], 1)))
            phi_x_t = self.phi_x(dec_mean_t)
            _, h = self.rnn(torch.cat([phi_x_t, phi_z_t], 1).unsqueeze(0), h)
            sample[t] = dec_mean_t.data
        return sample

    def _reparameterized_sample(self, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        eps = torch.empty(size=std.size(), dtype=torch.float).normal_()
        return eps.mul(std).add_(mean)

    def _kld_gauss(self, mean_1, std_1, mean_2, std_2):
        kld_element = (2 * torch.log(std_2 + EPS) - 2 * torch.log(std_1 + EPS)
                       + (std_1.pow(2) + (mean_1 - mean_2).pow(2)) / std_2.pow(2) - 1)  # fmt: skip
        return 0.5 * torch.sum(kld_element)

    def _nll_bernoulli(self, theta, x):
        return -torch.sum(x * torch.log(theta + EPS) + (1 - x) * torch.log(1 - theta - EPS))


# --------------------------------------------------------------------------- train.py


def _prepare(data: torch.Tensor, transpose: bool) -> torch.Tensor:
    data = data.squeeze()
    if transpose:
        data = data.transpose(0, 1)  # (seq, batch, elem)
    return (data - data.min()) / (data.max() - data.min())


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(128 + seed)
    tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
    train_set = TensorDataset(digits.upscaled(tr_x, x_dim), tr_y)  # ToTensor: (N, 1, 16, 16) in [0, 1]
    test_set = TensorDataset(digits.upscaled(te_x, x_dim), te_y)
    gen = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=gen)
    test_loader = DataLoader(test_set, batch_size=batch_size, shuffle=True, generator=gen)
    transpose = variant != "not_transposed"

    model = VRNN(x_dim, h_dim, z_dim, n_layers, detach_state=variant == "hidden_state_detached")
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    def loss_fn(out, _labels):
        return out[0] + out[1]

    first_x, first_y = next(iter(DataLoader(train_set, batch_size=batch_size)))
    probe_batch = (_prepare(first_x, transpose), first_y)
    nx.preflight(model, probe_batch, loss_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    train_losses: list[float] = []
    for _epoch in range(1, n_epochs + 1):
        train_loss = 0.0
        for _batch_idx, (data, _) in enumerate(train_loader):
            data = _prepare(data, transpose)
            optimizer.zero_grad()
            kld_loss, nll_loss, _, _ = model(data)
            loss = kld_loss + nll_loss
            loss.backward()
            optimizer.step()
            nn.utils.clip_grad_norm_(model.parameters(), clip)  # after the step, as published
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_loss += loss.item()
        train_losses.append(train_loss / len(train_loader.dataset))
        mean_kld, mean_nll = test(model, test_loader, transpose)
        nx.timed(lambda: mon.log(mean_kld + mean_nll, split="val"))  # noqa: B023

    nx.finish(mon, model, probe_batch, loss_fn, optimizer=optimizer)
    return {
        "train_loss": train_losses[-1],
        "test_kld": mean_kld,
        "test_nll": mean_nll,
        "heldout_nelbo": heldout_nelbo(model, test_set.tensors[0], seed),
    }


def test(model: VRNN, test_loader: DataLoader, transpose: bool) -> tuple[float, float]:
    mean_kld_loss, mean_nll_loss = 0.0, 0.0
    with torch.no_grad():
        for data, _ in test_loader:
            data = _prepare(data, transpose)
            kld_loss, nll_loss, _, _ = model(data)
            mean_kld_loss += kld_loss.item()
            mean_nll_loss += nll_loss.item()
    return mean_kld_loss / len(test_loader.dataset), mean_nll_loss / len(test_loader.dataset)


# --------------------------------------------------------------------------- measure only


def heldout_nelbo(model: VRNN, images: torch.Tensor, seed: int, draws: int = 4) -> float:
    """KLD + NLL per held-out image, the digits laid out time-major as the model expects."""
    x = images.squeeze(1).transpose(0, 1)  # (16 rows, N, 16)
    total = 0.0
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(10_000 + seed)
        for _ in range(draws):
            kld, nll, _, _ = model(x)
            total += (kld + nll).item()
    return total / draws / images.shape[0]
