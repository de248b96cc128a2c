"""Port of the UvA Deep Learning course's Tutorial 3, "Activation Functions" (PyTorch): an MLP
(``BaseNetwork``) over flattened images with one activation class written by hand, trained by
the notebook's ``train_model`` (SGD with momentum, cross-entropy, early stopping on the
validation accuracy, best checkpoint reloaded) and scored by ``test_model`` in eval mode.

Source: github.com/phlippe/uvadlc_notebooks,
``docs/tutorial_notebooks/tutorial3/Activation_Functions.ipynb`` at commit
0da8037c7abc32f478ff6142acceb72dbcf088ee (MIT, Copyright (c) 2020 Phillip Lippe). Written anew
from the facts of that notebook; no code copied.

Kept: ``set_seed(42)`` before building each network; ``ActivationFunction`` (an ``nn.Module``
with ``name`` and ``config``) and the notebook's hand-written ``Sigmoid`` (``1 / (1 +
exp(-x))``) and ``ReLU`` (``x * (x > 0).float()``); ``BaseNetwork(act_fn, input_size,
num_classes=10, hidden_sizes=[512, 256, 256, 128])``: ``Linear`` then the *same* activation
object after every hidden layer, a final ``Linear``, ``x.view(x.size(0), -1)`` in ``forward``;
the data through ``ToTensor`` + ``Normalize((0.5,), (0.5,))`` (pixels in [-1, 1]), the
training images split into train and validation by ``random_split`` (5:1 as 50,000:10,000);
``train_model(net, model_name, max_epochs=50, patience=7, batch_size=256)``:
``optim.SGD(net.parameters(), lr=1e-2, momentum=0.9)``, ``nn.CrossEntropyLoss()``, a loader
with ``shuffle=True, drop_last=True``; per epoch ``net.train()``, per batch
``optimizer.zero_grad()``, ``preds = net(imgs)``, ``loss``, ``backward``, ``step``, the
training accuracy counted; ``test_model(net, val_loader)`` (``net.eval()``, ``no_grad``,
argmax accuracy); the best epoch's weights saved (``len(val_scores) == 1 or val_acc >
val_scores[best_val_epoch]``), early stop when ``best_val_epoch <= epoch - patience``; then
the best weights loaded and ``test_model(net, test_loader)``. The healthy program is the
notebook's ReLU network (one of the five that train; sigmoid is the notebook's failing one).
Replaced / shrunk: scikit-learn's 8x8 digits instead of FashionMNIST, so ``input_size`` 64
instead of 784 (the hidden sizes kept) and 1,197 train / 240 val / 360 test images instead of
50,000 / 10,000 / 10,000, and ``batch_size`` 32 instead of 256 so an epoch is 37 SGD steps
(with 256 it would be 4, and early stopping ends the healthy run at 51% accuracy); checkpoints kept in memory (a
``state_dict`` copy) instead of files; no plots, no tqdm; CPU.
Measure only (not in the program): nothing beyond the returned test accuracy, plus the
final training loss of the last epoch.

nndx, as the author would add it (README's quick start): in ``train_model`` once the
optimizer and loss exist, a preflight ``nndx.probe(net, first_batch, loss_module,
optimizer=optimizer)``; ``nndx.Monitor(net, optimizer)`` around the epochs with each batch's
loss logged after ``optimizer.step()``; after the best weights are loaded,
``nndx.probe(..., monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data as data

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "uvadlc_activations"
SOURCE = Source("phlippe/uvadlc_notebooks", "docs/tutorial_notebooks/tutorial3/Activation_Functions.ipynb",
                "0da8037c7abc32f478ff6142acceb72dbcf088ee", "MIT")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the notebook's BaseNetwork with its ReLU, trained by train_model (shrunk: 8x8 digits)"),
        Variant(
            "sigmoid_activation",
            "BaseNetwork(act_fn=Sigmoid()): the notebook's own failing case, five Linear layers with sigmoids in "
            "between; the sigmoid's derivative is at most 1/4, so the gradient reaching the first layers is orders "
            "of magnitude below the last layer's and SGD at lr 1e-2 does not move the net off chance",
            (C.VANISHING_GRADIENTS,),
            ("https://github.com/phlippe/uvadlc_notebooks/blob/0da8037c7abc32f478ff6142acceb72dbcf088ee/docs/"
             "tutorial_notebooks/tutorial3/Activation_Functions.ipynb",
             "https://github.com/Lightning-AI/tutorials/pull/76",
             "https://github.com/MichalDanielDobrzanski/DeepLearningPython/issues/13"),
            Measure("test_acc", "test accuracy at least 0.3 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.3),
        ),
        Variant(
            "zero_grad_missing",
            "optimizer.zero_grad() left out of train_model's batch loop (the notebook's comment says it 'can be "
            "placed anywhere before loss.backward()'; here it is placed nowhere): every batch's gradient is added "
            "to all earlier ones, and SGD with momentum 0.9 takes ever larger steps",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/IBM/aihwkit/issues/446",
             "https://github.com/Miraclelucy/dive_into_deep_learning/issues/6"),
            Measure("test_acc", "test accuracy at least 0.1 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

HIDDEN_SIZES, MAX_EPOCHS, PATIENCE, BATCH_SIZE = [512, 256, 256, 128], 50, 7, 32


def set_seed(seed: int) -> None:
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- the activation functions


class ActivationFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.name = self.__class__.__name__
        self.config = {"name": self.name}


class Sigmoid(ActivationFunction):
    def forward(self, x):
        return 1 / (1 + torch.exp(-x))


class ReLU(ActivationFunction):
    def forward(self, x):
        return x * (x > 0).float()


act_fn_by_name = {"sigmoid": Sigmoid, "relu": ReLU}


# --------------------------------------------------------------------------- the network


class BaseNetwork(nn.Module):
    def __init__(self, act_fn, input_size=784, num_classes=10, hidden_sizes=(512, 256, 256, 128)) -> None:
        super().__init__()
        layers = []
        layer_sizes = [input_size] + list(hidden_sizes)
        for layer_index in range(1, len(layer_sizes)):
            layers += [nn.Linear(layer_sizes[layer_index - 1], layer_sizes[layer_index]), act_fn]
        layers += [nn.Linear(layer_sizes[-1], num_classes)]
        self.layers = nn.Sequential(*layers)
        self.config = {"act_fn": act_fn.config, "input_size": input_size, "num_classes": num_classes,
                       "hidden_sizes": list(hidden_sizes)}  # fmt: skip

    def forward(self, x):
        x = x.view(x.size(0), -1)
        return self.layers(x)


# --------------------------------------------------------------------------- train_model / test_model


def test_model(net, data_loader) -> float:
    net.eval()
    true_preds, count = 0.0, 0
    for imgs, labels in data_loader:
        with torch.no_grad():
            preds = net(imgs).argmax(dim=-1)
            true_preds += (preds == labels).sum().item()
            count += labels.shape[0]
    return true_preds / count


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    tr_x, tr_y, te_x, te_y = digits.digit_images(seed=seed)
    normalize = lambda imgs: (digits.to_tensor(imgs) - 0.5) / 0.5  # noqa: E731 - ToTensor + Normalize
    train_dataset = data.TensorDataset(normalize(tr_x), tr_y)
    n_val = len(train_dataset) // 6
    train_set, val_set = data.random_split(train_dataset, [len(train_dataset) - n_val, n_val],
                                           generator=torch.Generator().manual_seed(seed))  # fmt: skip
    test_set = data.TensorDataset(normalize(te_x), te_y)
    val_loader = data.DataLoader(val_set, batch_size=1024, shuffle=False, drop_last=False)
    test_loader = data.DataLoader(test_set, batch_size=1024, shuffle=False, drop_last=False)

    set_seed(42 + seed)
    act_fn = act_fn_by_name["sigmoid" if variant == "sigmoid_activation" else "relu"]()
    net = BaseNetwork(act_fn=act_fn, input_size=64, hidden_sizes=HIDDEN_SIZES)

    # train_model(net, model_name, max_epochs=50, patience=7, batch_size=256)
    optimizer = optim.SGD(net.parameters(), lr=1e-2, momentum=0.9)
    loss_module = nn.CrossEntropyLoss()
    train_loader_local = data.DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, drop_last=True)
    with torch.random.fork_rng():  # drawing the probe batch leaves the loader's shuffling alone
        probe_batch = tuple(next(iter(train_loader_local)))
    nx.preflight(net, probe_batch, loss_module, optimizer=optimizer)
    mon = nx.monitor(net, optimizer)

    val_scores: list[float] = []
    best_val_epoch, best_state = -1, None
    last_loss = float("nan")
    for epoch in range(MAX_EPOCHS):
        net.train()
        true_preds, count = 0.0, 0
        for imgs, labels in train_loader_local:
            if variant != "zero_grad_missing":
                optimizer.zero_grad()
            preds = net(imgs)
            loss = loss_module(preds, labels)
            loss.backward()
            optimizer.step()
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            true_preds += (preds.argmax(dim=-1) == labels).sum()
            count += labels.shape[0]
            last_loss = loss.item()
        val_acc = test_model(net, val_loader)
        val_scores.append(val_acc)
        if len(val_scores) == 1 or val_acc > val_scores[best_val_epoch]:
            best_state = copy.deepcopy(net.state_dict())  # save_model
            best_val_epoch = epoch
        elif best_val_epoch <= epoch - PATIENCE:
            break
    net.load_state_dict(best_state)  # load_model
    nx.finish(mon, net, probe_batch, loss_module, optimizer=optimizer)
    test_acc = test_model(net, test_loader)
    return {"test_acc": test_acc, "best_val_acc": max(val_scores), "epochs": float(len(val_scores)),
            "last_train_loss": last_loss}  # fmt: skip
