"""Port of MorvanZhou/PyTorch-Tutorial: the MLP autoencoder. Images flattened to vectors,
an encoder of ``Linear``+``Tanh`` layers down to a 3-number code and a mirrored decoder
ending in ``Sigmoid`` (pixels in [0, 1]); ``MSELoss`` between the reconstruction and the
image itself, Adam(lr=0.005), minibatches of 64 from a shuffling ``DataLoader``.

Source: github.com/MorvanZhou/PyTorch-Tutorial, ``tutorial-contents/404_autoencoder.py`` at
commit dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7 (MIT, Copyright (c) 2017 MorvanZhou). Written
anew from the facts of that file; no code copied.

Kept: ``AutoEncoder`` (encoder ``Linear(D, 128)``, Tanh, ``Linear(128, 64)``, Tanh,
``Linear(64, 12)``, Tanh, ``Linear(12, 3)``; decoder ``Linear(3, 12)``, Tanh, ``Linear(12, 64)``,
Tanh, ``Linear(64, 128)``, Tanh, ``Linear(128, D)``, Sigmoid; ``forward`` returns
``(encoded, decoded)``), Adam at ``LR = 0.005``, ``MSELoss``, ``BATCH_SIZE = 64``,
``DataLoader(shuffle=True)`` of (image, label) pairs, the loop (``b_x = x.view(-1, D)``,
``b_y = x.view(-1, D)``, forward, loss against ``b_y``, ``zero_grad``, ``backward``, ``step``),
the ``step % 100 == 0`` print (its loss kept as a number), images scaled to [0, 1] as
``ToTensor`` does.
Replaced/shrunk: scikit-learn's 8x8 digits (1,797 images, D = 64, pixel values 0..16 divided by
16) instead of MNIST 28x28 (D = 784); 30 epochs instead of 10 (29 steps an epoch instead of
938); ``torch.manual_seed`` instead of the commented-out seed; the matplotlib views and the 3-D
code plot dropped.
Measure only (not in the program): after training, the reconstruction MSE of all 1,797 images
on the [0, 1] pixel scale (the decoded output against the image divided by 16).

nndx, as the author would add it: a preflight ``nndx.probe`` of the autoencoder with its Adam,
the first (b_x, b_y) batch of the loader, the ``MSELoss`` applied to the decoded half of the
output (the model returns a tuple; no ``data``: the program has no held-out split); ``nndx.Monitor(autoencoder,
optimizer)`` around the loop with each step's loss logged; ``nndx.probe(..., monitor=mon)``
on the same batch after training.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils.data as Data
from sklearn.datasets import load_digits

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "morvan_autoencoder"
SOURCE = Source("MorvanZhou/PyTorch-Tutorial", "tutorial-contents/404_autoencoder.py",
                "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 8x8 digits scaled to [0, 1], 30 epochs)"),
        Variant(
            "pixels_not_scaled",
            "the images are fed as raw pixel values (0..16 here, 0..255 for MNIST) instead of scaled to [0, 1] as "
            "ToTensor does: the same unscaled tensor is the input and the MSE target of a Sigmoid output",
            (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
            ("https://github.com/keras-team/keras/issues/3642",
             "https://github.com/www0wwwjs1/Matrix-Capsules-EM-Tensorflow/issues/51",
             "https://github.com/timsainb/Tensorflow-MultiGPU-VAE-GAN/issues/5"),
            Measure("recon_mse01", "reconstruction MSE on the [0, 1] pixel scale at least 2x the healthy run's",
                    lambda healthy, buggy: buggy > 2.0 * healthy),
        ),
        Variant(
            "no_zero_grad",
            "optimizer.zero_grad() is left out of the loop: every backward adds to the gradients of all the "
            "steps before it",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7",
             "https://github.com/wenet-e2e/wekws/pull/73"),
            Measure("recon_mse01", "reconstruction MSE on the [0, 1] pixel scale at least 1.3x the healthy run's",
                    lambda healthy, buggy: buggy > 1.3 * healthy),
        ),
    )
}

EPOCH = 30
BATCH_SIZE = 64
LR = 0.005
D = 8 * 8


class AutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(D, 128),
            nn.Tanh(),
            nn.Linear(128, 64),
            nn.Tanh(),
            nn.Linear(64, 12),
            nn.Tanh(),
            nn.Linear(12, 3),  # compress to 3 features
        )
        self.decoder = nn.Sequential(
            nn.Linear(3, 12),
            nn.Tanh(),
            nn.Linear(12, 64),
            nn.Tanh(),
            nn.Linear(64, 128),
            nn.Tanh(),
            nn.Linear(128, D),
            nn.Sigmoid(),  # compress to a range (0, 1)
        )

    def forward(self, x: torch.Tensor):
        encoded = self.encoder(x)
        decoded = self.decoder(encoded)
        return encoded, decoded


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    unscaled = variant == "pixels_not_scaled"
    zero_grad = variant != "no_zero_grad"

    digits = load_digits()
    raw = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)  # (1797, 1, 8, 8), 0..16
    images = raw if unscaled else raw / 16.0  # ToTensor's scaling to [0, 1]
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_data = Data.TensorDataset(images, labels)
    train_loader = Data.DataLoader(dataset=train_data, batch_size=BATCH_SIZE, shuffle=True)

    autoencoder = AutoEncoder()
    optimizer = torch.optim.Adam(autoencoder.parameters(), lr=LR)
    loss_func = nn.MSELoss()

    def decoded_loss(output, target):  # the model returns (encoded, decoded); the loss is on decoded
        return loss_func(output[1], target)

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        x0, _ = next(iter(train_loader))
    probe_batch = (x0.view(-1, D), x0.view(-1, D))
    flat = images.view(-1, D)
    nx.preflight(autoencoder, probe_batch, decoded_loss, optimizer=optimizer)
    mon = nx.monitor(autoencoder, optimizer, every=10)

    printed = []
    for epoch in range(EPOCH):
        for step, (x, b_label) in enumerate(train_loader):
            b_x = x.view(-1, D)
            b_y = x.view(-1, D)

            encoded, decoded = autoencoder(b_x)

            loss = loss_func(decoded, b_y)
            if zero_grad:
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))

            if step % 100 == 0:
                printed.append(loss.item())  # print('Epoch: ', epoch, '| train loss: %.4f' % loss)

    nx.finish(mon, autoencoder, probe_batch, decoded_loss, optimizer=optimizer)

    with torch.no_grad():
        _, decoded_all = autoencoder((raw / 16.0).view(-1, D) if not unscaled else flat)
        recon01 = torch.mean((decoded_all - (raw / 16.0).view(-1, D)) ** 2).item()
    return {"recon_mse01": recon01, "first_printed_loss": printed[0], "last_printed_loss": printed[-1],
            "last_train_loss": loss.item()}
