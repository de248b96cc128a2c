"""Loss-curve family: SGD at lr=10 — the loss bounces, gradients explode, NaN follows.

Run: .venv/bin/python examples/diagnose_lr_too_high.py
Expect the root cause LR_TOO_HIGH first, the NaN / divergence / exploding-gradient
findings citing it (``explained by``).
"""

import torch
from torch import nn

import nndx
from nndx.rules.cli import format_diagnosis

torch.manual_seed(0)
x = torch.randn(512, 20)
y = (x[:, :4].argmax(1))  # 4 learnable classes
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=10.0)  # the bug: lr=10
loss_fn = nn.CrossEntropyLoss()

with nndx.Monitor(model, optimizer, every=5, loss_fn=loss_fn) as monitor:
    for step in range(60):
        batch = torch.randint(0, 512, (64,))
        optimizer.zero_grad()
        loss = monitor.loss_fn(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        monitor.log(loss)

report = nndx.probe(model, (x[:64], y[:64]), loss_fn, optimizer=optimizer, monitor=monitor,
                    probes=["hooks", "nan_origin", "lr_range"], lr_range={"steps": 40})
diagnosis = nndx.diagnose(report)
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "LR_TOO_HIGH"
