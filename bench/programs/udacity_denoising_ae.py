"""Port of udacity/deep-learning-v2-pytorch's convolutional denoising autoencoder: a conv
encoder (three ``Conv2d`` + ReLU + max-pool), a transposed-conv decoder and a sigmoid output,
trained with MSE and Adam to map noisy images (Gaussian noise, clipped to [0, 1]) to the
clean ones.

Source: github.com/udacity/deep-learning-v2-pytorch,
``autoencoder/denoising-autoencoder/Denoising_Autoencoder_Solution.ipynb`` at commit
c9404fc86181fc3f0906b368697268257f348535 (MIT, Copyright (c) 2018 Udacity). Written anew from
the facts of that notebook; no code copied.

Kept: ``ConvDenoiser``: encoder ``Conv2d(1, 32, 3, padding=1)``, ``Conv2d(32, 16, 3,
padding=1)``, ``Conv2d(16, 8, 3, padding=1)``, each ``F.relu`` then ``MaxPool2d(2, 2)`` (28 ->
14 -> 7 -> 3); decoder ``ConvTranspose2d(8, 8, 3, stride=2)`` (3 -> 7), ``ConvTranspose2d(8,
16, 2, stride=2)`` (-> 14), ``ConvTranspose2d(16, 32, 2, stride=2)`` (-> 28), each ``F.relu``,
then ``Conv2d(32, 1, 3, padding=1)`` and ``F.sigmoid``; ``nn.MSELoss()``;
``torch.optim.Adam(model.parameters(), lr=0.001)``; ``noise_factor = 0.5``; batch size 20, the
train loader not shuffled (as published); per batch ``noisy_imgs = images + noise_factor *
torch.randn(*images.shape)``, ``noisy_imgs = np.clip(noisy_imgs, 0., 1.)`` (numpy dispatches to
the tensor's own ``clip``, i.e. ``torch.clamp``), ``optimizer.zero_grad()``, ``outputs =
model(noisy_imgs)``, ``loss = criterion(outputs, images)``, ``backward``, ``step``, ``train_loss
+= loss.item() * images.size(0)``; per epoch ``train_loss / len(train_loader)`` (printed in the
notebook).
Replaced: MNIST (``ToTensor``: 28x28 in [0, 1]) by scikit-learn's 8x8 digits scaled to [0, 1]
and resized (bilinear) to 28x28 so the layer shapes stay the notebook's (1,437 train / 360 test
images). Shrunk: 10 epochs of 72 batches instead of 20 of 3,000; ``torch.manual_seed(seed)``.
Measure only (the notebook only plots): the denoising error on the test images: MSE between
the output for the noisy test images (noise drawn from a fixed generator) and the clean test
images in [0, 1].

nndx, as the author would add it: a preflight ``nndx.probe(model, (noisy_imgs, images),
criterion, optimizer=optimizer)`` on the first training batch as the loop builds it (noisy input,
the target the loop uses); ``nndx.Monitor(model, optimizer, every=10)`` around the epochs, each
batch's loss logged after the step; after training ``nndx.probe(..., monitor=mon)`` on the same
batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "udacity_denoising_ae"
SOURCE = Source("udacity/deep-learning-v2-pytorch",
                "autoencoder/denoising-autoencoder/Denoising_Autoencoder_Solution.ipynb",
                "c9404fc86181fc3f0906b368697268257f348535", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 8x8 digits resized to 28x28, 10 epochs)"),
        Variant(
            "noisy_target",
            "the loss compares the output with the noisy input, criterion(outputs, noisy_imgs), instead of the "
            "clean images: the targets carry the very noise the model is meant to remove, so it learns to "
            "reproduce the noise (a grey, speckled background) rather than to denoise",
            (C.LABEL_NOISE,),
            ("https://github.com/aapatel09/handson-unsupervised-learning/issues/6",
             "https://github.com/pkmital/tensorflow_tutorials/issues/21"),
            Measure("background_level", "mean output on the test images' background pixels (clean < 0.05) at "
                    "least 0.05 above the healthy run's: the noise reproduced as a grey background (0.210 against "
                    "0.042 healthy on seed 0; test MSE 0.036 against 0.023)",
                    lambda healthy, buggy: not buggy < healthy + 0.05),
        ),
        Variant(
            "unscaled_pixels",
            "the images reach the loop as raw pixel values 0..255 (the dataset built from the uint8 image "
            "tensor cast to float, without ToTensor's division by 255): the noisy input is still clipped to "
            "[0, 1] but the clean targets are 0..255, far outside the sigmoid output's range",
            (C.UNNORMALIZED_TARGETS,),
            ("https://github.com/keras-team/keras/issues/3642",
             "https://github.com/timsainb/Tensorflow-MultiGPU-VAE-GAN/issues/5",
             "https://github.com/keras-team/keras/issues/12062"),
            Measure("test_mse", "test denoising MSE (output against the clean image in [0, 1]) at least 1.5x "
                    "the healthy run's: 0.568 against 0.023 on seed 0",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

SIDE, BATCH_SIZE, N_EPOCHS, NOISE_FACTOR, LR = 28, 20, 10, 0.5, 0.001


class ConvDenoiser(nn.Module):
    def __init__(self):
        super(ConvDenoiser, self).__init__()
        ## encoder layers ##
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        ## decoder layers ##
        self.t_conv1 = nn.ConvTranspose2d(8, 8, 3, stride=2)
        self.t_conv2 = nn.ConvTranspose2d(8, 16, 2, stride=2)
        self.t_conv3 = nn.ConvTranspose2d(16, 32, 2, stride=2)
        self.conv_out = nn.Conv2d(32, 1, 3, padding=1)

    def forward(self, x):
        ## encode ##
        x = F.relu(self.conv1(x))
        x = self.pool(x)
        x = F.relu(self.conv2(x))
        x = self.pool(x)
        x = F.relu(self.conv3(x))
        x = self.pool(x)  # compressed representation
        ## decode ##
        x = F.relu(self.t_conv1(x))
        x = F.relu(self.t_conv2(x))
        x = F.relu(self.t_conv3(x))
        x = torch.sigmoid(self.conv_out(x))  # F.sigmoid in the notebook (deprecated alias)
        return x


def _images(raw: torch.Tensor, scaled: bool) -> torch.Tensor:
    """The 8x8 uint8 digits as (N, 1, 28, 28) floats: ToTensor's [0, 1], or the raw 0..255 values."""
    if scaled:
        return digits.upscaled(raw, SIDE)
    x = F.interpolate(raw.unsqueeze(1).float(), size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    return x.clamp(0, 255)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    scaled = variant != "unscaled_pixels"
    train_data = torch.utils.data.TensorDataset(_images(tr_raw, scaled), tr_y)
    test_data = torch.utils.data.TensorDataset(_images(te_raw, scaled), te_y)
    num_workers = 0
    train_loader = torch.utils.data.DataLoader(train_data, batch_size=BATCH_SIZE, num_workers=num_workers)
    test_loader = torch.utils.data.DataLoader(test_data, batch_size=BATCH_SIZE, num_workers=num_workers)

    model = ConvDenoiser()
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    noise_factor = NOISE_FACTOR

    # the first batch as the loop builds it, for nndx (its noise drawn aside: the loop's stream is untouched)
    first_images, _ = next(iter(train_loader))
    with torch.random.fork_rng():
        first_noisy = np.clip(first_images + noise_factor * torch.randn(*first_images.shape), 0.0, 1.0)
    first_target = first_noisy if variant == "noisy_target" else first_images
    probe_batch = (first_noisy, first_target)
    nx.preflight(model, probe_batch, criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    epoch_losses = []
    for epoch in range(1, N_EPOCHS + 1):
        train_loss = 0.0
        for data in train_loader:
            images, _ = data
            noisy_imgs = images + noise_factor * torch.randn(*images.shape)
            noisy_imgs = np.clip(noisy_imgs, 0.0, 1.0)
            optimizer.zero_grad()
            outputs = model(noisy_imgs)
            if variant == "noisy_target":
                loss = criterion(outputs, noisy_imgs)
            else:
                loss = criterion(outputs, images)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            train_loss += loss.item() * images.size(0)
        train_loss = train_loss / len(train_loader)
        epoch_losses.append(train_loss)

    nx.finish(mon, model, probe_batch, criterion, optimizer=optimizer)

    # measure: denoising error on the test images, in [0, 1] pixel units, noise from a fixed generator
    gen = torch.Generator().manual_seed(1000 + seed)
    sq_err, n_pix, noisy_err, bg_sum, bg_n = 0.0, 0, 0.0, 0.0, 0
    with torch.no_grad():
        for images, _ in test_loader:
            clean = images / 255.0 if not scaled else images
            noisy = np.clip(images + noise_factor * torch.randn(*images.shape, generator=gen), 0.0, 1.0)
            output = model(noisy)
            sq_err += float(((output - clean) ** 2).sum())
            noisy_err += float(((noisy - clean) ** 2).sum())
            n_pix += clean.numel()
            background = clean < 0.05
            bg_sum += float(output[background].sum())
            bg_n += int(background.sum())
    return {"test_mse": sq_err / n_pix, "noisy_input_mse": noisy_err / n_pix, "background_level": bg_sum / bg_n,
            "final_train_loss": epoch_losses[-1], "first_train_loss": epoch_losses[0]}  # fmt: skip
