"""Dead ReLUs, seen in TensorBoard: nndx's series written through a SummaryWriter.

The same small MLP is trained twice on scikit-learn's digits (offline) in a plain
PyTorch loop watched by ``nndx.Monitor``:

- ``healthy``: default initialisation;
- ``dead-relu``: the hidden layer initialised with a bias of -20, so every hidden unit
  is zero for every input and gets no gradient. Nothing crashes; the loss just stays
  near ln(10) — the rules name DEAD_RELU.

The Monitor writes each run live to ``<logdir>/<run>`` through a ``SummaryWriter``
(``Monitor(..., tensorboard=writer)``): the loss, the global gradient norm, the
per-layer dead-unit fraction and the update/weight ratio per parameter, and histograms
of the weights and gradients every 20 steps. (A finished report, e.g. one loaded from
JSON, goes the same way with ``export_report(TensorBoardSink(writer), report)``.) The
script reads the event files back with TensorBoard's own EventAccumulator and prints
what is there.
It exits 1 if the broken run is not diagnosed DEAD_RELU or the healthy one raises a
warning.

Run: ``.venv/bin/python examples/integration_tensorboard.py [--logdir runs/nndx]``,
then ``tensorboard --logdir runs/nndx`` (needs ``pip install 'nndx[tensorboard]'``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import nndx
from nndx.report import SEVERITY_ORDER

STEPS, BATCH = 60, 64


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32)
    x = (x - x.mean(dim=0)) / x.std(dim=0).clamp_min(1e-6)
    return x, torch.tensor(bunch.target)


def train(dead_relu: bool, writer: SummaryWriter) -> nndx.DiagnosticReport:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    if dead_relu:
        with torch.no_grad():
            model[0].bias.fill_(-20.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = digits()
    monitor = nndx.Monitor(model, optimizer, every=5, loss_fn=nn.CrossEntropyLoss(), tensorboard=writer,
                           histogram_every=20)  # fmt: skip
    with monitor:
        for step in range(STEPS):
            batch = torch.randint(0, len(x), (BATCH,))
            optimizer.zero_grad()
            loss = monitor.loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            monitor.log(loss)
    return monitor.report()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", help="TensorBoard log directory (default: a temporary one)")
    args = parser.parse_args()
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="nndx-tensorboard-"))

    from tensorboard.backend.event_processing import event_accumulator

    failures = 0
    for name, dead_relu, expected in (("healthy", False, None), ("dead-relu", True, "DEAD_RELU")):
        writer = SummaryWriter(log_dir=str(logdir / name))
        report = train(dead_relu, writer)
        writer.close()

        events = event_accumulator.EventAccumulator(str(logdir / name), size_guidance={"scalars": 0, "histograms": 0})
        events.Reload()
        dead = events.Scalars("nndx/dead_unit_fraction/1")[-1].value
        alarms = [f for f in nndx.diagnose(report).findings if SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]]
        codes = [f.code.value for f in alarms]
        ok = expected in codes if expected else not alarms
        failures += not ok
        steps = len(events.Scalars("nndx/loss/train"))
        print(f"{name:10s} {steps} steps, {len(events.Tags()['scalars'])} scalar series, "
              f"{len(events.Tags()['histograms'])} histograms; dead-unit fraction after the ReLU {dead:.2f}; "
              f"findings: {', '.join(codes) or 'none'} {'ok' if ok else 'UNEXPECTED'}")  # fmt: skip
    print(f"\nevent files in {logdir}  (view: tensorboard --logdir {logdir})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
