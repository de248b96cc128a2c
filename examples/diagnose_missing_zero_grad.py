"""Loop family: optimizer.zero_grad() is never called, so gradients add up step after step.

Run: .venv/bin/python examples/diagnose_missing_zero_grad.py
Expect MISSING_ZERO_GRAD first; deliberate accumulation (k backward passes per
zero_grad) would not fire — see tests/rules/test_rules_discrimination.py.
"""

import torch
from torch import nn

import nndx
from nndx.rules.cli import format_diagnosis

torch.manual_seed(0)
x = torch.randn(512, 20)
y = x[:, :4].argmax(1)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()

with nndx.Monitor(model, optimizer, every=5, loss_fn=loss_fn) as monitor:
    for step in range(60):
        batch = torch.randint(0, 512, (64,))
        loss = monitor.loss_fn(model(x[batch]), y[batch])
        loss.backward()  # the bug: no optimizer.zero_grad() before this
        optimizer.step()
        monitor.log(loss)

diagnosis = nndx.diagnose(monitor.report())
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "MISSING_ZERO_GRAD"
