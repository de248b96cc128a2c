"""Port of d2l-ai/d2l-en's first GAN (PyTorch tab): a one-layer linear generator learns to
imitate a shifted, skewed 2-D Gaussian against a three-layer tanh MLP discriminator.

Source: github.com/d2l-ai/d2l-en, ``chapter_generative-adversarial-networks/gan.md`` at commit
23d7a5aecceee57d1292c56e90cce307f183bb0a (sample code MIT-0, text CC BY-SA 4.0). Written anew
from the facts of that section; no code copied.

Kept: the data (``X = normal(0, 1, (1000, 2))``, ``A = [[1, 2], [-0.1, 0.5]]``, ``b = [1, 2]``,
``data = X @ A + b``); ``batch_size = 8`` and ``d2l.load_array((data,), batch_size)`` (a
shuffling ``DataLoader`` over a ``TensorDataset``; taken from :mod:`bench.programs.d2l_v017`,
with its ``Accumulator``); ``net_G = nn.Sequential(nn.Linear(2, 2))``; ``net_D`` =
``Linear(2, 5)``, ``Tanh``, ``Linear(5, 3)``, ``Tanh``, ``Linear(3, 1)``; ``update_D`` (zero
``trainer_D``, ``net_D`` on the real batch and on ``net_G(Z).detach()``, the mean of the two
losses against ones and zeros reshaped to the output, backward, step, returns the loss tensor);
``update_G`` (zero ``trainer_G``, ``net_G(Z)`` recomputed, ``net_D`` on it, loss against ones,
backward, step, returns the loss tensor); ``train``: ``nn.BCEWithLogitsLoss(reduction='sum')``,
every parameter of both nets re-initialised ``normal_(w, 0, 0.02)``, ``torch.optim.Adam`` over
each net with ``lr_D`` / ``lr_G``, per epoch an ``Accumulator(3)`` of the two losses and the
batch size, per batch ``Z = torch.normal(0, 1, (batch_size, latent_dim))``, ``update_D`` then
``update_G``; the hyperparameters ``lr_D, lr_G, latent_dim, num_epochs = 0.05, 0.005, 2, 20``.
Shrunk: nothing (the section is CPU-sized already). Left out: the ``Animator`` plots and the
scatter of 100 generated points each epoch (the generated batch of 100 is still drawn, so the
random stream is the book's), the timer.
Measure only (not in the program): after training, 2,000 generated points compared with the
1,000 real ones: the distance between their means and the Frobenius norm of the difference of
their covariances.

nndx, as the author would add it: a preflight ``nndx.probe`` per net, after ``train``
initialises them and builds the optimizers: ``net_D`` on a batch of 8 real and 8 generated
points with labels ones/zeros and the same ``BCEWithLogitsLoss``; ``net_G`` on a batch of
noise with ones as targets and, as loss, ``update_G``'s: the loss of ``net_D`` on the
generated points against ones. ``nndx.Monitor(net_D, trainer_D)`` and ``nndx.Monitor(net_G,
trainer_G)`` around the epochs, each batch's ``update_D`` / ``update_G`` loss logged where the
loop accumulates them; after training ``nndx.probe(..., monitor=mon)`` for each net on fresh
batches of the same kind, each diagnosed; the author reads both, ranked together.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.programs import d2l_v017 as d2l
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_gan"
SOURCE = Source("d2l-ai/d2l-en", "chapter_generative-adversarial-networks/gan.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (code) / CC-BY-SA-4.0 (text)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section's GAN as published (20 epochs over 1,000 Gaussian points, batch 8)"),
        Variant(
            "generator_fake_labels",
            "update_G scores the generated points against zeros (the fake label) instead of ones: the generator "
            "minimises the discriminator's error on fakes, i.e. it helps the discriminator and runs away from "
            "the data instead of imitating it",
            (C.WRONG_LOSS,),
            ("https://github.com/keras-team/keras-io/issues/361",
             "https://github.com/ptran1203/pytorch-animeGAN/issues/17",
             "https://github.com/keras-team/keras-io/issues/284"),
            Measure("mean_error", "distance between the generated and the real mean at least 3x the healthy "
                    "run's and at least 0.5 above it",
                    lambda healthy, buggy: not buggy < max(3.0 * healthy, healthy + 0.5)),
        ),
        Variant(
            "generator_optimizer_on_discriminator",
            "trainer_G is built over net_D.parameters() (a copy-paste of the trainer_D line): update_G's step "
            "moves the discriminator toward calling fakes real and the generator is never updated",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/ufal/npfl138/issues/57",
             "https://github.com/Lornatang/ESRGAN-PyTorch/issues/39",
             "https://github.com/wiseodd/controlled-text-generation/issues/15"),
            Measure("mean_error", "distance between the generated and the real mean at least 3x the healthy "
                    "run's and at least 0.5 above it",
                    lambda healthy, buggy: not buggy < max(3.0 * healthy, healthy + 0.5)),
        ),
    )
}

BATCH_SIZE = 8
LR_D, LR_G, LATENT_DIM, NUM_EPOCHS = 0.05, 0.005, 2, 20


def update_D(X, Z, net_D, net_G, loss, trainer_D):
    """Update discriminator."""
    batch_size = X.shape[0]
    ones = torch.ones((batch_size,), device=X.device)
    zeros = torch.zeros((batch_size,), device=X.device)
    trainer_D.zero_grad()
    real_Y = net_D(X)
    fake_X = net_G(Z)
    # Do not need to compute gradient for `net_G`, detach it from computing gradients.
    fake_Y = net_D(fake_X.detach())
    loss_D = (loss(real_Y, ones.reshape(real_Y.shape)) + loss(fake_Y, zeros.reshape(fake_Y.shape))) / 2
    loss_D.backward()
    trainer_D.step()
    return loss_D


def make_update_G(variant: str):
    fake_labels = variant == "generator_fake_labels"

    def update_G(Z, net_D, net_G, loss, trainer_G):
        """Update generator."""
        batch_size = Z.shape[0]
        ones = torch.ones((batch_size,), device=Z.device)
        target = torch.zeros((batch_size,), device=Z.device) if fake_labels else ones
        trainer_G.zero_grad()
        # We could reuse `fake_X` from `update_D` to save computation
        fake_X = net_G(Z)
        # Recomputing `fake_Y` is needed since `net_D` is changed
        fake_Y = net_D(fake_X)
        loss_G = loss(fake_Y, target.reshape(fake_Y.shape))
        loss_G.backward()
        trainer_G.step()
        return loss_G

    return update_G


def train_gan(net_D, net_G, data_iter, num_epochs, lr_D, lr_G, latent_dim, data, variant: str, nx: Nndx, seed: int):
    update_G = make_update_G(variant)
    loss = nn.BCEWithLogitsLoss(reduction="sum")
    for w in net_D.parameters():
        nn.init.normal_(w, 0, 0.02)
    for w in net_G.parameters():
        nn.init.normal_(w, 0, 0.02)
    trainer_D = torch.optim.Adam(net_D.parameters(), lr=lr_D)
    g_params = net_D.parameters() if variant == "generator_optimizer_on_discriminator" else net_G.parameters()
    trainer_G = torch.optim.Adam(g_params, lr=lr_G)

    # nndx: probe batches drawn from their own generator, so the program's random stream is untouched
    probe_gen = torch.Generator().manual_seed(10_000 + seed)

    def probe_batches():
        idx = torch.randint(0, len(data), (BATCH_SIZE,), generator=probe_gen)
        z = torch.normal(0, 1, size=(BATCH_SIZE, latent_dim), generator=probe_gen)
        with torch.no_grad():
            fake = net_G(z)
        ones, zeros = torch.ones(BATCH_SIZE, 1), torch.zeros(BATCH_SIZE, 1)
        d_batch = (torch.cat([data[idx], fake]), torch.cat([ones, zeros]))
        g_batch = (z, ones)
        return d_batch, g_batch

    def g_loss_fn(fake_X, ones):
        return loss(net_D(fake_X), ones.reshape(-1, 1))

    d_batch, g_batch = probe_batches()
    nx.preflight(net_D, d_batch, loss, optimizer=trainer_D)
    nx.preflight(net_G, g_batch, g_loss_fn, optimizer=trainer_G)
    mon_D = nx.monitor(net_D, trainer_D, every=10)
    mon_G = nx.monitor(net_G, trainer_G, every=10)

    history = []
    for _epoch in range(num_epochs):
        # Train one epoch
        metric = d2l.Accumulator(3)  # loss_D, loss_G, num_examples
        for (X,) in data_iter:
            batch_size = X.shape[0]
            Z = torch.normal(0, 1, size=(batch_size, latent_dim))
            loss_D = update_D(X, Z, net_D, net_G, loss, trainer_D)
            loss_G = update_G(Z, net_D, net_G, loss, trainer_G)
            nx.timed(lambda: mon_D.log(loss_D))  # noqa: B023
            nx.timed(lambda: mon_G.log(loss_G))  # noqa: B023
            metric.add(loss_D, loss_G, batch_size)
        # Visualize generated examples (the plot left out; the draw kept)
        Z = torch.normal(0, 1, size=(100, latent_dim))
        _fake_X = net_G(Z).detach().numpy()
        # Show the losses
        loss_D_avg, loss_G_avg = metric[0] / metric[2], metric[1] / metric[2]
        history.append((loss_D_avg, loss_G_avg))

    d_batch, g_batch = probe_batches()
    nx.finish(mon_D, net_D, d_batch, loss, optimizer=trainer_D)
    nx.finish(mon_G, net_G, g_batch, g_loss_fn, optimizer=trainer_G)
    return history


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    X = torch.normal(0.0, 1, (1000, 2))
    A = torch.tensor([[1, 2], [-0.1, 0.5]])
    b = torch.tensor([1, 2])
    data = torch.matmul(X, A) + b

    batch_size = BATCH_SIZE
    data_iter = d2l.load_array((data,), batch_size)

    net_G = nn.Sequential(nn.Linear(2, 2))
    net_D = nn.Sequential(nn.Linear(2, 5), nn.Tanh(), nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 1))

    history = train_gan(net_D, net_G, data_iter, NUM_EPOCHS, LR_D, LR_G, LATENT_DIM, data, variant, nx, seed)

    # measure only: the generated distribution against the real one
    eval_gen = torch.Generator().manual_seed(20_000 + seed)
    with torch.no_grad():
        fake = net_G(torch.normal(0, 1, size=(2000, LATENT_DIM), generator=eval_gen))
    mean_error = (fake.mean(0) - data.mean(0)).norm().item()
    cov_error = (torch.cov(fake.T) - torch.cov(data.T)).norm().item()
    return {"mean_error": mean_error, "cov_error": cov_error, "loss_D_last_epoch": history[-1][0],
            "loss_G_last_epoch": history[-1][1]}  # fmt: skip
