"""Probe family: a custom autograd.Function whose backward halves the weight gradient.

Run: .venv/bin/python examples/diagnose_broken_backward.py
Training "works" (the loss falls, slower); the gradient check against finite
differences names the parameter: BROKEN_BACKWARD.
"""

import torch
from torch import nn

import nndx
from nndx.rules.cli import format_diagnosis


class HalfGradLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return grad_out @ weight, 0.5 * grad_out.t() @ x, grad_out.sum(0)  # the bug: 0.5


class MyLinear(nn.Linear):
    def forward(self, x):
        return HalfGradLinear.apply(x, self.weight, self.bias)


torch.manual_seed(0)
x, y = torch.randn(64, 20), torch.randint(0, 4, (64,))
model = nn.Sequential(MyLinear(20, 32), nn.Tanh(), nn.Linear(32, 4))
report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), probes=["grad_check"])
diagnosis = nndx.diagnose(report)
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "BROKEN_BACKWARD"
