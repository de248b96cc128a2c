"""`nndx demo`: the lesson's three broken networks and a healthy one, each trained for
real on a small synthetic task, watched by the Monitor, probed, and diagnosed.

Each scenario is the same 2-hidden-layer MLP on the same data; only the bug differs:

- ``lr_too_high``   SGD with lr=10: the loss oscillates, gradients explode, NaN follows.
- ``dead_relu``     first-layer bias initialised to -5: every ReLU unit is dead from step 0.
- ``no_zero_grad``  the loop never calls ``optimizer.zero_grad()``: gradients accumulate.
- ``healthy``       the same model and data trained correctly: no warning expected.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

from nndx.report import Diagnosis, DiagnosticReport


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    lr: float = 0.05
    first_bias: float | None = None
    zero_grad: bool = True


SCENARIOS = (
    Scenario("lr_too_high", "SGD with lr=10", lr=10.0),
    Scenario("dead_relu", "first-layer bias initialised to -5", first_bias=-5.0),
    Scenario("no_zero_grad", "optimizer.zero_grad() never called", zero_grad=False),
    Scenario("healthy", "the same model and data, trained correctly"),
)


def make_data(n: int = 512, features: int = 20, classes: int = 4, seed: int = 0):
    """Gaussian blobs: learnable, standardised, shuffled — so only the planted bug shows."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=gen) * 2.0
    y = torch.randint(0, classes, (n,), generator=gen)
    x = centers[y] + torch.randn(n, features, generator=gen)
    x = (x - x.mean(0)) / x.std(0)
    return x, y


def run_scenario(scenario: Scenario, steps: int = 60, batch_size: int = 64) -> tuple[DiagnosticReport, Diagnosis]:
    import torch
    from torch import nn

    import nndx

    torch.manual_seed(0)
    x, y = make_data()
    x_train, y_train, x_val, y_val = x[:384], y[:384], x[384:], y[384:]
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    if scenario.first_bias is not None:
        nn.init.constant_(model[0].bias, scenario.first_bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=scenario.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    with nndx.Monitor(model, optimizer, every=5, name=scenario.name, project="nndx-demo") as monitor:
        for step in range(steps):
            start = (step * batch_size) % len(x_train)
            xb, yb = x_train[start:start + batch_size], y_train[start:start + batch_size]
            model.train()
            if scenario.zero_grad:
                optimizer.zero_grad()
            logits = model(xb)
            loss = loss_fn(logits, yb)
            loss.backward()
            optimizer.step()
            monitor.log(loss, accuracy=(logits.argmax(1) == yb).float().mean().item())
            if step % 10 == 9:
                model.eval()
                with torch.no_grad():
                    val_logits = model(x_val)
                monitor.log(loss_fn(val_logits, y_val), split="val",
                            accuracy=(val_logits.argmax(1) == y_val).float().mean().item())
    report = nndx.probe(model, (x_train[:batch_size], y_train[:batch_size]), loss_fn, optimizer=optimizer,
                        monitor=monitor, data=(x_train, y_train, x_val, y_val), progress=False)
    return report, nndx.diagnose(report)


def format_diagnosis(name: str, description: str, diagnosis: Diagnosis, top: int = 3) -> str:
    lines = [f"== {name}: {description}"]
    if not diagnosis.findings:
        lines.append("   no findings")
    for finding in diagnosis.findings[:top]:
        evidence = ", ".join(f"{k}={_short(v)}" for k, v in list(finding.evidence.items())[:4])
        cited = f" — a symptom of {finding.explained_by}" if finding.explained_by else ""
        lines.append(f"   [{finding.severity}] {finding.code.value} ({finding.rule_id}): {finding.title}{cited}")
        if evidence:
            lines.append(f"       evidence: {evidence}")
        lines.append(f"       fix: {finding.fix}")
    if diagnosis.healthy:
        lines.append("   verdict: healthy (no warning or error)")
    return "\n".join(lines)


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value[:4]) + (", …]" if len(value) > 4 else "]")
    return str(value)


def main(as_json: bool = False, progress: Callable[[str], None] | None = None) -> int:
    """Run the scenarios and print their diagnoses. The networks are tiny, so torch runs
    on one thread: for ops this small a thread pool only adds waiting for a core, and on a
    shared machine that wait dominates (bench/README.md has the measurement)."""
    import torch

    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    results = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, scenario in enumerate(SCENARIOS, 1):
            progress(f"[{i}/{len(SCENARIOS)}] training and probing {scenario.name} ...")
            report, diagnosis = run_scenario(scenario)
            results[scenario.name] = diagnosis
            if not as_json:
                print(format_diagnosis(scenario.name, scenario.description, diagnosis))
                print()
    finally:
        torch.set_num_threads(threads)
    if as_json:
        print(json.dumps({name: json.loads(d.model_dump_json()) for name, d in results.items()}, indent=2))
    return 0
