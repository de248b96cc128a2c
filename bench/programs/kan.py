"""Port of Blealtan/efficient-kan: a Kolmogorov-Arnold Network (``KAN`` of ``KANLinear`` layers,
a SiLU base path plus learnable B-spline activations) trained by its ``examples/mnist.py``.

Source: github.com/Blealtan/efficient-kan, ``src/efficient_kan/kan.py`` and
``examples/mnist.py`` at commit 7b6ce1c87f18c8bc90c208f6b494042344216b11 (MIT, Copyright (c)
2024 Huanqi Cao). Written anew from the facts of those files; no code copied.

Kept: ``KANLinear`` (the ``grid`` buffer: ``grid_size + 2 * spline_order + 1`` knots per input
spaced ``h = (grid_range[1] - grid_range[0]) / grid_size`` apart from ``grid_range[0] -
spline_order * h``; ``base_weight`` (out, in), ``spline_weight`` (out, in, grid_size +
spline_order), the standalone ``spline_scaler`` (out, in); ``reset_parameters``:
``kaiming_uniform_`` of ``base_weight`` with ``a = sqrt(5) * scale_base``, the spline weights
fitted by ``curve2coeff`` to uniform noise of width ``scale_noise / grid_size`` at the
interior knots, ``kaiming_uniform_`` of ``spline_scaler`` with ``a = sqrt(5) * scale_spline``;
``b_splines`` by the Cox-de Boor recursion from the order-0 indicator of each knot interval;
``curve2coeff`` by ``torch.linalg.lstsq``; ``scaled_spline_weight``; ``forward`` =
``F.linear(SiLU(x), base_weight) + F.linear(b_splines(x) flattened, scaled_spline_weight
flattened)``; ``update_grid`` and ``regularization_loss`` (defined, unused by the example,
as in the original)); ``KAN`` as a ``ModuleList`` of ``KANLinear`` over ``layers_hidden``
(grid_size 5, spline_order 3, scale_noise 0.1, scale_base 1, scale_spline 1, grid_eps 0.02,
grid_range [-1, 1]); ``examples/mnist.py``: the transform ``ToTensor`` + ``Normalize((0.5,),
(0.5,))``, a shuffled train loader and an unshuffled val loader of batch 64, ``KAN([in, 64,
10])``, ``AdamW(lr=1e-3, weight_decay=1e-4)``, ``ExponentialLR(gamma=0.8)`` stepped once per
epoch after validation, ``nn.CrossEntropyLoss()``; per batch ``images.view(-1, in)``,
``zero_grad``, forward, loss, ``backward``, ``step``, the batch accuracy into the progress
bar's postfix (kept as a record); per epoch ``model.eval()`` + ``no_grad`` validation, the
loss and accuracy averaged over the val batches, printed (kept as a record).
Shrunk: scikit-learn's 8x8 digits (64 inputs, 1,437 train / 360 val) instead of MNIST's
28x28 (784); the hidden width 32 instead of 64; batch 16 instead of 64 (lr kept), so that
the 10 epochs as published make 900 steps (90 batches each instead of 938; at batch 64 the
healthy run stops at val accuracy 0.84, undertrained); CPU, no tqdm.
Measure only: none; the final epoch's val accuracy and val loss are the program's own prints.

nndx, as the author would add it: a preflight ``nndx.probe`` on the first training batch
(as the loop sees it, flattened) with the data splits, ``nndx.Monitor(model, optimizer)``
around the epochs with ``criterion`` called as ``mon.loss_fn``, every batch's loss and
accuracy logged, each epoch's val loss and accuracy logged as ``split="val"``; then
``nndx.probe(..., monitor=mon)`` and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn, optim

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "kan"
SOURCE = Source("Blealtan/efficient-kan", "examples/mnist.py", "7b6ce1c87f18c8bc90c208f6b494042344216b11", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (KAN([in, hidden, 10]), AdamW, ExponentialLR per epoch)"),
        Variant(
            "inputs_outside_grid",
            "the images fed as their raw 0-255 pixel values (ToTensor/Normalize left out): almost every input lies "
            "outside the splines' grid [-1, 1], where every B-spline basis is 0, so the first layer's spline "
            "activations are dead and only the SiLU base path of huge inputs is left",
            (C.UNNORMALIZED_INPUTS,),
            ("https://github.com/KindXiaoming/pykan/issues/142", "https://github.com/KindXiaoming/pykan/issues/71",
             "https://github.com/KindXiaoming/pykan/issues/263", "https://github.com/KindXiaoming/pykan/issues/385"),
            Measure("val_loss", "final val loss 1.5x the healthy run's or more: 0.40 against 0.21 on seed 0 (val "
                    "accuracy 0.924 against 0.967, while the train loss ends lower: 0.02 against 0.17)",
                    lambda healthy, buggy: buggy >= 1.5 * healthy),
        ),
        Variant(
            "constant_init",
            "reset_parameters as first published: base_weight and spline_scaler filled with the constants "
            "scale_base and scale_spline (1.0) instead of kaiming_uniform_: every hidden unit starts as the same "
            "function of the input (only the tiny spline noise tells them apart)",
            (C.BAD_INIT,),
            ("https://github.com/Blealtan/efficient-kan/commit/9eaa8d212663a60acf094df1d19ca3b515398a31",
             "https://github.com/Blealtan/efficient-kan/commit/baf13b1",
             "https://github.com/Blealtan/efficient-kan/blob/7b6ce1c87f18c8bc90c208f6b494042344216b11/README.md"),
            Measure("val_accuracy", "final val accuracy at least 0.05 below the healthy run's: 0.49 against 0.97 "
                    "on seed 0 (the README: ~20% against ~97% on MNIST)", lambda healthy, buggy: buggy <= healthy - 0.05),
        ),
    )
}

ARGS = {"hidden": 32, "batch_size": 16, "lr": 1e-3, "weight_decay": 1e-4, "gamma": 0.8, "epochs": 10}


# --------------------------------------------------------------------------- src/efficient_kan/kan.py


class KANLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, grid_size: int = 5, spline_order: int = 3,
                 scale_noise: float = 0.1, scale_base: float = 1.0, scale_spline: float = 1.0,
                 enable_standalone_scale_spline: bool = True, base_activation=nn.SiLU, grid_eps: float = 0.02,
                 grid_range=(-1, 1), constant_init: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.grid_size, self.spline_order = grid_size, spline_order
        h = (grid_range[1] - grid_range[0]) / grid_size
        knots = torch.arange(-spline_order, grid_size + spline_order + 1) * h + grid_range[0]
        self.register_buffer("grid", knots.expand(in_features, -1).contiguous())
        self.base_weight = nn.Parameter(torch.empty(out_features, in_features))
        self.spline_weight = nn.Parameter(torch.empty(out_features, in_features, grid_size + spline_order))
        if enable_standalone_scale_spline:
            self.spline_scaler = nn.Parameter(torch.empty(out_features, in_features))
        self.scale_noise, self.scale_base, self.scale_spline = scale_noise, scale_base, scale_spline
        self.enable_standalone_scale_spline = enable_standalone_scale_spline
        self.base_activation = base_activation()
        self.grid_eps = grid_eps
        self.constant_init = constant_init
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.constant_init:  # the first published version
            nn.init.constant_(self.base_weight, self.scale_base)
        else:
            nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * self.scale_base)
        with torch.no_grad():
            noise = ((torch.rand(self.grid_size + 1, self.in_features, self.out_features) - 0.5)
                     * self.scale_noise / self.grid_size)  # fmt: skip
            scale = self.scale_spline if not self.enable_standalone_scale_spline else 1.0
            self.spline_weight.data.copy_(scale * self.curve2coeff(self.grid.T[self.spline_order : -self.spline_order],
                                                                   noise))  # fmt: skip
            if self.enable_standalone_scale_spline:
                if self.constant_init:
                    nn.init.constant_(self.spline_scaler, self.scale_spline)
                else:
                    nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * self.scale_spline)

    def b_splines(self, x: torch.Tensor) -> torch.Tensor:
        """The B-spline bases of each input: (batch, in_features, grid_size + spline_order)."""
        assert x.dim() == 2 and x.size(1) == self.in_features
        grid = self.grid
        x = x.unsqueeze(-1)
        bases = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
        for k in range(1, self.spline_order + 1):
            left = (x - grid[:, : -(k + 1)]) / (grid[:, k:-1] - grid[:, : -(k + 1)]) * bases[:, :, :-1]
            right = (grid[:, k + 1 :] - x) / (grid[:, k + 1 :] - grid[:, 1:(-k)]) * bases[:, :, 1:]
            bases = left + right
        assert bases.size() == (x.size(0), self.in_features, self.grid_size + self.spline_order)
        return bases.contiguous()

    def curve2coeff(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Least-squares spline coefficients through the points (x, y): (out, in, coeff)."""
        assert x.dim() == 2 and x.size(1) == self.in_features
        assert y.size() == (x.size(0), self.in_features, self.out_features)
        A = self.b_splines(x).transpose(0, 1)
        B = y.transpose(0, 1)
        solution = torch.linalg.lstsq(A, B).solution
        result = solution.permute(2, 0, 1)
        assert result.size() == (self.out_features, self.in_features, self.grid_size + self.spline_order)
        return result.contiguous()

    @property
    def scaled_spline_weight(self) -> torch.Tensor:
        return self.spline_weight * (self.spline_scaler.unsqueeze(-1) if self.enable_standalone_scale_spline else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.size(-1) == self.in_features
        original_shape = x.shape
        x = x.reshape(-1, self.in_features)
        base_output = F.linear(self.base_activation(x), self.base_weight)
        spline_output = F.linear(self.b_splines(x).view(x.size(0), -1),
                                 self.scaled_spline_weight.view(self.out_features, -1))  # fmt: skip
        output = base_output + spline_output
        return output.reshape(*original_shape[:-1], self.out_features)

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor, margin: float = 0.01) -> None:
        assert x.dim() == 2 and x.size(1) == self.in_features
        batch = x.size(0)
        splines = self.b_splines(x).permute(1, 0, 2)
        orig_coeff = self.scaled_spline_weight.permute(1, 2, 0)
        unreduced_spline_output = torch.bmm(splines, orig_coeff).permute(1, 0, 2)
        x_sorted = torch.sort(x, dim=0)[0]
        grid_adaptive = x_sorted[torch.linspace(0, batch - 1, self.grid_size + 1, dtype=torch.int64)]
        uniform_step = (x_sorted[-1] - x_sorted[0] + 2 * margin) / self.grid_size
        grid_uniform = (torch.arange(self.grid_size + 1, dtype=torch.float32).unsqueeze(1) * uniform_step
                        + x_sorted[0] - margin)  # fmt: skip
        grid = self.grid_eps * grid_uniform + (1 - self.grid_eps) * grid_adaptive
        grid = torch.cat([
            grid[:1] - uniform_step * torch.arange(self.spline_order, 0, -1).unsqueeze(1),
            grid,
            grid[-1:] + uniform_step * torch.arange(1, self.spline_order + 1).unsqueeze(1),
        ], dim=0)  # fmt: skip
        self.grid.copy_(grid.T)
        self.spline_weight.data.copy_(self.curve2coeff(x, unreduced_spline_output))

    def regularization_loss(self, regularize_activation: float = 1.0, regularize_entropy: float = 1.0) -> torch.Tensor:
        """The author's stand-in for the paper's L1 + entropy regularisation, on the spline weights."""
        l1_fake = self.spline_weight.abs().mean(-1)
        regularization_loss_activation = l1_fake.sum()
        p = l1_fake / regularization_loss_activation
        regularization_loss_entropy = -torch.sum(p * p.log())
        return regularize_activation * regularization_loss_activation + regularize_entropy * regularization_loss_entropy


