"""Error family: an in-place op overwrites a tensor autograd saved, and backward raises.

Run: .venv/bin/python examples/diagnose_inplace_error.py
nndx.probe catches the exception (your process never crashes because of nndx) and the
recorded message maps to INPLACE_AUTOGRAD.
"""

import torch
from torch import nn

import nndx
from nndx.rules.cli import format_diagnosis


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(20, 64), nn.Linear(64, 4)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        h *= 2.0  # the bug: sigmoid saved h for its backward
        return self.fc2(h)


torch.manual_seed(0)
x, y = torch.randn(64, 20), torch.randint(0, 4, (64,))
report = nndx.probe(Net(), (x, y), nn.CrossEntropyLoss(), probes=["overfit_one_batch"])
diagnosis = nndx.diagnose(report)
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "INPLACE_AUTOGRAD"
