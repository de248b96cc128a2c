"""Port of rasbt/deeplearning-models' "Convolutional Autoencoder with Nearest-neighbor
Interpolation": a conv encoder (two 3x3 convs with leaky ReLU and 2x2 max-pooling, 28x28x1 ->
7x7x8) and a decoder (nearest-neighbour upsampling x2, 3x3 conv, leaky ReLU, twice), trained
with ``F.binary_cross_entropy_with_logits`` against the input image and Adam.

Source: github.com/rasbt/deeplearning-models, ``pytorch_ipynb/autoencoder/ae-conv-nneighbor.ipynb``
at commit 18e046926551378cd691fd871dda0f21dcd272ab (MIT, Copyright (c) 2019-2022 Sebastian
Raschka). Written anew from the facts of that notebook; no code copied.

Kept: ``ConvolutionalAutoencoder`` as written: ``conv_1`` ``Conv2d(1, 4, 3, padding=1)`` ->
``F.leaky_relu`` -> ``MaxPool2d(2)``; ``conv_2`` ``Conv2d(4, 8, 3, padding=1)`` -> leaky ReLU ->
``MaxPool2d(2)``; ``F.interpolate(scale_factor=2, mode='nearest')``; ``conv_3``
``Conv2d(8, 4, 3, padding=1)`` -> leaky ReLU; interpolate x2; ``conv_4`` ``Conv2d(4, 1, 3,
padding=1)``; ``logits = F.leaky_relu(x)`` (the author's leaky ReLU on the logits, kept);
``probas = torch.sigmoid(logits)``; ``forward`` returns ``(logits, probas)``.
``torch.manual_seed(123)`` before the model is built; ``Adam(lr=0.05)``; batch size 128 with
a shuffling loader; the loop: ``logits, decoded = model(features)``, ``cost =
F.binary_cross_entropy_with_logits(logits, features)``, ``optimizer.zero_grad()``,
``cost.backward()``, ``optimizer.step()``, a print every 50 batches; images through
``transforms.ToTensor()`` (pixels scaled to [0, 1]), labels unused.
Shrunk: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train / 360 test)
instead of MNIST (60,000 / 10,000); 20 epochs of 12 batches (240 steps) instead of 10 epochs
of 469; CPU; no plots.
Measure only (not in the program, which only plots reconstructions): the mean squared error
between ``decoded`` (the sigmoid output the notebook plots) and the test images in [0, 1],
and the same on the training images.

nndx, as the author would add it after README.md: a preflight ``nndx.probe(model, (features,
features), loss_fn, optimizer=optimizer)`` on the first training batch, where ``loss_fn``
is the notebook's cost on the model's output tuple; ``nndx.Monitor(model, optimizer,
every=10)`` around the loop with every batch's cost logged after ``optimizer.step()``
(README's place; the notebook prints there); after training ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "raschka_conv_ae"
SOURCE = Source("rasbt/deeplearning-models", "pytorch_ipynb/autoencoder/ae-conv-nneighbor.ipynb",
                "18e046926551378cd691fd871dda0f21dcd272ab", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook as published (shrunk: 28x28 digits, 20 epochs of 12 batches)"),
        Variant(
            "sigmoid_into_bce_with_logits",
            "the cost is F.binary_cross_entropy_with_logits(decoded, features): the sigmoid output (probas) is "
            "passed where the loss expects logits, so a second sigmoid is applied inside the loss; its "
            "predictions are squeezed into [0.5, 0.73] and the gradient to the real logits is damped",
            (C.WRONG_OUTPUT_ACTIVATION, C.DOUBLE_SOFTMAX),
            ("https://github.com/Turoad/lanedet/issues/32",
             "https://github.com/yudi-mars/daisyRec/pull/15",
             "https://github.com/itakurah/focal-loss-pytorch/pull/5"),
            Measure("test_mse", "test reconstruction MSE (sigmoid output vs image) at least 1.3x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.3 * healthy),
        ),
        Variant(
            "unscaled_pixels",
            "the images reach the model as raw 0..255 floats (the dataset built from the raw uint8 pixels with "
            ".float(), ToTensor's division by 255 lost): the inputs are 255x too large and the BCE targets lie "
            "far outside [0, 1], so the loss goes negative and rewards ever larger logits",
            (C.UNNORMALIZED_INPUTS, C.UNNORMALIZED_TARGETS),
            ("https://github.com/pytorch/pytorch/issues/36647",
             "https://github.com/keras-team/keras/issues/3642",
             "https://github.com/Lasagne/Recipes/issues/54"),
            Measure("test_mse", "test reconstruction MSE (sigmoid output vs image in [0, 1]) at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

RANDOM_SEED, LEARNING_RATE, NUM_EPOCHS, BATCH_SIZE, SIDE = 123, 0.05, 20, 128, 28


# --------------------------------------------------------------------------- the notebook's model


class ConvolutionalAutoencoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # ENCODER: 28x28x1 => 28x28x4 => 14x14x4 => 14x14x8 => 7x7x8
        self.conv_1 = torch.nn.Conv2d(in_channels=1, out_channels=4, kernel_size=(3, 3), stride=(1, 1), padding=1)
        self.pool_1 = torch.nn.MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=0)
        self.conv_2 = torch.nn.Conv2d(in_channels=4, out_channels=8, kernel_size=(3, 3), stride=(1, 1), padding=1)
        self.pool_2 = torch.nn.MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=0)
        # DECODER: 7x7x8 => (unpool) 14x14x8 => 14x14x4 => (unpool) 28x28x4 => 28x28x1
        self.conv_3 = torch.nn.Conv2d(in_channels=8, out_channels=4, kernel_size=(3, 3), stride=(1, 1), padding=1)
        self.conv_4 = torch.nn.Conv2d(in_channels=4, out_channels=1, kernel_size=(3, 3), stride=(1, 1), padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv_1(x)
        x = F.leaky_relu(x)
        x = self.pool_1(x)
        x = self.conv_2(x)
        x = F.leaky_relu(x)
        x = self.pool_2(x)
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        x = self.conv_3(x)
        x = F.leaky_relu(x)
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        x = self.conv_4(x)
        logits = F.leaky_relu(x)
        probas = torch.sigmoid(logits)
        return logits, probas


# --------------------------------------------------------------------------- the notebook's loop


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    tr_raw, tr_y, te_raw, te_y = digits.digit_images(seed=seed)
    x_train, x_test = digits.upscaled(tr_raw, SIDE), digits.upscaled(te_raw, SIDE)  # ToTensor: [0, 1]
    truth_test, truth_train = x_test, x_train
    if variant == "unscaled_pixels":  # the raw pixels as floats: ToTensor's /255 lost
        x_train, x_test = x_train * 255.0, x_test * 255.0
    train_loader = DataLoader(TensorDataset(x_train, tr_y), batch_size=BATCH_SIZE, shuffle=True)

    torch.manual_seed(RANDOM_SEED + seed)
    model = ConvolutionalAutoencoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

    def cost_fn(output: tuple[torch.Tensor, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
        logits, decoded = output
        if variant == "sigmoid_into_bce_with_logits":
            return F.binary_cross_entropy_with_logits(decoded, features)
        return F.binary_cross_entropy_with_logits(logits, features)

    first = x_train[:BATCH_SIZE]
    nx.preflight(model, (first, first), cost_fn, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    costs = []
    for epoch in range(NUM_EPOCHS):
        for batch_idx, (features, targets) in enumerate(train_loader):
            # FORWARD AND BACK PROP
            logits, decoded = model(features)
            if variant == "sigmoid_into_bce_with_logits":
                cost = F.binary_cross_entropy_with_logits(decoded, features)
            else:
                cost = F.binary_cross_entropy_with_logits(logits, features)
            optimizer.zero_grad()
            cost.backward()
            # UPDATE MODEL PARAMETERS
            optimizer.step()
            # LOGGING
            nx.timed(lambda: mon.log(cost))  # noqa: B023
            costs.append(cost.item())

    nx.finish(mon, model, (first, first), cost_fn, optimizer=optimizer)

    with torch.no_grad():
        _, dec_test = model(x_test)
        _, dec_train = model(x_train)
    return {"test_mse": F.mse_loss(dec_test, truth_test).item(),
            "train_mse": F.mse_loss(dec_train, truth_train).item(),
            "final_cost": sum(costs[-12:]) / len(costs[-12:]), "first_cost": costs[0]}  # fmt: skip
