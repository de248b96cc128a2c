"""Port of fastai/fastbook chapter 17 ("A Neural Net from the Foundations"): a two-layer MLP
built from hand-written ``Lin``, ``Relu`` and ``Mse`` classes, each storing its input and output
in ``__call__`` and writing gradients into ``.g`` attributes in its own ``backward``; a
``Model`` that chains them and calls their ``backward`` in reverse; trained by hand.

Source: github.com/fastai/fastbook, ``17_foundations.ipynb`` at commit
02af2d7c9189f44158c79438fee80d4a53d305dd (GPL-3.0 for the notebooks' code, per the repository's
LICENSE; the book's prose is CC BY-NC-SA). Written anew from the facts of that notebook; no
code copied.

Kept: the data (``x = torch.randn(200, 100)``, ``y = torch.randn(200)``: random targets, as the
chapter uses); Kaiming init (``w1 = randn(100, 50) * sqrt(2/100)``, ``b1 = zeros(50)``,
``w2 = randn(50, 1) * sqrt(2/50)``, ``b2 = zeros(1)``); ``Relu`` (``clamp_min(0.)``; backward
``inp.g = (inp > 0).float() * out.g``); ``Lin`` (``inp @ w + b``; backward ``inp.g = out.g @
w.t()``, ``w.g = inp.t() @ out.g``, ``b.g = out.g.sum(0)``); ``Mse`` (``(inp.squeeze() -
targ).pow(2).mean()``; backward ``2 * x / targ.shape[0]`` with ``x = (inp.squeeze() -
targ).unsqueeze(-1)``); ``Model(w1, b1, w2, b2)`` with ``layers = [Lin, Relu, Lin]`` and ``loss
= Mse()``, ``loss = model(x, y)`` then ``model.backward()``.
Added (the chapter stops at one forward/backward): the training by hand that the chapter's
``.g`` gradients exist for, full-batch gradient descent ``p -= lr * p.g`` on ``w1, b1, w2,
b2`` for 300 steps at lr 0.1, no autograd anywhere. Nothing shrunk (the chapter's sizes run in
a fraction of a second).
Measure only: the final training loss (the loss of the last step) and the loss after the last
update.

nndx, as the author would add it after the README: ``nndx.probe`` and ``nndx.Monitor`` take an
``nn.Module``, and this program has none, so the author writes the smallest one that lets nndx
see the model: ``Net(nn.Module)``, whose parameters are the chapter's own tensors (the same
storage, ``requires_grad=False``: the program computes its gradients by hand, never through
autograd) and whose ``forward`` runs fresh ``Lin``/``Relu`` objects over them; the loss is the
chapter's ``Mse``. A preflight ``nndx.probe(net, (x, y), mse)`` before training (no optimizer
object exists to pass); ``nndx.Monitor(net, None, every=10)`` around the loop (refused, and
recorded, if it needs an optimizer), the loss logged every step; ``nndx.probe(..., monitor=mon)``
after training.
"""

from __future__ import annotations

from math import sqrt

