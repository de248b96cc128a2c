import math

import pytest
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


class Residual(nn.Module):
    """Same-shaped layers (one statistics batch), an in-place ReLU after a Linear and an
    in-place residual add after a Linear: the recorded statistics must be those of each
    output as its module returned it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.act = nn.ReLU(inplace=True)
        self.gate = nn.Sigmoid()
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.act(self.a(x))
        r = self.b(h)
        r += h  # in place, after b's hook ran
        return self.head(self.gate(self.c(r)))


def reference_record(model, x, y):
    """Every hooked output and its gradient, cloned when the module returns."""
    outputs, grads = {}, {}

    def keep(name):
        def hook(_m, _i, out):
            outputs[name] = out.detach().clone()
            out.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in watched_modules(model)]
    return outputs, grads, handles


def test_recorded_statistics_equal_direct_computation_across_steps(monkeypatch):
    import nndx.collector.stats as stats_module

    for pending_bytes in (stats_module.PENDING_BYTES, 512):  # 512: reduced as it goes
        monkeypatch.setattr(stats_module, "PENDING_BYTES", pending_bytes)
        torch.manual_seed(1)
        model = Residual()
        outputs, grads, handles = reference_record(model, None, None)
        with LayerRecorder(model) as recorder:
            for step in range(2):  # the second step reuses the first one's buffers
                x, y = torch.randn(32, 8) * (step + 1), torch.randint(0, 3, (32,))
                recorder.start_step(step)
                nn.functional.cross_entropy(model(x), y).backward()
                recorded = {s.name: s for s in recorder.finish_step()}
                assert set(recorded) == set(outputs) == {"a", "b", "c", "act", "gate", "head"}
                for name, out in outputs.items():
                    act, grad, g = recorded[name].activation, recorded[name].gradient, grads[name]
                    assert act.mean == pytest.approx(out.mean().item(), rel=1e-5, abs=1e-6), name
                    assert act.std == pytest.approx(out.std().item(), rel=1e-5), name
                    assert (act.min, act.max) == (out.min().item(), out.max().item()), name
                    assert act.zero_fraction == pytest.approx((out == 0).float().mean().item()), name
                    dead = (out == 0).all(dim=0).float().mean().item()
                    assert act.dead_unit_fraction == pytest.approx(dead), name
                    assert grad.norm == pytest.approx(g.norm().item(), rel=1e-5), name
                    assert grad.abs_mean == pytest.approx(g.abs().mean().item(), rel=1e-5), name
                    assert grad.max == pytest.approx(g.abs().max().item()), name
                saturated = ((outputs["gate"] <= 1e-3) | (outputs["gate"] >= 1 - 1e-3)).float().mean().item()
                assert recorded["gate"].activation.saturated_fraction == pytest.approx(saturated)
                assert recorded["b"].activation.min < 0  # before the in-place += (and b's own ReLU-free output)
                assert recorded["a"].activation.min < 0  # before the in-place ReLU
        for h in handles:
            h.remove()


@pytest.mark.parametrize("max_elements", [None, 64])
def test_update_ratio_exact_over_consecutive_recorded_steps(max_elements):
    """Whole parameters: ||w_after - w_before|| / ||w_after||. Sampled (64 elements of the
    16x16 weights): the same elements' update over their norm before the step."""
    from nndx.collector.monitor import Monitor
    from nndx.collector.stats import flat_sample

    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with Monitor(model, opt, every=1, alert_every=0, max_elements=max_elements) as mon:
        expected = []
        for _ in range(3):  # the Monitor reuses one snapshot's memory from step to step
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,))).backward()
            opt.step()
            mon.log(0.0)
            ratios = {}
            for n, p in model.named_parameters():
                now, old = flat_sample(p, max_elements), flat_sample(before[n], max_elements)
                scale = p.detach().norm() if now.numel() == p.numel() else old.norm()
                ratios[n] = ((now - old).norm() / scale).item()
            expected.append(ratios)
        report = mon.report()
    assert any(p.numel() > 64 for p in model.parameters())
    for p in report.parameters:
        assert p.update_ratio == pytest.approx(expected[p.step][p.name], rel=1e-4), (p.step, p.name)
