"""Data family: the labels were shuffled separately from the inputs.

Run: .venv/bin/python examples/diagnose_labels_misaligned.py
Overfit-one-batch passes (networks memorise random labels); the label-alignment probe —
real labels no better than permuted ones on held-out data — names LABELS_MISALIGNED.
"""

import torch

import nndx
from nndx.collector.probes.label_alignment import label_alignment
from nndx.report import DiagnosticReport, Probes
from nndx.rules.cli import format_diagnosis

torch.manual_seed(0)
x = torch.randn(1000, 20)
y = x[:, :4].argmax(1)
y = y[torch.randperm(len(y))]  # the bug: shuffled on its own

report = DiagnosticReport(
    task="classification",
    num_classes=4,
    data=nndx.check_data(x, y),
    probes=Probes(label_alignment=label_alignment(x, y)),
)
diagnosis = nndx.diagnose(report)
print(format_diagnosis(diagnosis))
assert diagnosis.top().code.value == "LABELS_MISALIGNED"