import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "fastbook_foundations"
SOURCE = Source("fastai/fastbook", "17_foundations.ipynb", "02af2d7c9189f44158c79438fee80d4a53d305dd", "GPL-3.0")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the chapter's Model with Kaiming init, trained by hand (300 full-batch steps, lr 0.1)"),
        Variant(
            "relu_backward_drops_upstream",
            "Relu.backward writes inp.g = (inp > 0).float(), leaving out the '* out.g': the gradient reaching "
            "the first layer is the ReLU's 0/1 mask, not the chain-rule product, so w1 and b1 are updated along "
            "a direction unrelated to the loss",
            (C.BROKEN_BACKWARD,),
            ("https://github.com/haifengl/smile/issues/528",
             "https://github.com/andersy005/deep-learning-specialization-coursera/pull/5",
             "https://github.com/oreilly-japan/deep-learning-from-scratch/pull/43"),
            Measure("final_loss", "final training loss at least 0.1 above the healthy run's",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
        Variant(
            "unscaled_init",
            "the weights drawn as torch.randn(100, 50) and torch.randn(50, 1) without the sqrt(2 / n_in) "
            "(Kaiming) factor, the chapter's own first attempt: activations and gradients tens of times too "
            "large for the hand-written update",
            (C.BAD_INIT,),
            ("https://github.com/fastai/fastbook/blob/02af2d7c9189f44158c79438fee80d4a53d305dd/17_foundations.ipynb",
             "https://arxiv.org/abs/1502.01852"),
            Measure("final_loss", "final training loss at least 0.1 above the healthy run's (or not finite)",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
    )
}

N_SAMPLES, N_IN, N_HIDDEN, LR, STEPS = 200, 100, 50, 0.1, 300


# --------------------------------------------------------------------------- 17_foundations.ipynb


def make_relu(upstream: bool = True):
    class Relu:
        def __call__(self, inp):
            self.inp = inp
            self.out = inp.clamp_min(0.)
            return self.out

        def backward(self):
            if upstream:
                self.inp.g = (self.inp > 0).float() * self.out.g
            else:
                self.inp.g = (self.inp > 0).float()

    return Relu


class Lin:
    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, inp):
        self.inp = inp
        self.out = inp @ self.w + self.b
        return self.out

    def backward(self):
        self.inp.g = self.out.g @ self.w.t()
        self.w.g = self.inp.t() @ self.out.g
        self.b.g = self.out.g.sum(0)


class Mse:
    def __call__(self, inp, targ):
        self.inp = inp
        self.targ = targ
        self.out = (inp.squeeze() - targ).pow(2).mean()
        return self.out

    def backward(self):
        x = (self.inp.squeeze() - self.targ).unsqueeze(-1)
        self.inp.g = 2. * x / self.targ.shape[0]


class Model:
    def __init__(self, w1, b1, w2, b2, relu_cls):
        self.layers = [Lin(w1, b1), relu_cls(), Lin(w2, b2)]
        self.loss = Mse()

    def __call__(self, x, targ):
        for l in self.layers:
            x = l(x)
        return self.loss(x, targ)

    def backward(self):
        self.loss.backward()
        for l in reversed(self.layers):
            l.backward()


# --------------------------------------------------------------------------- what the author adds for nndx


class Net(nn.Module):
    """The chapter's tensors as an nn.Module (same storage), its forward the chapter's layers."""

    def __init__(self, w1, b1, w2, b2, relu_cls):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(w1, requires_grad=False), nn.Parameter(b1, requires_grad=False)
        self.w2, self.b2 = nn.Parameter(w2, requires_grad=False), nn.Parameter(b2, requires_grad=False)
        self.relu_cls = relu_cls

    def forward(self, x):
        for l in (Lin(self.w1, self.b1), self.relu_cls(), Lin(self.w2, self.b2)):
            x = l(x)
        return x


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    x = torch.randn(N_SAMPLES, N_IN)
    y = torch.randn(N_SAMPLES)

    if variant == "unscaled_init":
        w1 = torch.randn(N_IN, N_HIDDEN)
        b1 = torch.zeros(N_HIDDEN)
        w2 = torch.randn(N_HIDDEN, 1)
        b2 = torch.zeros(1)
    else:
        w1 = torch.randn(N_IN, N_HIDDEN) * sqrt(2 / N_IN)
        b1 = torch.zeros(N_HIDDEN)
        w2 = torch.randn(N_HIDDEN, 1) * sqrt(2 / N_HIDDEN)
        b2 = torch.zeros(1)
    relu_cls = make_relu(upstream=variant != "relu_backward_drops_upstream")

    model = Model(w1, b1, w2, b2, relu_cls)
    net = Net(w1, b1, w2, b2, relu_cls)

    def mse(out, targ):
        return Mse()(out, targ)

    nx.preflight(net, (x, y), mse)
    mon = nx.monitor(net, None, every=10)

    first_loss = loss_value = float("nan")
    for step in range(STEPS):
        loss = model(x, y)
        model.backward()
        for p in (w1, b1, w2, b2):
            p -= LR * p.g
        nx.timed(lambda: mon.log(loss))  # noqa: B023
        loss_value = loss.item()
        if step == 0:
            first_loss = loss_value

    nx.finish(mon, net, (x, y), mse)
    after = Model(w1, b1, w2, b2, relu_cls)(x, y).item()
    return {"final_loss": loss_value, "loss_after_training": after, "first_loss": first_loss}
