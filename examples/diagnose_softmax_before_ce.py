"""Model/loss family: the model ends in nn.Softmax and is trained with CrossEntropyLoss,
which applies log_softmax itself.

Run: .venv/bin/python examples/diagnose_softmax_before_ce.py
Expect DOUBLE_SOFTMAX first: the Monitor saw rows that already sum to one at the loss.
"""

import torch
from torch import nn

import nndx
from nndx.rules.cli import format_diagnosis

torch.manual_seed(0)
x = torch.randn(512, 20)
y = x[:, :4].argmax(1)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4), nn.Softmax(dim=1))  # the bug
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()

with nndx.Monitor(model, optimizer, every=5, loss_fn=loss_fn) as monitor:
    for step in range(40):
        batch = torch.randint(0, 512, (64,))
        optimizer.zero_grad()
        loss = monitor.loss_fn(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        monitor.log(loss)

diagnosis = nndx.diagnose(monitor.report())
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "DOUBLE_SOFTMAX"
