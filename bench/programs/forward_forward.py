"""Port of the PyTorch forward-forward example (Hinton's FF algorithm on MNIST).

Source: github.com/pytorch/examples, ``mnist_forward_forward/main.py`` at commit
a066616499dd9a7647eef9e2e9392b63ddb0e217 (BSD-3-Clause, Copyright (c) 2017 Pytorch
contributors; based on github.com/mohammadpz/pytorch_forward_forward, MIT). Written anew
from the facts of that file; no code copied.

Kept: no end-to-end backward: each ``Layer`` (an ``nn.Linear`` subclass) owns its own
``Adam(lr=0.03)`` and trains alone, full batch, for ``epochs`` steps on the layer-local
loss ``log(1 + exp([-g_pos + threshold, g_neg - threshold])).mean()`` with goodness
``g = relu(x / (||x|| + 1e-4) @ W.T + b).pow(2).mean(1)`` and threshold 2, then hands
its detached outputs on positive and negative data to the next layer; ``overlay_y_on_x``
(the first 10 inputs zeroed, the label's one set to ``x.max()``); ``get_y_neg`` (a random
label other than the true one, per sample); ``Net`` keeping its layers in a plain Python
list and overriding ``train(x_pos, x_neg)``, ``Layer`` overriding ``train`` too (both
shadow ``nn.Module.train(mode)``, as in the original); ``predict`` by the label whose
overlay gives the largest goodness summed over the layers; inputs through ``ToTensor`` +
``Normalize`` and flattened; the whole training set as one batch.
Shrunk: scikit-learn's 8x8 digits (1,437 train / 360 test) instead of MNIST, layers
[64, 200, 200] instead of [784, 500, 500], 300 steps per layer instead of 1,000.

nndx, as the author would add it: the model is two layers each with its own optimizer
and its own loss, so one ``nndx.Monitor`` per layer/optimizer pair (as for a GAN), each
step's loss logged to its layer's Monitor; the layer-local loss restated for nndx's
``loss_fn(output, target)`` as ``softplus(-sign * (goodness - threshold)).mean()`` on
``cat([x_pos, x_neg])`` with ``sign`` +1/-1 (the same number as the original's); a
preflight ``nndx.probe`` of the first layer on the first layer's input; after training,
``nndx.probe(layer, ..., monitor=mon)`` of each layer on that layer's own input, each
diagnosed; the author reads both, ranked together. The test accuracy has no loss to log
against (``predict`` is an argmax over labels), so nothing is logged as ``split="val"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam

from bench.programs import data
from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "forward_forward"
SOURCE = Source("pytorch/examples", "mnist_forward_forward/main.py", "a066616499dd9a7647eef9e2e9392b63ddb0e217",
                "BSD-3-Clause")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published"),
        Variant(
            "negatives_by_shuffle",
            "negative labels by y[torch.randperm(n)] (the original pytorch_forward_forward) instead of get_y_neg: "
            "about a tenth of the 'negative' samples carry their true label",
            (C.LABEL_NOISE,),
            ("https://github.com/mpezeshki/pytorch_forward_forward/issues/8",
             "https://github.com/mpezeshki/pytorch_forward_forward/pull/12"),
            Measure("final_loss_layer0", "the first layer's FF loss at its last step, 1.1x the healthy run's or "
                    "more (1.16-1.18x on seeds 0-2; test accuracy drops only 0.002-0.009 at this size)",
                    lambda healthy, buggy: not buggy < 1.1 * healthy),
        ),
        Variant(
            "zero_grad_missing",
            "self.opt.zero_grad() left out of Layer.train: each step's gradient is the sum of every step's so far",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1",
             "https://github.com/yastrebksv/TennisCourtDetector/issues/7",
             "https://github.com/pytorch/pytorch/issues/47175"),
            Measure("test_accuracy", "test accuracy at least 0.05 below the healthy run's",
                    lambda healthy, buggy: not buggy > healthy - 0.05),
        ),
    )
}

LR, THRESHOLD, EPOCHS, DIMS = 0.03, 2.0, 300, [64, 200, 200]


def get_y_neg(y: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    y_neg = y.clone()
    for idx, y_samp in enumerate(y):
        allowed = [c for c in range(10) if c != y_samp.item()]
        y_neg[idx] = allowed[int(torch.randint(len(allowed), (1,), generator=generator))]
    return y_neg


def overlay_y_on_x(x: torch.Tensor, y: torch.Tensor | int, classes: int = 10) -> torch.Tensor:
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


def ff_loss(output: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """The layer-local loss as ``loss_fn(output, target)``: output = layer(cat([x_pos, x_neg])),
    target = +1 for positive, -1 for negative rows."""
    return F.softplus(-sign * (output.pow(2).mean(1) - THRESHOLD)).mean()


class Layer(nn.Linear):
    def __init__(self, in_features: int, out_features: int, zero_grad: bool = True) -> None:
        super().__init__(in_features, out_features)
        self.relu = nn.ReLU()
        self.opt = Adam(self.parameters(), lr=LR)
        self.threshold, self.num_epochs, self.zero_grad_each_step = THRESHOLD, EPOCHS, zero_grad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor, mon=None):  # shadows nn.Module.train, as in the original
        losses = []
        for _ in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            if self.zero_grad_each_step:
                self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if mon is not None:
                mon.log(loss)
            losses.append(loss.item())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach(), losses


class Net(nn.Module):
    def __init__(self, dims: list[int], zero_grad: bool = True) -> None:
        super().__init__()
        self.layers = []  # a plain list, as in the original: Net itself registers no parameters
        for d in range(len(dims) - 1):
            self.layers = self.layers + [Layer(dims[d], dims[d + 1], zero_grad)]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness = goodness + [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor, nx: Nndx | None = None, monitors=()):
        h_pos, h_neg = x_pos, x_neg
        inputs, losses = [], []
        for i, layer in enumerate(self.layers):
            inputs.append((h_pos, h_neg))
            h_pos, h_neg, layer_losses = layer.train(h_pos, h_neg, monitors[i] if monitors else None)
            losses.append(layer_losses)
        return inputs, losses


def probe_batch(x_pos: torch.Tensor, x_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sign = torch.cat([torch.ones(len(x_pos)), -torch.ones(len(x_neg))])
    return torch.cat([x_pos, x_neg]), sign


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(1 + seed)
    generator = torch.Generator().manual_seed(seed)
    train_images, train_labels, test_images, test_labels = data.digit_images(seed=seed)
    train_x, test_x = data.to_tensor(train_images), data.to_tensor(test_images)
    mean, std = train_x.mean().item(), train_x.std().item()  # MNIST's Normalize((0.1307,), (0.3081,))
    x, x_te = ((train_x - mean) / std).flatten(1), ((test_x - mean) / std).flatten(1)
    y, y_te = train_labels, test_labels

    net = Net(DIMS, zero_grad=variant != "zero_grad_missing")
    x_pos = overlay_y_on_x(x, y)
    if variant == "negatives_by_shuffle":
        y_neg = y[torch.randperm(x.size(0), generator=generator)]
    else:
        y_neg = get_y_neg(y, generator)
    x_neg = overlay_y_on_x(x, y_neg)

    nx.preflight(net.layers[0], probe_batch(x_pos, x_neg), ff_loss, optimizer=net.layers[0].opt)
    monitors = [nx.monitor(layer, layer.opt, every=10) for layer in net.layers]
    inputs, losses = net.train(x_pos, x_neg, nx, monitors)
    for layer, mon, (h_pos, h_neg) in zip(net.layers, monitors, inputs):
        nx.finish(mon, layer, probe_batch(h_pos, h_neg), ff_loss, optimizer=layer.opt)

    with torch.no_grad():
        train_accuracy = net.predict(x).eq(y).float().mean().item()
        test_accuracy = net.predict(x_te).eq(y_te).float().mean().item()
    return {
        "train_accuracy": train_accuracy,
        "test_accuracy": test_accuracy,
        "final_loss_layer0": losses[0][-1],
        "final_loss_layer1": losses[1][-1],
        "false_negative_share": y_neg.eq(y).float().mean().item(),
    }
