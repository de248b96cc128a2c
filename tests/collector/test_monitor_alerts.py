"""Live alerts: the Monitor evaluates the live rules while training runs, reports each
new finding once (logging, callback, optional TrainingFailure) with the step it fired."""

import logging
import math

import pytest
import torch
from torch import nn

from nndx.integrations.monitor import Monitor, TrainingFailure
from nndx.rules.live import LIVE_RULES
from nndx.rules import REGISTRY


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)


def run(steps=20, *, zero_grad=True, lr=0.05, **options):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    options.setdefault("alert_every", 5)
    with Monitor(model, opt, every=5, **options) as mon:
        for _ in range(steps):
            if zero_grad:
                opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            mon.log(loss)
    return mon


def test_live_rules_exist_in_the_registry():
    assert set(LIVE_RULES) <= set(REGISTRY)


def test_healthy_training_raises_no_live_finding(caplog):
    with caplog.at_level(logging.INFO, logger="nndx"):
        mon = run()
    assert mon.findings == [] and mon.report().loop.live_findings == []
    assert not [r for r in caplog.records if r.name == "nndx"]


def test_missing_zero_grad_fires_once_with_its_step(caplog):
    seen = []
    with caplog.at_level(logging.WARNING, logger="nndx"):
        mon = run(zero_grad=False, on_finding=seen.append)
    codes = [f.code.value for f in mon.findings]
    assert codes.count("MISSING_ZERO_GRAD") == 1  # reported once, not at every evaluation
    finding = next(f for f in mon.findings if f.code.value == "MISSING_ZERO_GRAD")
    assert finding.step == 5  # the first evaluation (the first recorded step after 5 steps) already sees it
    assert seen == mon.findings
    live = mon.report().loop.live_findings
    assert [(f.rule_id, f.step) for f in live] == [(f.rule_id, f.step) for f in mon.findings]
    messages = [r.getMessage() for r in caplog.records if r.name == "nndx"]
    assert sum("MISSING_ZERO_GRAD" in m for m in messages) == 1


def test_nan_loss_stops_training_with_stop_on_error():
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=1e6)  # diverges to NaN within a few steps
    steps_run = 0
    with pytest.raises(TrainingFailure) as raised:
        with Monitor(model, opt, every=1, alert_every=2, stop_on="error") as mon:
            for _ in range(200):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                mon.log(loss)
                opt.step()
                steps_run += 1
    assert steps_run < 50  # stopped early
    findings = raised.value.findings
    assert findings and all(f.severity == "error" for f in findings)
    assert any(f.code.value in ("LR_TOO_HIGH", "LOG_OF_ZERO") for f in findings)
    assert mon.closed  # the with block still removed the hooks
    assert any(not math.isfinite(p.value) for p in mon.report().loss_history["train"])


def test_failing_callback_is_recorded_not_raised():
    def callback(_finding):
        raise RuntimeError("callback bug")

    mon = run(zero_grad=False, on_finding=callback)
    assert mon.findings
    assert any(e.source == "monitor.on_finding" for e in mon.report().errors)


def test_alerts_off_with_alert_every_zero():
    mon = run(zero_grad=False, alert_every=0)
    assert mon.findings == []
    assert any(f.code.value == "MISSING_ZERO_GRAD" for f in mon.check_now())  # by hand it still works


def test_a_warm_up_still_under_way_is_no_live_alert():
    """JEM warms up over 60 iterations; every run printed 'a warm-up longer than the run never
    reached the LR' at step 10, where the warm-up was simply under way. Live, the run has not
    ended; the final report of a run that ends inside its warm-up still says it."""
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    warm_up = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 100))
    with Monitor(model, opt, every=2, alert_every=2) as mon:
        for _ in range(40):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            warm_up.step()
            mon.log(loss)
    assert "NNDX307" not in [f.rule_id for f in mon.findings]
    from nndx.rules import diagnose

    assert "a warm-up longer than the run" in next(f.symptom for f in diagnose(mon.report()).findings
                                                   if f.rule_id == "NNDX307")
