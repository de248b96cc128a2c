"""Port of Dive into Deep Learning's "Batch Normalization" section (PyTorch tab): batch
normalization written from scratch (``batch_norm`` with its moving mean and variance, the
``BatchNorm`` module) inside LeNet with sigmoids (``BNLeNetScratch``), trained by d2l's
``Trainer`` (SGD, cross-entropy).

Source: github.com/d2l-ai/d2l-en, ``chapter_convolutional-modern/batch-norm.md`` (the
``pytorch`` tab) and the ``d2l/torch.py`` pieces it calls (``Module``, ``Classifier``,
``Trainer.fit``/``fit_epoch``, ``DataModule``, ``FashionMNIST``, ``init_cnn``,
``apply_init``, ``configure_optimizers``) at commit 23d7a5aecceee57d1292c56e90cce307f183bb0a
(sample code under the MIT-0 licence of LICENSE-SAMPLECODE, Copyright 2019 Amazon.com, Inc.;
prose CC BY-SA 4.0). Written anew from the facts of those files; no code copied.

Kept: ``batch_norm(X, gamma, beta, moving_mean, moving_var, eps, momentum)``: prediction mode
chosen by ``not torch.is_grad_enabled()`` (then ``(X - moving_mean) / sqrt(moving_var +
eps)``), else the batch mean and biased variance over dim 0 (2-D input) or dims (0, 2, 3) with
``keepdim`` (4-D input), ``X_hat = (X - mean) / sqrt(var + eps)``, the moving averages
``(1 - momentum) * moving + momentum * batch`` and ``Y = gamma * X_hat + beta``, returning
``Y, moving_mean.data, moving_var.data``; ``BatchNorm(num_features, num_dims)`` with
``gamma``/``beta`` as ``nn.Parameter`` of shape (1, C) or (1, C, 1, 1) (ones, zeros) and the
moving mean/var as plain tensor attributes (zeros, ones) reassigned every forward
(``eps=1e-5, momentum=0.1``); ``BNLeNetScratch``: ``LazyConv2d(6, 5)``, BatchNorm(6, 4),
Sigmoid, ``AvgPool2d(2, 2)``, ``LazyConv2d(16, 5)``, BatchNorm(16, 4), Sigmoid, AvgPool2d,
Flatten, ``LazyLinear(120)``, BatchNorm(120, 2), Sigmoid, ``LazyLinear(84)``, BatchNorm(84, 2),
Sigmoid, ``LazyLinear(10)``; ``model.apply_init([first train batch's X], d2l.init_cnn)`` (a
forward, in grad mode, that materialises the lazy layers, then Xavier-uniform weights on every
``nn.Linear``/``nn.Conv2d``); ``Classifier.loss`` (``F.cross_entropy`` on reshaped outputs,
mean) and ``accuracy``; ``configure_optimizers`` = ``torch.optim.SGD(parameters, lr=0.1)``;
``Trainer(max_epochs=10).fit``: per epoch ``model.train()``, per batch ``loss =
training_step(batch)``, ``optim.zero_grad()``, ``loss.backward()`` and ``optim.step()`` inside
``torch.no_grad()`` (as d2l writes it), then ``model.eval()`` and the validation batches under
``torch.no_grad()`` (the scratch BatchNorm uses its moving statistics there); the data module's
loaders (``batch_size=128``, train shuffled, val not), images through ``Resize((28, 28))`` +
``ToTensor`` (pixels in [0, 1], no normalisation).
Shrunk / replaced: scikit-learn's 8x8 digits upsampled (bilinear) to 28x28 (1,437 train / 360
val) instead of Fashion-MNIST (60,000 / 10,000), so LeNet keeps its layer shapes; no plotting
(``ProgressBoard``), CPU.
Measure only (not in the program): the validation accuracy and loss over the whole val set
after the last epoch (d2l plots the per-batch means), and the number of autograd nodes kept
alive behind the last ``BatchNorm``'s moving variance.

nndx, as the author would add it: a preflight ``nndx.probe(model, first_batch, model.loss,
optimizer=optim)`` in ``fit`` once the optimizer exists; ``nndx.Monitor(model, optim,
every=10)`` around the epochs, each training batch's loss logged where ``training_step`` plots
it, each epoch's val loss and accuracy logged as ``split="val"`` (``validation_step``'s
plots); after ``fit``, ``nndx.probe(..., monitor=mon)`` on the same first batch and
``nndx.diagnose``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench.programs import data as digits
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_batch_norm"
SOURCE = Source("d2l-ai/d2l-en", "chapter_convolutional-modern/batch-norm.md",
                "23d7a5aecceee57d1292c56e90cce307f183bb0a", "MIT-0 (sample code)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section's BNLeNetScratch as published (shrunk: 28x28 digits instead of Fashion-MNIST)"),
        Variant(
            "moving_stats_keep_graph",
            "batch_norm returns moving_mean, moving_var instead of moving_mean.data, moving_var.data (the code before "
            "d2l's fix): each step's moving statistics are computed from the batch mean/var with autograd on, and the "
            "module keeps them, so every forward chains one more piece of graph onto the last and the graph is never "
            "freed",
            (C.GRAPH_RETAINED,),
            ("https://github.com/d2l-ai/d2l-en/pull/1342",
             "https://github.com/pytorch/pytorch/issues/20275",
             "https://github.com/pyro-ppl/pyro/pull/2459"),
            Measure("moving_graph_nodes", "autograd nodes kept alive behind the last BatchNorm's moving_var after "
                    "training: 0 healthy, grows by a few per step with the bug",
                    lambda healthy, buggy: buggy > healthy + 100),
        ),
        Variant(
            "batch_size_2",
            "d2l.FashionMNIST(batch_size=2) instead of 128 (a batch cut down to fit memory): every BatchNorm then "
            "normalises with the mean and variance of two samples (the fully connected ones map each feature to "
            "about +1/-1), so what the net learns in training mode does not hold with the moving statistics used "
            "at validation",
            (C.BATCH_TOO_SMALL,),
            ("https://github.com/microsoft/CNTK/issues/905",
             "https://github.com/microsoft/O-CNN/issues/95",
             "https://github.com/pytorch/pytorch/issues/19916"),
            Measure("val_acc", "validation accuracy at least 0.15 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.15),
        ),
    )
}

LR, MAX_EPOCHS, BATCH_SIZE, SIDE, NUM_CLASSES = 0.1, 10, 128, 28, 10


# --------------------------------------------------------------------------- batch-norm.md (pytorch tab)


def make_batch_norm(detach_moving: bool):
    def batch_norm(X, gamma, beta, moving_mean, moving_var, eps, momentum):
        # prediction mode when autograd is off: the moving statistics
        if not torch.is_grad_enabled():
            X_hat = (X - moving_mean) / torch.sqrt(moving_var + eps)
        else:
            assert len(X.shape) in (2, 4)
            if len(X.shape) == 2:
                mean = X.mean(dim=0)
                var = ((X - mean) ** 2).mean(dim=0)
            else:
                mean = X.mean(dim=(0, 2, 3), keepdim=True)
                var = ((X - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
            X_hat = (X - mean) / torch.sqrt(var + eps)
            moving_mean = (1.0 - momentum) * moving_mean + momentum * mean
            moving_var = (1.0 - momentum) * moving_var + momentum * var
        Y = gamma * X_hat + beta
        if detach_moving:
            return Y, moving_mean.data, moving_var.data
        return Y, moving_mean, moving_var  # the bug: the moving statistics keep their graph

    return batch_norm


class BatchNorm(nn.Module):
    def __init__(self, num_features: int, num_dims: int, batch_norm) -> None:
        super().__init__()
        shape = (1, num_features) if num_dims == 2 else (1, num_features, 1, 1)
        self.gamma = nn.Parameter(torch.ones(shape))
        self.beta = nn.Parameter(torch.zeros(shape))
        self.moving_mean = torch.zeros(shape)
        self.moving_var = torch.ones(shape)
        self._batch_norm = batch_norm

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.moving_mean.device != X.device:
            self.moving_mean = self.moving_mean.to(X.device)
            self.moving_var = self.moving_var.to(X.device)
        Y, self.moving_mean, self.moving_var = self._batch_norm(
            X, self.gamma, self.beta, self.moving_mean, self.moving_var, eps=1e-5, momentum=0.1)
        return Y


# --------------------------------------------------------------------------- d2l/torch.py: Classifier, init_cnn


def init_cnn(module: nn.Module) -> None:
    if type(module) == nn.Linear or type(module) == nn.Conv2d:  # noqa: E721 - d2l's own test
        nn.init.xavier_uniform_(module.weight)


class BNLeNetScratch(nn.Module):
    def __init__(self, batch_norm, lr: float = 0.1, num_classes: int = 10) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.LazyConv2d(6, kernel_size=5), BatchNorm(6, 4, batch_norm),
            nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
            nn.LazyConv2d(16, kernel_size=5), BatchNorm(16, 4, batch_norm),
            nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Flatten(), nn.LazyLinear(120),
            BatchNorm(120, 2, batch_norm), nn.Sigmoid(), nn.LazyLinear(84),
            BatchNorm(84, 2, batch_norm), nn.Sigmoid(),
            nn.LazyLinear(num_classes))  # fmt: skip

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.net(X)

    def loss(self, Y_hat: torch.Tensor, Y: torch.Tensor, averaged: bool = True) -> torch.Tensor:
        Y_hat = Y_hat.reshape((-1, Y_hat.shape[-1]))
        Y = Y.reshape((-1,))
        return F.cross_entropy(Y_hat, Y, reduction="mean" if averaged else "none")

    def accuracy(self, Y_hat: torch.Tensor, Y: torch.Tensor, averaged: bool = True) -> torch.Tensor:
        Y_hat = Y_hat.reshape((-1, Y_hat.shape[-1]))
        preds = Y_hat.argmax(dim=1).type(Y.dtype)
        compare = (preds == Y.reshape(-1)).type(torch.float32)
        return compare.mean() if averaged else compare

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def apply_init(self, inputs, init=None) -> None:
        self.forward(*inputs)
        if init is not None:
            self.net.apply(init)


def graph_nodes(tensor: torch.Tensor) -> int:
    """Autograd nodes reachable from ``tensor.grad_fn`` (0 for a tensor without history)."""
    seen, stack = set(), [tensor.grad_fn] if tensor.grad_fn is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(fn for fn, _ in node.next_functions if fn is not None)
    return len(seen)


# --------------------------------------------------------------------------- the chapter's run


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    batch_size = 2 if variant == "batch_size_2" else BATCH_SIZE

    # d2l.FashionMNIST(batch_size=128): Resize((28, 28)) + ToTensor, train shuffled, val not
    tr_raw, tr_y, va_raw, va_y = digits.digit_images(seed=seed)
    x_train, x_val = digits.upscaled(tr_raw, SIDE), digits.upscaled(va_raw, SIDE)
    train_loader = DataLoader(TensorDataset(x_train, tr_y), batch_size, shuffle=True)
    val_loader = DataLoader(TensorDataset(x_val, va_y), batch_size, shuffle=False)

    model = BNLeNetScratch(make_batch_norm(detach_moving=variant != "moving_stats_keep_graph"), lr=LR)
    first_batch = next(iter(train_loader))  # model.apply_init([next(iter(data.get_dataloader(True)))[0]], ...)
    model.apply_init([first_batch[0]], init_cnn)

    # Trainer(max_epochs=10).fit(model, data)
    optim = model.configure_optimizers()
    nx.preflight(model, (first_batch[0], first_batch[1]), model.loss, optimizer=optim)
    mon = nx.monitor(model, optim, every=10)
    for _epoch in range(MAX_EPOCHS):
        model.train()
        for X, y in train_loader:
            loss = model.loss(model(X), y)  # training_step
            nx.timed(lambda: mon.log(loss))  # noqa: B023 - where training_step plots the loss
            optim.zero_grad()
            with torch.no_grad():
                loss.backward()
                optim.step()
        model.eval()
        val_losses, val_accs = [], []
        for X, y in val_loader:
            with torch.no_grad():
                Y_hat = model(X)
                val_losses.append(model.loss(Y_hat, y).item())
                val_accs.append(model.accuracy(Y_hat, y).item())
        nx.timed(lambda: mon.log(sum(val_losses) / len(val_losses), split="val",  # noqa: B023
                                 accuracy=sum(val_accs) / len(val_accs)))  # noqa: B023
    nx.finish(mon, model, (first_batch[0], first_batch[1]), model.loss, optimizer=optim)

    with torch.no_grad():
        Y_hat = model(x_val)
        val_acc = model.accuracy(Y_hat, va_y).item()
        val_loss = model.loss(Y_hat, va_y).item()
        train_acc = model.accuracy(model(x_train), tr_y).item()
    return {"val_acc": val_acc, "val_loss": val_loss, "train_acc_eval_mode": train_acc,
            "last_train_loss": float(loss.item()), "moving_graph_nodes": float(graph_nodes(model.net[13].moving_var)),
            "gamma_first_bn_std": float(model.net[1].gamma.detach().std())}  # fmt: skip
