"""Port of Atcold/NYU-DLSP20 ``10-autoencoder.ipynb``: a one-hidden-layer autoencoder
(Linear + Tanh encoder, Linear + Tanh decoder) on MNIST scaled to [-1, 1], MSE
reconstruction loss, Adam.

Source: github.com/Atcold/NYU-DLSP20, ``10-autoencoder.ipynb`` at commit
3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd (CC BY-NC-SA 4.0, Alfredo Canziani). Written anew
from the facts of that notebook; no code copied.

Kept: ``transforms.Compose([ToTensor(), Normalize((0.5,), (0.5,))])`` (pixels to [-1, 1]);
a shuffling ``DataLoader`` with ``batch_size = 256``; ``d = 30`` (the standard, under-complete
AE); ``Autoencoder`` = ``encoder = Sequential(Linear(28 * 28, d), Tanh())``, ``decoder =
Sequential(Linear(d, 28 * 28), Tanh())``; ``criterion = nn.MSELoss()``; ``Adam(model.parameters(),
lr=1e-3)``; the loop (``img.view(img.size(0), -1)``, ``output = model(img)``, ``loss =
criterion(output, img.data)``, ``zero_grad``, ``backward``, ``step``; the last batch's loss
printed once per epoch); ``num_epochs = 20``. The notebook's denoising switch
(``nn.Dropout()`` mask, ``d = 500``) is not used: the healthy program is the standard AE the
notebook runs as written.
Shrunk / replaced: scikit-learn's 8x8 digits (1,437 train images) upsampled (bilinear) to
28x28 instead of MNIST's 60,000 (so 6 batches an epoch, 120 steps); CPU; no image display.
Measure only (not in the program): after training, the reconstruction error of the whole
train set in pixel units ([0, 1]: the output undone by the variant's own normalisation), in
``eval``-free ``no_grad`` (the model has no dropout or batch norm).

nndx, as the author would add it (README quick start): a preflight ``nndx.probe`` of the
model on the first batch, as ``(img, img)`` (an autoencoder's target is its input), with the
``MSELoss`` and the Adam optimizer; ``nndx.Monitor(model, optimizer, every=10)`` around the
loop, each batch's loss logged; ``nndx.probe(..., monitor=mon)`` on the same batch after.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "nyu_autoencoder"
SOURCE = Source("Atcold/NYU-DLSP20", "10-autoencoder.ipynb", "3049c83260ba05700e2ab9b7ed13cdbe5ddba0fd",
                "CC BY-NC-SA 4.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's standard AE as published (shrunk: 28x28 digits, 20 epochs of 6 batches)"),
        Variant(
            "model_regenerated_after_optimizer",
            "the model cell is re-run after the optimiser cell (the notebook's own switch between standard and "
            "denoising AE asks to 're-generate the model' and 're-pass the parameters to the optimiser'; the "
            "second is forgotten): Adam holds the first Autoencoder's parameters while the loop trains the new "
            "one, so the trained model is never stepped",
            (C.OPTIMIZER_NOT_CONNECTED,),
            ("https://github.com/Atcold/NYU-DLSP20/blob/master/10-autoencoder.ipynb (the notebook's own warning: "
             "'(2) re-generate the model, and (3) re-pass the parameters to the optimiser')",
             "https://github.com/spro/practical-pytorch/issues/9",
             "https://github.com/pytorch/pytorch/issues/14467"),
            Measure("recon_mse_pixels", "train-set reconstruction MSE in pixel units at least 2x the healthy run's: "
                    "0.159 against 0.030 on seed 0",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "mnist_mean_std_normalise",
            "Normalize((0.1307,), (0.3081,)) (MNIST's mean/std, the usual classifier recipe) in place of "
            "Normalize((0.5,), (0.5,)): the targets now reach (1 - 0.1307) / 0.3081 = 2.8 while the decoder ends "
            "in Tanh, so every pixel brighter than 0.44 cannot be reconstructed",
            (C.WRONG_OUTPUT_ACTIVATION,),
            ("https://github.com/mikesj-public/convolutional_autoencoder/pull/9",
             "https://github.com/fstrub95/Autoencoders_cf/issues/4",
             "https://github.com/AntixK/PyTorch-VAE/issues/108"),
            Measure("recon_mse_pixels", "train-set reconstruction MSE in pixel units at least 1.5x the healthy "
                    "run's: 0.056/0.056/0.056 against 0.030/0.029/0.030 healthy on seeds 0/1/2",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

BATCH_SIZE = 256
D = 30
LEARNING_RATE = 1e-3
NUM_EPOCHS = 20
SIDE = 28


class Autoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(SIDE * SIDE, D),
            nn.Tanh(),
        )
        self.decoder = nn.Sequential(
            nn.Linear(D, SIDE * SIDE),
            nn.Tanh(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder(x)
        x = self.decoder(x)
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    mean, std = ((0.1307,), (0.3081,)) if variant == "mnist_mean_std_normalise" else ((0.5,), (0.5,))

    # transforms.Compose([ToTensor(), Normalize(mean, std)]) on the images
    tr_raw, tr_y, _, _ = digits.digit_images(seed=seed)
    pixels = digits.upscaled(tr_raw, SIDE)  # ToTensor: (N, 1, 28, 28) in [0, 1]
    images = (pixels - mean[0]) / std[0]
    dataset = TensorDataset(images, tr_y)
    dataloader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)

    # model and reconstruction loss
    model = Autoencoder()
    criterion = nn.MSELoss()

    # the optimiser
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=LEARNING_RATE,
    )

    if variant == "model_regenerated_after_optimizer":
        model = Autoencoder()  # the model cell re-run; the optimiser cell not

    with torch.random.fork_rng():  # drawing the probe batch leaves the program's random stream alone
        probe_img, _ = next(iter(dataloader))
    probe_img = probe_img.view(probe_img.size(0), -1)
    probe_batch = (probe_img, probe_img)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)

    mon = nx.monitor(model, optimizer, every=10)
    first_loss = None
    for epoch in range(NUM_EPOCHS):
        for data in dataloader:
            img, _ = data
            img = img.view(img.size(0), -1)
            # ===================forward=====================
            output = model(img)
            loss = criterion(output, img.data)
            # ===================backward====================
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))
            if first_loss is None:
                first_loss = loss.item()
        # ===================log========================
        last_epoch_loss = loss.item()  # the notebook prints f'epoch [{epoch + 1}/{num_epochs}], loss:{loss.item():.4f}'

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)

    with torch.no_grad():
        flat = images.view(images.size(0), -1)
        recon = model(flat)
        recon_pixels = recon * std[0] + mean[0]
        recon_mse_pixels = (recon_pixels - pixels.view(pixels.size(0), -1)).pow(2).mean().item()
        recon_mse_normalised = criterion(recon, flat).item()
    return {"recon_mse_pixels": recon_mse_pixels, "recon_mse_normalised": recon_mse_normalised,
            "first_loss": first_loss, "last_epoch_loss": last_epoch_loss}  # fmt: skip
