"""Port of patrickloeber/pytorchTutorial's linear regression: ``nn.Linear(1, 1)`` fitted to
scikit-learn's ``make_regression`` data with ``MSELoss`` and plain SGD, full batch.

Source: github.com/patrickloeber/pytorchTutorial, ``07_linear_regression.py`` at commit
69637721ed9fa2ccf81a1093a928a52bbb591439 (MIT, Copyright (c) 2020 Patrick Loeber). Written
anew from the facts of that file; no code copied.

Kept: everything. ``datasets.make_regression(n_samples=100, n_features=1, noise=20,
random_state=4)``; ``X`` and ``y`` cast to float32 tensors with ``torch.from_numpy(...
.astype(np.float32))``; the target reshaped ``y = y.view(y.shape[0], 1)``; ``model =
nn.Linear(n_features, 1)``; ``criterion = nn.MSELoss()``; ``torch.optim.SGD(model.parameters(),
lr=0.01)``; 100 epochs of the whole data set as one batch, in the script's order: forward,
loss, ``loss.backward()``, ``optimizer.step()``, then ``optimizer.zero_grad()`` ("zero grad
before new step") at the end of the iteration; the loss printed every 10 epochs.
Shrunk: nothing (the script runs in well under a second); ``random_state`` is ``4 + seed`` and
the model's initialisation, unseeded in the script, is seeded with ``torch.manual_seed(seed)``;
no plot (the script's ``model(X).detach()`` predictions are what the measure uses).
Measure only (not in the program): the mean squared error of the final predictions against
the correctly shaped targets (``mse``) and the learned weight and bias.

nndx, as the author would add it after the README's quick start: a preflight ``nndx.probe``
on the whole data set ``(X, y)`` (the one batch the script trains on) with the ``MSELoss``
and the optimizer; ``nndx.Monitor(model, optimizer, every=10)`` (the script prints every 10
epochs) around the loop, every epoch's loss logged after the script's step; after the loop
``nndx.probe(model, (X, y), criterion, optimizer=optimizer, monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from sklearn import datasets
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "loeber_linear_regression"
SOURCE = Source("patrickloeber/pytorchTutorial", "07_linear_regression.py",
                "69637721ed9fa2ccf81a1093a928a52bbb591439", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "07_linear_regression.py as published"),
        Variant(
            "target_not_reshaped",
            "the target reshape y = y.view(y.shape[0], 1) left out: MSELoss gets predictions of shape (100, 1) "
            "and targets of shape (100,), broadcasts them to (100, 100) (a UserWarning, no error) and fits every "
            "prediction to every target, i.e. the line flattens to the targets' mean",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/deepset-ai/FARM/issues/229",
             "https://github.com/mlcommons/GaNDLF/issues/134",
             "https://github.com/pytorch/pytorch/issues/4938"),
            Measure("mse", "MSE of the final predictions (correctly shaped targets) at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "lr_too_high",
            "learning_rate = 1.2 instead of 0.01 (raised to converge within the 100 epochs): above 2 / the "
            "curvature of the MSE on unit-scale inputs, so full-batch gradient descent overshoots further every "
            "step and the line diverges",
            (C.LR_TOO_HIGH,),
            ("https://github.com/rslim087a/PyTorch-for-Deep-Learning-and-Computer-Vision-Course-All-Codes-/issues/1",
             "https://github.com/pytorch/pytorch/issues/23142"),
            Measure("mse", "MSE of the final predictions at least 10x the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < 10 * healthy),
        ),
    )
}

N_SAMPLES, NOISE, NUM_EPOCHS = 100, 20, 100


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    # 0) Prepare data
    X_numpy, y_numpy = datasets.make_regression(n_samples=N_SAMPLES, n_features=1, noise=NOISE,
                                                random_state=4 + seed)  # fmt: skip
    X = torch.from_numpy(X_numpy.astype(np.float32))
    y = torch.from_numpy(y_numpy.astype(np.float32))
    if variant != "target_not_reshaped":
        y = y.view(y.shape[0], 1)
    n_samples, n_features = X.shape

    # 1) Model
    input_size = n_features
    output_size = 1
    model = nn.Linear(input_size, output_size)

    # 2) Loss and optimizer
    learning_rate = 1.2 if variant == "lr_too_high" else 0.01
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)

    nx.preflight(model, (X, y), criterion, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=10)

    # 3) Training loop
    losses = []
    for epoch in range(NUM_EPOCHS):
        # Forward pass and loss
        y_predicted = model(X)
        loss = criterion(y_predicted, y)

        # Backward pass and update
        loss.backward()
        optimizer.step()

        # zero grad before new step
        optimizer.zero_grad()

        nx.timed(lambda: mon.log(loss))  # noqa: B023
        losses.append(loss.item())  # the script prints it every 10 epochs

    nx.finish(mon, model, (X, y), criterion, optimizer=optimizer)

    # Plot (the script's predictions), measured instead of plotted
    predicted = model(X).detach().numpy().reshape(-1)
    mse = float(np.mean((predicted.astype(np.float64) - y_numpy) ** 2))
    if not math.isfinite(mse):
        mse = float("inf")
    return {"mse": mse, "final_loss": losses[-1], "weight": float(model.weight.item()),
            "bias": float(model.bias.item())}  # fmt: skip
