"""Layer family: every hidden bias initialised to -5, so every ReLU unit is dead.

Run: .venv/bin/python examples/diagnose_dead_relu.py
Expect DEAD_RELU first (dead_unit_fraction 1.0 — not the "50% zeros" every healthy
ReLU layer shows), with the stuck loss and vanishing gradients citing it.
"""

import torch
from torch import nn

import nndx
from nndx.rules.cli import format_diagnosis

torch.manual_seed(0)
x = torch.randn(512, 20)
y = x[:, :4].argmax(1)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
nn.init.constant_(model[0].bias, -5.0)  # the bug
nn.init.constant_(model[2].bias, -5.0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()

with nndx.Monitor(model, optimizer, every=5, loss_fn=loss_fn) as monitor:
    for step in range(60):
        batch = torch.randint(0, 512, (64,))
        optimizer.zero_grad()
        loss = monitor.loss_fn(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        monitor.log(loss)

report = nndx.probe(model, (x[:64], y[:64]), loss_fn, optimizer=optimizer, monitor=monitor, probes=["hooks"])
diagnosis = nndx.diagnose(report)
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "DEAD_RELU"
