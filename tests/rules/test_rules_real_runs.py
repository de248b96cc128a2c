"""End to end on real (tiny) training runs: the Monitor and probes fill the report, the
rules name the planted bug — and say nothing alarming about the same run done right."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
nn = torch.nn

import nndx  # noqa: E402
from nndx.report import CauseCode  # noqa: E402


def _train(lr: float = 0.05, bias: float | None = None, zero_grad: bool = True, steps: int = 40):
    torch.manual_seed(0)
    x = torch.randn(384, 20)
    y = x[:, :4].argmax(1)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    if bias is not None:
        nn.init.constant_(model[0].bias, bias)
        nn.init.constant_(model[2].bias, bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    with nndx.Monitor(model, optimizer, every=5, loss_fn=loss_fn) as monitor:
        for step in range(steps):
            idx = torch.arange(step * 32, step * 32 + 32) % 384
            if zero_grad:
                optimizer.zero_grad()
            loss = monitor.loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            monitor.log(loss)
    report = nndx.probe(model, (x[:64], y[:64]), loss_fn, optimizer=optimizer, monitor=monitor, probes=["hooks", "nan_origin"])
    return nndx.diagnose(report)


def test_healthy_run_is_silent():
    assert _train().healthy


@pytest.mark.parametrize(
    "options,expected",
    [
        ({"lr": 10.0}, CauseCode.LR_TOO_HIGH),
        ({"bias": -5.0}, CauseCode.DEAD_RELU),
        ({"zero_grad": False}, CauseCode.MISSING_ZERO_GRAD),
    ],
    ids=["lr_10", "dead_relu_bias", "missing_zero_grad"],
)
def test_lesson_bug_is_the_top_finding(options, expected):
    diagnosis = _train(**options)
    assert diagnosis.top().code is expected
    assert diagnosis.top().explained_by is None


def _scheduled_run(schedule, step_every: int):
    """100 AdamW steps (lr 1e-3) of a small regressor under a Monitor, ``schedule(optimizer)``'s
    scheduler stepped every ``step_every`` steps: the report."""
    torch.manual_seed(0)
    x = torch.randn(320, 8)
    y = x[:, :2].sum(1, keepdim=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = schedule(optimizer)
    with nndx.Monitor(model, optimizer, every=5) as monitor:
        for step in range(100):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x[step % 10 * 32:][:32]), y[step % 10 * 32:][:32])
            loss.backward()
            optimizer.step()
            if (step + 1) % step_every == 0:
                scheduler.step()
            monitor.log(loss)
    return monitor.report()


@pytest.mark.parametrize("step_every", [1, 20])
def test_a_one_cycle_schedule_stepped_once_per_epoch_stays_in_its_warm_up(step_every):
    """perceiver-pytorch's OneCycleLR sized in batches, stepped once per epoch of 20: its warm-up
    starts at max_lr / 25 (the group's initial_lr) and never gets far from it. Stepped every
    batch, the same 100 steps climb to max_lr and back down."""
    report = _scheduled_run(lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=3e-3, total_steps=100),
                            step_every)  # fmt: skip
    assert report.loop.scheduled_lrs == [3e-3]
    assert ("NNDX327" in {f.rule_id for f in nndx.diagnose(report).findings}) == (step_every == 20)


@pytest.mark.parametrize(("step_every", "warmup"), [(1, 1000), (20, 1000), (1, 26), (20, 26)])
def test_a_warm_up_stepped_once_per_epoch_never_reaches_its_lr(step_every, warmup):
    """Decision Transformer's LambdaLR warm-up over 1,000 optimizer steps, stepped once per
    iteration of 20 steps: 100 steps at a crawl. Stepped every step, the same 100 steps are
    a warm-up cut short, which rises at every record and is left alone. timm's scheduler
    sized in updates but stepped per epoch (t_in_epochs left True) on a short run: 26
    steps of warm-up, five taken, the LR ends at 0.23 of its own, still climbing."""
    report = _scheduled_run(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / warmup)),
                            step_every)  # fmt: skip
    assert report.loop.scheduled_lrs == [1e-3]
    assert ("NNDX327" in {f.rule_id for f in nndx.diagnose(report).findings}) == (step_every == 20)


def _cosine_annealing(step, total_steps, lr_max, lr_min):
    """outlier-exposure's schedule, a LambdaLR factor: lr_max and lr_min are meant as 1 and lr_min / lr."""
    return lr_min + (lr_max - lr_min) * 0.5 * (1 + math.cos(step / total_steps * math.pi))


@pytest.mark.parametrize("factor", [True, False])
def test_a_lambda_that_returns_an_lr_instead_of_a_factor_is_a_schedule_misuse(factor):
    """outlier-exposure's LambdaLR with the lambda given the LR itself (cosine_annealing(step, T, lr, 1e-6)
    instead of (step, T, 1, 1e-6 / lr)): LambdaLR multiplies the optimizer's lr by it, and the run
    trains at lr x lr = 1e-6 from its first step. As a factor, the same cosine is healthy."""
    report = _scheduled_run(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: _cosine_annealing(
        s, 100, 1.0, 1e-6 / 1e-3) if factor else _cosine_annealing(s, 100, 1e-3, 1e-6)), 1)  # fmt: skip
    found = {f.rule_id: f for f in nndx.diagnose(report).findings}
    assert ("NNDX331" in found) is not factor
    if not factor:
        assert found["NNDX331"].code.value == "LR_SCHEDULE_MISUSE" and found["NNDX331"].evidence["lr_peak"] < 2e-6