class KAN(nn.Module):
    def __init__(self, layers_hidden: list[int], grid_size: int = 5, spline_order: int = 3, scale_noise: float = 0.1,
                 scale_base: float = 1.0, scale_spline: float = 1.0, base_activation=nn.SiLU, grid_eps: float = 0.02,
                 grid_range=(-1, 1), constant_init: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.grid_size, self.spline_order = grid_size, spline_order
        self.layers = nn.ModuleList([
            KANLinear(i, o, grid_size=grid_size, spline_order=spline_order, scale_noise=scale_noise,
                      scale_base=scale_base, scale_spline=scale_spline, base_activation=base_activation,
                      grid_eps=grid_eps, grid_range=grid_range, constant_init=constant_init)
            for i, o in zip(layers_hidden, layers_hidden[1:])
        ])  # fmt: skip

    def forward(self, x: torch.Tensor, update_grid: bool = False) -> torch.Tensor:
        for layer in self.layers:
            if update_grid:
                layer.update_grid(x)
            x = layer(x)
        return x

    def regularization_loss(self, regularize_activation: float = 1.0, regularize_entropy: float = 1.0) -> torch.Tensor:
        return sum(layer.regularization_loss(regularize_activation, regularize_entropy) for layer in self.layers)


# --------------------------------------------------------------------------- examples/mnist.py


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    torch.manual_seed(seed)
    train_raw, train_labels, val_raw, val_labels = data.digit_images(seed=seed)
    side = train_raw.shape[-1]
    if variant == "inputs_outside_grid":  # the raw bytes, no ToTensor/Normalize
        x_train, x_val = train_raw.float().unsqueeze(1), val_raw.float().unsqueeze(1)
    else:  # ToTensor() + Normalize((0.5,), (0.5,))
        x_train, x_val = (data.to_tensor(train_raw) - 0.5) / 0.5, (data.to_tensor(val_raw) - 0.5) / 0.5

    model = KAN([side * side, args["hidden"], 10], constant_init=variant == "constant_init")
    optimizer = optim.AdamW(model.parameters(), lr=args["lr"], weight_decay=args["weight_decay"])
    scheduler = optim.lr_scheduler.ExponentialLR(optimizer, gamma=args["gamma"])
    criterion = nn.CrossEntropyLoss()

    flat_train, flat_val = x_train.view(-1, side * side), x_val.view(-1, side * side)
    first_batch = (flat_train[: args["batch_size"]], train_labels[: args["batch_size"]])
    splits = (flat_train, train_labels, flat_val, val_labels)
    nx.preflight(model, first_batch, criterion, optimizer=optimizer, data=splits)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=criterion)

    shuffle = torch.Generator().manual_seed(seed)
    postfix: list[dict[str, float]] = []
    printed: list[str] = []
    val_loss = val_accuracy = float("nan")
    for epoch in range(args["epochs"]):
        model.train()
        order = torch.randperm(len(x_train), generator=shuffle)
        for start in range(0, len(order), args["batch_size"]):
            idx = order[start : start + args["batch_size"]]
            images, labels = x_train[idx].view(-1, side * side), train_labels[idx]
            optimizer.zero_grad()
            output = model(images)
            loss = mon.loss_fn(output, labels)
            loss.backward()
            optimizer.step()
            accuracy = (output.argmax(dim=1) == labels).float().mean()
            mon.log(loss, accuracy=accuracy.item())
            postfix.append({"loss": loss.item(), "accuracy": accuracy.item(), "lr": optimizer.param_groups[0]["lr"]})

        model.eval()
        val_loss, val_accuracy, n_batches = 0.0, 0.0, 0
        with torch.no_grad():
            for start in range(0, len(x_val), args["batch_size"]):
                images = x_val[start : start + args["batch_size"]].view(-1, side * side)
                labels = val_labels[start : start + args["batch_size"]]
                output = model(images)
                val_loss += criterion(output, labels).item()
                val_accuracy += (output.argmax(dim=1) == labels).float().mean().item()
                n_batches += 1
        val_loss /= n_batches
        val_accuracy /= n_batches
        mon.log(val_loss, split="val", accuracy=val_accuracy)
        scheduler.step()
        printed.append(f"Epoch {epoch + 1}, Val Loss: {val_loss}, Val Accuracy: {val_accuracy}")

    nx.finish(mon, model, first_batch, criterion, optimizer=optimizer, data=splits)
    return {"val_accuracy": val_accuracy, "val_loss": val_loss, "train_loss": postfix[-1]["loss"],
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip
