import math
import sys

import pytest
import torch
from _probe_models import assert_untouched, batch, dead_relu_mlp, mlp, single_thread, snapshot  # noqa: F401
from torch import nn

from nndx.collector.lr_find import save_png
from nndx.collector.probes.lr_range import analyse, from_csv, lr_range_test, optimizer_family, suggest_for, to_csv


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


def test_a_loss_falling_through_zero_is_no_divergence():
    """A WGAN critic's Wasserstein loss (mean of its outputs on fakes minus on reals) starts
    near 0 and can fall without bound: 4x its best is above it once the best is negative,
    which read every later step as divergence. A negative loss that rises again still
    diverges."""
    from nndx.collector.probes.lr_range import diverged

    assert not diverged([0.1, -0.5, -3.0, -40.0], 4.0)
    assert diverged([0.1, -0.5, -3.0, -40.0, 200.0], 4.0)
    assert diverged([2.0, 1.0, 4.5], 4.0) and not diverged([2.0, 1.0, 3.5], 4.0)  # positive losses: as before

    def critic_loss(scores, is_real):
        return scores[~is_real].mean() - scores[is_real].mean()

    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    x = torch.randn(64, 8)
    result = lr_range_test(critic, (x, torch.arange(64) % 2 == 0), lambda out, real: critic_loss(out.squeeze(1), real),
                           start_lr=1e-6, end_lr=1e-2, steps=40)  # fmt: skip
    assert result.diverged_at_lr is None and min(result.smoothed) < 0
    # and no suggestion: a loss with no floor has no knee (the sweep ends at its lowest, read as 2.5 before)
    assert result.suggested_lr is None and "below zero" in result.message


class Validating(nn.Module):
    """A model that checks its outputs, as a torch.distributions prior's log_prob does
    (``validate_args``): values outside its support (here: beyond +-20) raise ValueError."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        out = self.body(x)
        if not (out.abs() < 20).all():
            raise ValueError("Expected value argument to be within the support")
        return out


def test_a_model_that_raises_once_the_sweep_diverges_has_diverged_there():
    x, y = batch()
    model = Validating()
    result = lr_range_test(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           end_lr=1e6, steps=60)  # fmt: skip
    assert result.diverged_at_lr is not None and "raised ValueError" in result.message
    assert result.status in ("passed", "failed")
    broken = Validating()
    broken.body[0].weight.data.fill_(math.nan)  # fails on the first batch: the setup, not the sweep
    with pytest.raises(ValueError, match="support"):
        lr_range_test(broken, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(broken.parameters(), lr=0.1))


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


def _two_phase_curve():
    """The logistic drop of the knee test, then flat until the sweep diverges past the end."""
    lrs = [10 ** (-6 + i * 0.1) for i in range(60)]
    smoothed = [2.0 - 1.0 / (1 + math.exp(-(i - 30) / 3)) for i in range(60)]
    return lrs, smoothed, 10 ** (-6 + 60 * 0.1)


def test_an_mse_sweep_suggests_a_fixed_fraction_of_the_divergence_point_per_optimizer():
    lrs, smoothed, diverged = _two_phase_curve()
    knee = lrs[33] / 4
    momentum = analyse(lrs + [diverged], smoothed + [10.0], smoothed + [10.0], diverged, loss="MSELoss",
                       optimizer="SGD with momentum")  # fmt: skip
    adam = analyse(lrs + [diverged], smoothed + [10.0], smoothed + [10.0], diverged, loss="MSELoss", optimizer="Adam")
    assert momentum.suggested_lr == pytest.approx(diverged / 15) and adam.suggested_lr == pytest.approx(diverged / 40)
    assert (adam.interval_low_lr, adam.interval_high_lr) == pytest.approx((diverged / 80, diverged / 20))
    assert momentum.suggested_lr > 10 * knee, "not the knee rule, which is far too low for MLP regressors"
    assert "divergence point" in momentum.message
    # the same curve under a classification loss, or a loss nndx cannot name: the knee rule
    for loss in ("CrossEntropyLoss", None):
        found = suggest_for(lrs, smoothed, diverged, loss=loss, optimizer="Adam")
        assert found.lr == pytest.approx(knee)


@pytest.mark.parametrize("loss, optimizer, diverged, why", [
    ("HuberLoss", "SGD with momentum", True, "HuberLoss"),  # bounded gradients: not measured
    ("MSELoss", "SGD", True, "not SGD"),  # plain SGD: its best lr sits at the edge
    ("MSELoss", "RMSprop", True, "not RMSprop"),
    ("MSELoss", "Adam", False, "did not diverge"),
])  # fmt: skip
def test_a_regression_sweep_without_a_measured_reading_gives_an_interval_and_no_point(loss, optimizer, diverged, why):
    lrs, smoothed, diverged_at = _two_phase_curve()
    if not diverged:
        diverged_at = None
    result = analyse(lrs, smoothed, smoothed, diverged_at, loss=loss, optimizer=optimizer)
    assert result.status == "passed" and result.suggested_lr is None
    assert result.interval_low_lr == pytest.approx(lrs[33] / 4)  # the knee reading trains: the floor
    assert result.interval_high_lr > 1.5 * result.interval_low_lr
    assert result.message.startswith("no suggested lr") and why in result.message


def test_optimizer_family_tells_momentum_sgd_from_plain_sgd():
    params = [nn.Parameter(torch.zeros(2))]
    assert optimizer_family(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == "SGD with momentum"
    assert optimizer_family(torch.optim.SGD(params, lr=0.1)) == "SGD"
    assert optimizer_family(torch.optim.SGD(params, lr=0.1, momentum=0.5)) == "SGD with momentum 0.5"
    assert optimizer_family(torch.optim.Adam(params)) == "Adam"


def test_a_real_mse_sweep_reads_the_divergence_point(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x[:, :1] * 2 - x[:, 1:2]
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    result = lr_range_test(model, (x, y), nn.MSELoss(), optimizer=optimizer, steps=60)
    assert result.status == "passed" and result.diverged_at_lr is not None
    assert result.suggested_lr == pytest.approx(result.diverged_at_lr / 15)
    assert "MSELoss with SGD with momentum" in result.message
    path = to_csv(result, tmp_path / "lr.csv")  # the file does not say which loss: named, the same reading
    assert from_csv(path, loss="MSELoss", optimizer="SGD with momentum").suggested_lr == pytest.approx(
        result.suggested_lr)  # fmt: skip
    assert from_csv(path).suggested_lr < result.suggested_lr  # unnamed: the knee rule


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
