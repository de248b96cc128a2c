import math

import torch
from torch import nn

from nndx.collector.stats import LayerRecorder, parameter_stats, snapshot_parameters, summarize_model, watched_modules


def mlp(bias: float | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Sigmoid(), nn.Linear(16, 3))
    if bias is not None:
        nn.init.constant_(model[0].bias, bias)
    return model


def record(model, x, y):
    with LayerRecorder(model) as recorder:
        recorder.start_step(7)
        nn.functional.cross_entropy(model(x), y).backward()
        return recorder.finish_step()


def test_dead_units_measured_per_unit_not_per_element():
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    healthy = {s.name: s for s in record(mlp(), x, y)}
    relu = healthy["1"].activation
    assert 0.3 < relu.zero_fraction < 0.7  # a healthy ReLU layer is about half zeros...
    assert relu.dead_unit_fraction < 0.2  # ...but almost no unit is zero for every sample
    dead = {s.name: s for s in record(mlp(bias=-5.0), x, y)}
    assert dead["1"].activation.dead_unit_fraction > 0.9


def test_every_watched_layer_recorded_in_forward_order_with_gradients():
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    stats = record(mlp(), x, y)
    assert [s.name for s in stats] == ["0", "1", "2", "3", "4"]
    assert all(s.step == 7 and s.gradient is not None and s.gradient.norm > 0 for s in stats)
    assert stats[3].activation.saturated_fraction is not None  # sigmoid
    assert stats[1].activation.saturated_fraction is None  # relu


def test_recorder_idle_outside_steps_and_hooks_removed():
    model = mlp()
    recorder = LayerRecorder(model).attach()
    model(torch.randn(4, 8))
    assert recorder.finish_step() == []
    recorder.detach()
    assert all(not m._forward_hooks for m in model.modules())


def test_nonfinite_counted():
    model = mlp()
    x = torch.randn(4, 8)
    x[0, 0] = float("nan")
    stats = record(model, x, torch.zeros(4, dtype=torch.long))
    assert stats[0].activation.nonfinite_count > 0
    assert math.isnan(stats[0].activation.mean)


def test_conv_units_are_channels():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    nn.init.constant_(model[0].bias, -100.0)
    with torch.no_grad():
        model[0].bias[0] = 100.0
    with LayerRecorder(model) as recorder:
        recorder.start_step(0)
        model(torch.randn(2, 3, 8, 8))
        relu = recorder.finish_step()[1].activation
    assert relu.unit_count == 4
    assert relu.dead_unit_fraction == 0.75


def test_parameter_stats_update_ratio():
    model = mlp()
    before = snapshot_parameters(model)
    nn.functional.cross_entropy(model(torch.randn(8, 8)), torch.zeros(8, dtype=torch.long)).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    stats = {s.name: s for s in parameter_stats(model, before, step=1)}
    assert stats["0.weight"].update_ratio > 0 and stats["0.weight"].grad_norm > 0


def test_summarize_model():
    summary = summarize_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(), nn.Linear(4, 2), nn.Softmax(dim=1)))
    assert summary.output_activation == "Softmax" and summary.has_dropout and summary.has_batchnorm
    assert summary.param_count == 4 * 4 + 4 + 8 + 4 * 2 + 2
    assert [n for n, _ in watched_modules(nn.Sequential(nn.Linear(2, 2), nn.Dropout()))] == ["0"]
