"""Port of timbmg/VAE-CVAE-MNIST (an MLP variational auto-encoder whose encoder and decoder
are both conditioned on the one-hot digit label: the conditional VAE).

Source: github.com/timbmg/VAE-CVAE-MNIST, ``models.py``, ``train.py`` and ``utils.py`` at
commit 4f1b22367a5c5cff88bf97ce78219132aa9fd977 (no licence stated: no LICENSE file in the
repository). Written anew from the facts of those files; no code copied.

Kept: ``VAE(encoder_layer_sizes, latent_size, decoder_layer_sizes, conditional=True,
num_labels=10)``; ``Encoder``: ``idx2onehot(c, n=10)`` (a ``scatter_`` into zeros)
concatenated to the flattened image, an ``MLP`` of ``Linear`` + ``ReLU`` layers over the
layer sizes (the first grown by the 10 labels), ``linear_means`` and ``linear_log_var``;
``reparameterize`` (``mu + randn_like(std) * exp(0.5 * log_var)``, in train and eval alike);
``Decoder``: ``z`` concatenated with the one-hot label, ``Linear`` + ``ReLU`` layers and a
last ``Linear`` + ``Sigmoid``; ``forward`` returning ``(recon_x, means, log_var, z)`` and
``inference(z, c)``; ``train.py``'s ``loss_fn`` (``binary_cross_entropy`` summed over
pixels and batch + ``-0.5 * sum(1 + log_var - mean^2 - exp(log_var))``, divided by the
batch size); ``Adam(lr=1e-3)``; ``batch_size`` 64; a shuffled ``DataLoader`` over
``(image, label)`` pairs from ``ToTensor`` (pixels in [0, 1]); the loop (forward with
``(x, y)``, the per-sample ``tracker_epoch`` of ``z[:, :2]`` and labels, loss,
``zero_grad``, ``backward``, ``step``, ``logs['loss']``), and every ``print_every``
iterations the ``inference`` of one ``z ~ N(0, I)`` per class ``c = 0..9`` (kept as
tensors instead of matplotlib figures); ``latent_size`` 2 (the default); ``seed`` 0
through ``torch.manual_seed``.
Shrunk: scikit-learn's 8x8 digits (64 pixels, 1,437 train / 360 held out) instead of
MNIST's 28x28; layer sizes [64, 128] / [128, 64] instead of [784, 256] / [256, 784]; 20
epochs instead of 10 (23 batches an epoch instead of 938); no figures, seaborn plots or
pandas frames.
Measure only (not in the program, which has no test split): the held-out negative ELBO
per sample (``loss_fn`` on the 360 held-out digits with their labels), and
``cond_acc``: 50 samples per class drawn with ``inference`` from ``z ~ N(0, I)``, the share
that a logistic regression trained on the real training digits assigns to the class
they were conditioned on.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first 64 training
pairs (inputs ``(x, y)``, the model's call; target ``x``) with ``loss_fn`` unpacking the
output tuple, the optimizer, and the train and held-out images with their labels as
``data``; ``nndx.Monitor(vae, optimizer)`` around the epochs, each batch's loss logged;
then ``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "cvae"
SOURCE = Source("timbmg/VAE-CVAE-MNIST", "train.py", "4f1b22367a5c5cff88bf97ce78219132aa9fd977",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published, run with --conditional"),
        Variant(
            "labels_not_shuffled_with_images",
            "the training images shuffled in place once (np.random.shuffle) before the dataset is built, the "
            "label array left in its order: each image is conditioned on another image's digit",
            (C.LABELS_MISALIGNED,),
            ("https://github.com/amoodie/StratGAN/issues/3",
             "https://github.com/dennybritz/cnn-text-classification-tf/issues/136",
             "https://github.com/caicloud/tensorflow-tutorial/issues/114",
             "https://github.com/keras-team/keras/pull/7520"),
            Measure("cond_acc", "share of class-conditioned samples classified as their class, 0.3 below the "
                    "healthy run's or more", lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "bce_with_logits_after_sigmoid",
            "binary_cross_entropy swapped for binary_cross_entropy_with_logits ('numerically stable') while the "
            "decoder still ends in Sigmoid: the loss squashes the probabilities a second time",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/itakurah/focal-loss-pytorch/pull/5",
             "https://github.com/Turoad/lanedet/issues/32",
             "https://github.com/lopuhin/kaggle-imet-2019/issues/3"),
            Measure("test_nelbo", "held-out negative ELBO per sample (the published loss on the decoder's "
                    "probabilities) 5 nats above the healthy run's or more",
                    lambda healthy, buggy: not buggy < healthy + 5.0),
        ),
    )
}

ARGS = {"epochs": 20, "batch_size": 64, "learning_rate": 1e-3, "encoder_layer_sizes": [64, 128],
        "decoder_layer_sizes": [128, 64], "latent_size": 2, "print_every": 10}  # fmt: skip
PIXELS = 64
SAMPLES_PER_CLASS = 50


# --------------------------------------------------------------------------- utils.py / models.py


def idx2onehot(idx: torch.Tensor, n: int) -> torch.Tensor:
    assert torch.max(idx).item() < n
    if idx.dim() == 1:
        idx = idx.unsqueeze(1)
    onehot = torch.zeros(idx.size(0), n)
    onehot.scatter_(1, idx, 1)
    return onehot


class Encoder(nn.Module):
    def __init__(self, layer_sizes: list[int], latent_size: int, conditional: bool, num_labels: int) -> None:
        super().__init__()
        self.conditional = conditional
        if conditional:
            layer_sizes[0] += num_labels
        self.MLP = nn.Sequential()
        for i, (in_size, out_size) in enumerate(zip(layer_sizes[:-1], layer_sizes[1:])):
            self.MLP.add_module(name=f"L{i:d}", module=nn.Linear(in_size, out_size))
            self.MLP.add_module(name=f"A{i:d}", module=nn.ReLU())
        self.linear_means = nn.Linear(layer_sizes[-1], latent_size)
        self.linear_log_var = nn.Linear(layer_sizes[-1], latent_size)

    def forward(self, x, c=None):
        if self.conditional:
            x = torch.cat((x, idx2onehot(c, n=10)), dim=-1)
        x = self.MLP(x)
        return self.linear_means(x), self.linear_log_var(x)


class Decoder(nn.Module):
    def __init__(self, layer_sizes: list[int], latent_size: int, conditional: bool, num_labels: int) -> None:
        super().__init__()
        self.conditional = conditional
        input_size = latent_size + num_labels if conditional else latent_size
        self.MLP = nn.Sequential()
        for i, (in_size, out_size) in enumerate(zip([input_size] + layer_sizes[:-1], layer_sizes)):
            self.MLP.add_module(name=f"L{i:d}", module=nn.Linear(in_size, out_size))
            if i + 1 < len(layer_sizes):
                self.MLP.add_module(name=f"A{i:d}", module=nn.ReLU())
            else:
                self.MLP.add_module(name="sigmoid", module=nn.Sigmoid())

    def forward(self, z, c):
        if self.conditional:
            z = torch.cat((z, idx2onehot(c, n=10)), dim=-1)
        return self.MLP(z)


class VAE(nn.Module):
    def __init__(self, encoder_layer_sizes: list[int], latent_size: int, decoder_layer_sizes: list[int],
                 conditional: bool = False, num_labels: int = 0) -> None:  # fmt: skip
        super().__init__()
        if conditional:
            assert num_labels > 0
        self.latent_size = latent_size
        self.encoder = Encoder(encoder_layer_sizes, latent_size, conditional, num_labels)
        self.decoder = Decoder(decoder_layer_sizes, latent_size, conditional, num_labels)

    def forward(self, x, c=None):
        if x.dim() > 2:
            x = x.view(-1, PIXELS)
        means, log_var = self.encoder(x, c)
        z = self.reparameterize(means, log_var)
        return self.decoder(z, c), means, log_var, z

    def reparameterize(self, mu, log_var):
        std = torch.exp(0.5 * log_var)
        return mu + torch.randn_like(std) * std

    def inference(self, z, c=None):
        return self.decoder(z, c)


# --------------------------------------------------------------------------- train.py


def make_loss_fn(variant: str):
    bce_fn = torch.nn.functional.binary_cross_entropy
    if variant == "bce_with_logits_after_sigmoid":
        bce_fn = torch.nn.functional.binary_cross_entropy_with_logits

    def loss_fn(recon_x, x, mean, log_var):
        bce = bce_fn(recon_x.view(-1, PIXELS), x.view(-1, PIXELS), reduction="sum")
        kld = -0.5 * torch.sum(1 + log_var - mean.pow(2) - log_var.exp())
        return (bce + kld) / x.size(0)

    return loss_fn


def published_loss(recon_x, x, mean, log_var):
    """The published loss_fn (BCE summed): the held-out measure for every variant."""
    bce = torch.nn.functional.binary_cross_entropy(recon_x.view(-1, PIXELS), x.view(-1, PIXELS), reduction="sum")
    kld = -0.5 * torch.sum(1 + log_var - mean.pow(2) - log_var.exp())
    return (bce + kld) / x.size(0)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x = data.to_tensor(train_images)  # (N, 1, 8, 8) in [0, 1]
    test_x = data.to_tensor(test_images)
    if variant == "labels_not_shuffled_with_images":
        order = np.random.default_rng(seed + 7).permutation(len(train_x))
        train_x = train_x[torch.from_numpy(order)]  # the images alone shuffled; train_labels as they were
    dataset = TensorDataset(train_x, train_labels)
    data_loader = DataLoader(dataset=dataset, batch_size=args["batch_size"], shuffle=True,
                             generator=torch.Generator().manual_seed(seed))  # fmt: skip

    loss_fn = make_loss_fn(variant)
    vae = VAE(encoder_layer_sizes=list(args["encoder_layer_sizes"]), latent_size=args["latent_size"],
              decoder_layer_sizes=list(args["decoder_layer_sizes"]), conditional=True, num_labels=10)  # fmt: skip
    optimizer = torch.optim.Adam(vae.parameters(), lr=args["learning_rate"])

    def cvae_loss(output, x):
        return loss_fn(output[0], x, output[1], output[2])

    first_batch = ((train_x[: args["batch_size"]], train_labels[: args["batch_size"]]), train_x[: args["batch_size"]])
    splits = (train_x, train_labels, test_x, test_labels)
    nx.preflight(vae, first_batch, cvae_loss, optimizer=optimizer, data=splits)
    mon = nx.monitor(vae, optimizer, every=10)

    logs = defaultdict(list)
    figures = []
    for epoch in range(args["epochs"]):
        tracker_epoch = defaultdict(lambda: defaultdict(dict))
        for iteration, (x, y) in enumerate(data_loader):
            recon_x, mean, log_var, z = vae(x, y)
            for i, yi in enumerate(y):
                k = len(tracker_epoch)
                tracker_epoch[k]["x"], tracker_epoch[k]["y"] = z[i, 0].item(), z[i, 1].item()
                tracker_epoch[k]["label"] = yi.item()
            loss = loss_fn(recon_x, x, mean, log_var)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            logs["loss"].append(loss.item())
            nx.timed(lambda: mon.log(loss))
            if iteration % args["print_every"] == 0 or iteration == len(data_loader) - 1:
                with torch.no_grad():
                    c = torch.arange(0, 10).long().unsqueeze(1)
                    zs = torch.randn([c.size(0), args["latent_size"]])
                    figures.append(vae.inference(zs, c=c))  # the figure's ten digits

    nx.finish(mon, vae, first_batch, cvae_loss, optimizer=optimizer, data=splits)

    # measure only: the held-out ELBO and the class-conditioned samples
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        recon, mean, log_var, _ = vae(test_x, test_labels)
        test_nelbo = published_loss(recon, test_x, mean, log_var).item()
        c = torch.arange(10).repeat_interleave(SAMPLES_PER_CLASS)
        zs = torch.randn(len(c), args["latent_size"], generator=generator)
        samples = vae.inference(zs, c=c.unsqueeze(1))
    from sklearn.linear_model import LogisticRegression

    real_x, _, _, _ = data.digit_images(seed=seed)
    clf = LogisticRegression(max_iter=2000).fit(data.to_tensor(real_x).view(-1, PIXELS).numpy(),
                                                data.digit_images(seed=seed)[1].numpy())  # fmt: skip
    cond_acc = float((clf.predict(samples.numpy()) == c.numpy()).mean())
    return {"test_nelbo": test_nelbo, "cond_acc": cond_acc, "final_train_loss": float(np.mean(logs["loss"][-23:]))}
