import math
import sys

import pytest
import torch
from _probe_models import assert_untouched, batch, dead_relu_mlp, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

from nndx.collector.lr_find import save_png
from nndx.collector.probes.lr_range import analyse, from_csv, lr_range_test, to_csv


def sweep(model=None, **kw):
    kw.setdefault("steps", 60)
    return lr_range_test(model or mlp(), batch(), nn.CrossEntropyLoss(), **kw)


def test_healthy_sweep_is_geometric_smoothed_and_stops_at_divergence():
    result = sweep(start_lr=1e-5, end_lr=100.0, smooth=0.2)
    assert result.status == "passed"
    assert result.lrs[0] == pytest.approx(1e-5)
    ratios = [b / a for a, b in zip(result.lrs, result.lrs[1:])]
    assert max(ratios) == pytest.approx(min(ratios))  # exponential spacing
    for i in range(1, len(result.losses)):  # EMA with weight 0.2 on the newest loss
        assert result.smoothed[i] == pytest.approx(0.2 * result.losses[i] + 0.8 * result.smoothed[i - 1])
    assert result.diverged_at_lr is not None and result.diverged_at_lr == result.lrs[-1] < 100.0
    assert result.smoothed[-1] > 4 * min(result.smoothed) or not math.isfinite(result.smoothed[-1])
    assert 1e-5 < result.suggested_lr < result.diverged_at_lr
    best = min(range(len(result.smoothed) - 1), key=result.smoothed.__getitem__)
    assert result.min_loss == result.smoothed[best]
    assert result.min_over_10_lr == pytest.approx(result.lrs[best] / 10)
    assert result.valley_lr is not None


def test_suggestion_is_a_quarter_of_the_knee_with_an_interval_around_it():
    lrs = [10 ** (-6 + i * 0.1) for i in range(60)]
    # logistic drop from 2 to 1 centred at index 30, then a rise after 45. The knee is the
    # first point within 30% of the drop from the minimum (1.0 + 0.3 × 1.0): the logistic
    # reaches 0.7 at 30 + 3 ln(7/3) = 32.5, so index 33.
    smoothed = [2.0 - 1.0 / (1 + math.exp(-(i - 30) / 3)) + (0.02 * (i - 45) ** 2 if i > 45 else 0) for i in range(60)]
    result = analyse(lrs, smoothed, smoothed)
    assert result.status == "passed"
    assert result.suggested_lr == pytest.approx(lrs[33] / 4)
    assert (result.interval_low_lr, result.interval_high_lr) == pytest.approx((lrs[33] / 8, lrs[33] / 2))
    assert result.min_over_10_lr == pytest.approx(lrs[45] / 10)
    assert lrs[20] < result.valley_lr < lrs[45]


def test_loss_that_never_decreases_fails():
    lrs = [10 ** (-6 + i * 0.1) for i in range(30)]
    flat = [1.0 + 0.001 * i for i in range(30)]
    assert analyse(lrs, flat, flat).status == "failed"
    diverged_at_once = sweep(start_lr=1e3, end_lr=1e5, steps=20)
    assert diverged_at_once.status == "failed" and diverged_at_once.suggested_lr is None


def test_users_model_optimizer_and_rng_untouched():
    model, (x, y) = mlp(batchnorm=True), batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()
    before = snapshot(model, optimizer)
    result = sweep(model, optimizer=optimizer, steps=20)
    assert "copy of the user's SGD" in result.message
    assert_untouched(before, model, optimizer)
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_csv_round_trip_and_png(tmp_path):
    result = sweep()
    path = to_csv(result, tmp_path / "lr.csv")
    assert path.read_text().splitlines()[0] == "lr,loss,smoothed"
    loaded = from_csv(path)
    assert loaded.lrs == pytest.approx(result.lrs) and loaded.smoothed == pytest.approx(result.smoothed)
    assert loaded.suggested_lr == pytest.approx(result.suggested_lr)
    assert loaded.diverged_at_lr == result.diverged_at_lr
    png = save_png(result, tmp_path / "lr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_csv_and_missing_matplotlib_say_why(tmp_path, monkeypatch):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        from_csv(bad)
    bad.write_text("lr,loss,smoothed\n0.1,x,1\n")
    with pytest.raises(ValueError, match=":2: not a number"):
        from_csv(bad)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"nndx\[plot\]"):
        save_png(analyse([1e-3, 1e-2, 1e-1], [1.0, 0.5, 0.2], [1.0, 0.5, 0.2]), tmp_path / "x.png")


def test_sweep_over_several_batches_cycles_through_them():
    batches = [batch(seed=s) for s in range(3)]
    seen = []

    class Recording(nn.Module):
        def forward(self, output, target):
            seen.append(target)
            return nn.functional.cross_entropy(output, target)

    result = lr_range_test(mlp(), batches[0], Recording(), batches=batches, steps=7, end_lr=1e-3)
    assert len(result.lrs) == 7
    assert [next(i for i, b in enumerate(batches) if torch.equal(b[1], t)) for t in seen] == [0, 1, 2, 0, 1, 2, 0]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="start_lr"):
        sweep(start_lr=1.0, end_lr=0.1)
    with pytest.raises(ValueError, match="steps"):
        sweep(steps=1)
