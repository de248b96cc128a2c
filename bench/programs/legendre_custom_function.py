"""Port of pytorch/tutorials' "PyTorch: Defining New autograd Functions": y = a + b * P3(c + d x),
P3 the Legendre polynomial of degree three written as a custom ``torch.autograd.Function`` with
its own ``backward``, fitted to sin(x) on [-pi, pi] by hand-written gradient descent on the
summed squared error.

Source: github.com/pytorch/tutorials,
``beginner_source/examples_autograd/polynomial_custom_function.py`` at commit
02ed6c5cf613bbf2b631704eee62033b8bd746ef (BSD-3-Clause, Copyright (c) 2017-2022 Pytorch
contributors). Written anew from the facts of that file; no code copied.

Kept: ``LegendrePolynomial3`` (``forward`` saves its input with ``ctx.save_for_backward`` and
returns ``0.5 * (5 x^3 - 3 x)``; ``backward`` returns ``grad_output * 1.5 * (5 x^2 - 1)``), applied
as ``P3 = LegendrePolynomial3.apply``; the data (``x = torch.linspace(-pi, pi, 2000)``, ``y =
sin(x)``, float32, CPU); the four scalar weights initialised to a = 0, b = -1, c = 0, d = 0.3;
``learning_rate`` 5e-6; 2000 steps of: ``y_pred = a + b * P3(c + d * x)``, ``loss = (y_pred -
y).pow(2).sum()``, the loss printed every 100 steps, ``loss.backward()``, then under
``torch.no_grad()`` ``a -= learning_rate * a.grad`` (the same for b, c, d) and ``a.grad = None``
(the same for b, c, d). Nothing shrunk: the original runs in about a second on a CPU.
Changed so nndx has something to attach to: the script has no ``nn.Module``; its four tensors
are held as ``nn.Parameter`` s of a small module (``Legendre3``, whose ``forward`` is the
script's ``a + b * P3(c + d * x)``) and the loop refers to them as ``a, b, c, d`` exactly as the
script does (the way the next tutorial, ``polynomial_module.py``, holds the same four weights).
Measure only (not in the program): the last loss and the RMS error of the fit on the 2000
points are returned.

nndx, as the author would add it: ``nndx.probe(model, (x, y), loss_fn)`` before the loop, with
``loss_fn(y_pred, y) = (y_pred - y).pow(2).sum()`` (the script's loss) and no optimizer (there is
none); ``nndx.Monitor(model, every=10)`` (no optimizer: the README's way for hand-written
updates) around the loop, the loss logged where the script prints it; after the loop
``nndx.probe(..., monitor=mon)`` on the same batch, and ``nndx.diagnose``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "legendre_custom_function"
SOURCE = Source(
    "pytorch/tutorials", "beginner_source/examples_autograd/polynomial_custom_function.py",
    "02ed6c5cf613bbf2b631704eee62033b8bd746ef", "BSD-3-Clause",
)  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the tutorial as published (2000 points, 2000 steps of hand-written gradient descent)"),
        Variant(
            "backward_ignores_grad_output",
            "LegendrePolynomial3.backward returns 1.5 * (5 * input ** 2 - 1), the local derivative, without "
            "multiplying it by grad_output: c and d get the sum of P3' over the points, a number that does not "
            "depend on the loss, and are pushed by it step after step",
            (C.BROKEN_BACKWARD,),
            ("https://github.com/k2-fsa/k2/issues/341",
             "https://github.com/pytorch/tutorials/issues/216",
             "https://github.com/pytorch/pytorch/issues/995"),
            Measure("final_loss", "last loss at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
        Variant(
            "grads_not_reset",
            "the four 'a.grad = None' lines after the update are left out: every backward adds to the "
            "gradients of all the steps before, and the hand-written update steps along the running sum",
            (C.MISSING_ZERO_GRAD,),
            ("https://github.com/greebear/pytorch-learning/issues/1",
             "https://github.com/llSourcell/pytorch_in_5_minutes/issues/1",
             "https://github.com/jcjohnson/pytorch-examples/issues/31"),
            Measure("final_loss", "last loss at least 3x the healthy run's",
                    lambda healthy, buggy: not buggy < 3.0 * healthy),
        ),
    )
}

STEPS, N_POINTS, LEARNING_RATE, PRINT_EVERY = 2000, 2000, 5e-6, 100


def make_function(broken_backward: bool) -> type[torch.autograd.Function]:
    class LegendrePolynomial3(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input):
            ctx.save_for_backward(input)
            return 0.5 * (5 * input**3 - 3 * input)

        @staticmethod
        def backward(ctx, grad_output):
            (input,) = ctx.saved_tensors
            if broken_backward:  # the bug: the chain rule's grad_output left out
                return 1.5 * (5 * input**2 - 1)
            return grad_output * 1.5 * (5 * input**2 - 1)

    return LegendrePolynomial3


class Legendre3(nn.Module):
    """The script's four weights, held where nndx can see them; forward is the script's."""

    def __init__(self, function: type[torch.autograd.Function], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.function = function
        self.a = nn.Parameter(torch.full((), 0.0, device=device, dtype=dtype))
        self.b = nn.Parameter(torch.full((), -1.0, device=device, dtype=dtype))
        self.c = nn.Parameter(torch.full((), 0.0, device=device, dtype=dtype))
        self.d = nn.Parameter(torch.full((), 0.3, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # To apply our Function, we use Function.apply method. We alias this as 'P3'.
        P3 = self.function.apply
        return self.a + self.b * P3(self.c + self.d * x)


def loss_fn(y_pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (y_pred - y).pow(2).sum()


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)  # nothing in the script is random; kept for the harness
    dtype = torch.float
    device = torch.device("cpu")

    x = torch.linspace(-math.pi, math.pi, N_POINTS, device=device, dtype=dtype)
    y = torch.sin(x)

    model = Legendre3(make_function(variant == "backward_ignores_grad_output"), dtype, device)
    a, b, c, d = model.a, model.b, model.c, model.d

    nx.preflight(model, (x, y), loss_fn)
    mon = nx.monitor(model, None, every=10)

    learning_rate = LEARNING_RATE
    loss_value = float("nan")
    for t in range(STEPS):
        y_pred = model(x)

        # Compute and print loss
        loss = (y_pred - y).pow(2).sum()
        if t % PRINT_EVERY == PRINT_EVERY - 1:
            nx.timed(lambda: mon.log(loss))  # noqa: B023
            _ = f"{t} {loss.item()}"
        loss_value = loss.item()

        # Use autograd to compute the backward pass.
        loss.backward()

        # Update weights using gradient descent
        with torch.no_grad():
            a -= learning_rate * a.grad
            b -= learning_rate * b.grad
            c -= learning_rate * c.grad
            d -= learning_rate * d.grad

            if variant != "grads_not_reset":
                # Manually zero the gradients after updating weights
                a.grad = None
                b.grad = None
                c.grad = None
                d.grad = None

    nx.finish(mon, model, (x, y), loss_fn)

    with torch.no_grad():
        rms = float((model(x) - y).pow(2).mean().sqrt())
    return {"final_loss": loss_value, "rms_error": rms, "a": a.item(), "b": b.item(), "c": c.item(), "d": d.item()}
