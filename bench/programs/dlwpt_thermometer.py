"""Port of Deep Learning with PyTorch (Stevens, Antiga, Viehmann), chapters 5-6: the thermometer
problem. Eleven readings of an unknown-unit thermometer ``t_u`` against the temperature in
Celsius ``t_c``; a train/validation split; ``nn.Linear(1, 1)`` fitted with SGD and MSE by the
book's ``training_loop``, then the same loop fits a small ``Linear -> Tanh -> Linear`` net.

Source: github.com/deep-learning-with-pytorch/dlwpt-code, ``p1ch6/1_neural_networks.ipynb``
(the data, the split, ``training_loop``, ``linear_model``, ``seq_model``) and
``p1ch5/3_optimizers.ipynb`` (the same data and loop with hand-made parameters, and the raw
``t_u`` run that blows up) at commit d6c0210143daa133bbdeddaffc8993b1e17b5174 (the repository
carries no licence file; cited, not copied: the code is written anew from the facts of those
notebooks).

Kept: ``t_c`` and ``t_u`` as the book's 11 points, ``unsqueeze(1)`` into ``(11, 1)``; ``n_val =
int(0.2 * n_samples)``, ``shuffled_indices = torch.randperm(n_samples)``, the last ``n_val``
for validation; ``t_un = 0.1 * t_u`` for both splits; ``training_loop(n_epochs, optimizer,
model, loss_fn, t_u_train, t_u_val, t_c_train, t_c_val)``: per epoch the full-batch train
prediction and loss, the val prediction and loss (computed with grad, as in that notebook),
``zero_grad``, ``backward`` on the train loss, ``step``, a print at epoch 1 and every 1000;
``linear_model = nn.Linear(1, 1)`` with ``optim.SGD(lr=1e-2)``, 3000 epochs, ``nn.MSELoss()``;
then ``seq_model = nn.Sequential(OrderedDict(hidden_linear=nn.Linear(1, 8),
hidden_activation=nn.Tanh(), output_linear=nn.Linear(8, 1)))`` (the net the notebook trains:
the ``Linear(1, 13)`` version is only built and printed before it is redefined with 8 hidden
units) with ``optim.SGD(lr=1e-3)``, 5000 epochs, ``nn.MSELoss()``.
Shrunk: nothing (full-batch, 11 points, the book's epochs); CPU; no plots.
Measure only (not in the program): each model's final train and validation MSE, computed with
the targets as ``(n, 1)`` whatever shape the program used.

nndx, as the author would add it after README.md: for each of the two fits, ``nndx.probe(model,
(t_un_train, t_c_train), loss_fn, optimizer=optimizer, data=(t_un_train, t_c_train, t_un_val,
t_c_val))`` before ``training_loop``; ``nndx.Monitor(model, optimizer, every=10,
loss_fn=loss_fn)`` around it, the train loss computed through ``mon.loss_fn`` and logged every
epoch, the val loss logged as ``split="val"``; after it, ``nndx.probe(..., monitor=mon)`` on
the same batch and ``nndx.diagnose``; the author reads both diagnoses.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.optim as optim
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "dlwpt_thermometer"
SOURCE = Source("deep-learning-with-pytorch/dlwpt-code", "p1ch6/1_neural_networks.ipynb",
                "d6c0210143daa133bbdeddaffc8993b1e17b5174", "none stated")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter 6 notebook as published"),
        Variant(
            "input_not_scaled",
            "the raw readings t_u are fed to the models (the 0.1 * t_u rescaling left out): inputs of 21.8-81.9 "
            "make SGD at the book's learning rates take steps far too large for the weight, and saturate the "
            "tanh units of the small net",
            (C.UNNORMALIZED_INPUTS, C.LR_TOO_HIGH),
            ("https://github.com/deep-learning-with-pytorch/dlwpt-code/blob/"
             "d6c0210143daa133bbdeddaffc8993b1e17b5174/p1ch5/3_optimizers.ipynb",
             "https://github.com/delijati/pytorch-siamese/issues/3",
             "https://github.com/ammirato/target_driven_instance_detection/issues/2"),
            Measure("seq_val_loss", "the net's validation MSE at least 2x the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
        Variant(
            "target_not_unsqueezed",
            "t_c is kept as a (11,) vector (the unsqueeze(1) left out) while the models output (n, 1): "
            "nn.MSELoss broadcasts (n, 1) against (n,) to (n, n) and fits every prediction to every target, "
            "so both models learn the mean temperature (PyTorch only warns)",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/16045",
             "https://github.com/Photon-AI-Research/NeuralSolvers/issues/20",
             "https://github.com/DeepReinforcementLearning/DeepReinforcementLearningInAction/issues/15"),
            Measure("seq_val_loss", "the net's validation MSE at least 2x the healthy run's",
                    lambda healthy, buggy: not buggy < 2.0 * healthy),
        ),
    )
}

T_C = [0.5, 14.0, 15.0, 28.0, 11.0, 8.0, 3.0, -4.0, 6.0, 13.0, 21.0]
T_U = [35.7, 55.9, 58.2, 81.9, 56.3, 48.9, 33.9, 21.8, 48.4, 60.4, 68.4]


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    t_c = torch.tensor(T_C) if variant == "target_not_unsqueezed" else torch.tensor(T_C).unsqueeze(1)
    t_u = torch.tensor(T_U).unsqueeze(1)

    n_samples = t_u.shape[0]
    n_val = int(0.2 * n_samples)
    shuffled_indices = torch.randperm(n_samples)
    train_indices = shuffled_indices[:-n_val]
    val_indices = shuffled_indices[-n_val:]

    t_u_train, t_c_train = t_u[train_indices], t_c[train_indices]
    t_u_val, t_c_val = t_u[val_indices], t_c[val_indices]
    scale = 1.0 if variant == "input_not_scaled" else 0.1
    t_un_train = scale * t_u_train
    t_un_val = scale * t_u_val

    def training_loop(n_epochs, optimizer, model, loss_fn, t_u_train, t_u_val, t_c_train, t_c_val, mon):
        for epoch in range(1, n_epochs + 1):
            t_p_train = model(t_u_train)
            loss_train = mon.loss_fn(t_p_train, t_c_train)

            t_p_val = model(t_u_val)
            loss_val = loss_fn(t_p_val, t_c_val)

            optimizer.zero_grad()
            loss_train.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss_train))  # noqa: B023
            nx.timed(lambda: mon.log(loss_val, split="val"))  # noqa: B023
            # the notebook prints both losses here at epoch 1 and every 1000 (left out: no output)

    def fit(model: nn.Module, lr: float, n_epochs: int) -> None:
        optimizer = optim.SGD(model.parameters(), lr=lr)
        loss_fn = nn.MSELoss()
        batch = (t_un_train, t_c_train)
        data = (t_un_train, t_c_train, t_un_val, t_c_val)
        nx.preflight(model, batch, loss_fn, optimizer=optimizer, data=data)
        mon = nx.monitor(model, optimizer, every=10, loss_fn=loss_fn)
        training_loop(n_epochs=n_epochs, optimizer=optimizer, model=model, loss_fn=loss_fn, t_u_train=t_un_train,
                      t_u_val=t_un_val, t_c_train=t_c_train, t_c_val=t_c_val, mon=mon)  # fmt: skip
        nx.finish(mon, model, batch, loss_fn, optimizer=optimizer, data=data)

    def mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:  # measure only
        with torch.no_grad():
            return float(((model(x) - y.view(-1, 1)) ** 2).mean())

    linear_model = nn.Linear(1, 1)
    fit(linear_model, 1e-2, 3000)

    seq_model = nn.Sequential(OrderedDict([
        ("hidden_linear", nn.Linear(1, 8)),
        ("hidden_activation", nn.Tanh()),
        ("output_linear", nn.Linear(8, 1)),
    ]))  # fmt: skip
    fit(seq_model, 1e-3, 5000)

    return {"lin_train_loss": mse(linear_model, t_un_train, t_c_train),
            "lin_val_loss": mse(linear_model, t_un_val, t_c_val),
            "seq_train_loss": mse(seq_model, t_un_train, t_c_train),
            "seq_val_loss": mse(seq_model, t_un_val, t_c_val)}  # fmt: skip
