import math

import pytest
import torch
from torch import nn

from nndx.collector.stats import LayerRecorder, frozen_at_init, parameter_stats, snapshot_parameters, summarize_model, watched_modules


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
    assert relu.values_per_unit == 64
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
    assert relu.values_per_unit == 2 * 6 * 6  # a channel is dead when zero at every position of every sample


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


def test_a_batchnorm_written_by_hand_is_a_batchnorm():
    """makemore part 3 writes its BatchNorm1d by hand (batch mean and variance, running buffers);
    d2l's ``BatchNorm`` keeps plain tensors. Both normalise a batch by its own statistics: a batch
    of two through them is noise (NNDX311), as through torch's. A LayerNorm-like module is not."""

    class HandBatchNorm(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.gamma, self.beta = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))
            self.register_buffer("running_mean", torch.zeros(dim))
            self.register_buffer("running_var", torch.ones(dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.gamma * (x - x.mean(0)) / (x.var(0) + 1e-5).sqrt() + self.beta

    class BatchNorm(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean(0)) / (x.var(0) + 1e-5).sqrt()

    class Normalize(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)

    for norm in (HandBatchNorm(4), BatchNorm()):
        summary = summarize_model(nn.Sequential(nn.Linear(4, 4), norm, nn.Tanh(), nn.Linear(4, 2)))
        assert summary.has_batchnorm and summary.normalization_layers == [type(norm).__name__]
    assert not summarize_model(nn.Sequential(nn.Linear(4, 4), Normalize(), nn.Linear(4, 2))).has_batchnorm


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
    from nndx.integrations.monitor import Monitor
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


# ---------------------------------------------------------------- the fast path agrees with the reference

import hypothesis.strategies as st  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

from nndx.collector.stats import (  # noqa: E402
    activation_fields,
    activation_stats_rows,
    gradient_fields,
    gradient_stats_rows,
    reference_activation_stats,
    reference_gradient_stats,
    reference_update_ratio,
    statistics_dtype,
)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def agree(fast: float | None, reference: float | None, scale: float, dtype: torch.dtype) -> bool:
    """Equal within the rounding of the dtype the fast path computes in (float32, or
    float64 for float64 tensors), relative to the tensor's magnitude; NaN agrees with NaN."""
    if fast is None or reference is None:
        return fast is reference
    if math.isnan(fast) or math.isnan(reference):
        return math.isnan(fast) and math.isnan(reference)
    if math.isinf(fast) or math.isinf(reference):
        return fast == reference
    info = torch.finfo(statistics_dtype(dtype))
    # below sqrt(tiny) a square underflows in the fast path's dtype (a norm of 1e-27s is 0 in float32)
    floor = math.sqrt(info.tiny)
    return math.isclose(fast, reference, rel_tol=1e3 * info.eps, abs_tol=max(1e3 * info.eps * scale, floor))


@st.composite
def tensors(draw, max_dims: int = 4):
    """A batch of 1-3 same-shaped tensors of a random dtype and shape, with dead units,
    exact zeros, values near the saturation bounds and NaN / Inf planted at random."""
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(2, max_dims))
    shape = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    k = draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(k, *shape, generator=g, dtype=torch.float64) * 10 ** draw(st.floats(-3, 3))
    if draw(st.booleans()):
        x = x.clamp_min(0)  # a ReLU output: half zeros
    if draw(st.booleans()):
        x = torch.sigmoid(x * 100)  # mostly saturated
    unit_axis = draw(st.integers(1, ndim))  # an axis of each member (axis 0 of x is the member)
    if draw(st.booleans()):
        x.select(unit_axis, 0).zero_()  # unit 0 dead in every member
    flat = x.view(-1)
    for value in draw(st.lists(st.sampled_from([math.nan, math.inf, -math.inf, 0.0]), max_size=3)):
        flat[int(torch.randint(flat.numel(), (1,), generator=g))] = value
    return x.to(dtype), unit_axis, draw(st.sampled_from([None, (0.0, 1.0), (-1.0, 1.0)]))


def finite_scale(x: torch.Tensor) -> float:
    finite = x.double()[torch.isfinite(x.double())]
    return finite.abs().max().item() if finite.numel() else 1.0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors())
def test_activation_fast_path_agrees_with_reference(case):
    x, unit_axis, bounds = case
    rows, columns = activation_stats_rows(x.to(statistics_dtype(x.dtype)), unit_axis, bounds)
    member_shape = x.shape[1:]
    for member, row in zip(x, rows.tolist()):
        fast = activation_fields(dict(zip(columns, row)), member.numel(), member_shape[unit_axis - 1])
        reference = reference_activation_stats(member, unit_axis - 1, bounds).model_dump()
        scale = finite_scale(member)
        for field, value in reference.items():
            assert agree(getattr(fast, field), value, scale, x.dtype), (field, fast, value, x.dtype)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors())
def test_gradient_fast_path_agrees_with_reference(case):
    g, _, _ = case
    rows, columns = gradient_stats_rows(g.to(statistics_dtype(g.dtype)))
    for member, row in zip(g, rows.tolist()):
        fast = gradient_fields(dict(zip(columns, row)), member.numel(), member.numel())
        reference = reference_gradient_stats(member).model_dump()
        for field, value in reference.items():
            assert agree(getattr(fast, field), value, finite_scale(member), g.dtype), (field, fast, value, g.dtype)


class InPlace(nn.Module):
    """In-place ops after the hooks ran: a ReLU(inplace=True) rewrites the Linear's
    output, and ``+=`` the head's. The statistics must be those of each output as its
    module returned it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 12)
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        y = self.out(self.act(self.fc(x)))
        y += 5.0
        return y


@pytest.mark.parametrize("dtype", DTYPES)
def test_recorder_agrees_with_reference_for_each_dtype_and_in_place_ops(dtype):
    torch.manual_seed(0)
    model = InPlace().to(dtype)
    outputs, grads, handles = reference_record(model, None, None)
    x = torch.randn(16, 6, dtype=dtype)
    with LayerRecorder(model) as recorder:
        recorder.start_step(0)
        model(x).float().sum().backward()
        recorded = {s.name: s for s in recorder.finish_step()}
    for h in handles:
        h.remove()
    assert set(recorded) == {"fc", "act", "out"}
    for name, out in outputs.items():
        axis = out.dim() - 1
        fast, reference = recorded[name].activation.model_dump(), reference_activation_stats(out, axis).model_dump()
        for field, value in reference.items():
            assert agree(fast[field], value, finite_scale(out), dtype), (name, field, fast[field], value)
        fast, reference = recorded[name].gradient.model_dump(), reference_gradient_stats(grads[name]).model_dump()
        for field, value in reference.items():
            assert agree(fast[field], value, finite_scale(grads[name]), dtype), (name, field, fast[field], value)
    assert recorded["fc"].activation.min < 0  # before the in-place ReLU
    assert abs(recorded["out"].activation.mean) < 2  # before the in-place += 5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_elements", [None, 32])
def test_update_ratio_agrees_with_reference_for_each_dtype(dtype, max_elements):
    from nndx.collector.stats import flat_sample

    torch.manual_seed(0)
    model = mlp().to(dtype)
    before = snapshot_parameters(model, max_elements)
    assert all(t.dtype == statistics_dtype(dtype) for t in before.values())  # half types copied to float32
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(8, 8, dtype=dtype)).float().sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    stats = {s.name: s for s in parameter_stats(model, before, step=1, max_elements=max_elements)}
    for name, p in model.named_parameters():
        now, was = flat_sample(p, max_elements), flat_sample(old[name], max_elements)
        if now.numel() == p.numel():
            expected = reference_update_ratio(was, now)
        else:  # sampled: the same elements' update over their norm before the step
            expected = ((now.double() - was.double()).norm() / was.double().norm()).item()
        assert stats[name].update_ratio == pytest.approx(expected, rel=1e-3, abs=1e-7), name
        assert stats[name].weight_norm == pytest.approx(p.double().norm().item(), rel=1e-3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_monitor_and_hooks_probe_measure_models_of_each_dtype(dtype):
    from nndx.collector.probes.layer_stats import hook_statistics
    from nndx.integrations.monitor import Monitor

    model = mlp().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8, dtype=dtype), torch.randint(0, 3, (32,))
    with Monitor(model, opt, every=1, alert_every=0) as mon:
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            opt.step()
            mon.log(loss)
    report = mon.report()
    assert report.errors == []
    assert {s.step for s in report.layers} == {0, 1, 2} and len(report.parameters) == 3 * 6
    assert all(math.isfinite(s.activation.std) and s.gradient.norm > 0 for s in report.layers)
    assert all(p.update_ratio > 0 for p in report.parameters)
    assert all(p.before_clip > 0 for p in report.loop.grad_norm_history) and report.run.dtype == str(dtype)[6:]
    # with the user's SGD (Adam's eps underflows in float16: its step makes Inf weights)
    probed = hook_statistics(model, (x, y), lambda out, t: nn.functional.cross_entropy(out.float(), t), optimizer=opt)
    assert len(probed.layers) == 5 and all(p.update_ratio is not None and p.update_ratio > 0 for p in probed.parameters)


def test_records_name_every_field_of_their_report_model():
    """Records are converted by field name: a field renamed in the report model fails
    loudly here instead of shifting values into the wrong fields."""
    from nndx.collector.stats import ActivationRecord, GradientRecord, LayerRecord, ParameterRecord
    from nndx.report import ActivationStats, GradientStats, LayerStats, ParameterStats

    for record, model in ((ActivationRecord, ActivationStats), (GradientRecord, GradientStats),
                          (LayerRecord, LayerStats), (ParameterRecord, ParameterStats)):
        assert set(record._fields) == set(model.model_fields), record.__name__


def test_error_guard_bounds_the_monitors_errors_but_keeps_the_training_exception():
    from nndx.collector.watch import ErrorGuard

    guard = ErrorGuard(limit=3)
    hook = guard.guard("layer_hook", lambda: 1 / 0)
    for _ in range(10):
        hook()  # never raises into the loop
    guard.record_training(RuntimeError("one of the variables needed for gradient computation"))
    assert [e.source for e in guard.records] == ["monitor.layer_hook"] * 3 + ["training"]


def _train(model: nn.Module, steps: int = 20) -> nn.Module:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def _freeze_body(model: nn.Sequential) -> nn.Sequential:
    for layer in model[:-1]:
        layer.requires_grad_(False)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frozen_at_init_tells_a_never_trained_body_from_a_trained_one(dtype):
    assert frozen_at_init(mlp()) == ([], 0)  # nothing frozen: nothing to check
    random_body = _freeze_body(mlp()).to(dtype)
    assert frozen_at_init(random_body) == (["0.weight", "2.weight"], 2)  # the 16x3 head is not frozen
    trained_body = _freeze_body(_train(mlp())).to(dtype)  # 20 Adam steps at lr 1e-3 already leave the init
    assert frozen_at_init(trained_body) == ([], 2)


def test_frozen_at_init_knows_convolutions_and_rnns_and_leaves_custom_inits_alone():
    torch.manual_seed(0)
    conv, lstm, gru = nn.Conv2d(3, 8, 3), nn.LSTM(8, 16), nn.GRU(8, 16, num_layers=2)
    for module in (conv, lstm, gru):
        module.requires_grad_(False)
    assert frozen_at_init(conv) == (["weight"], 1)
    assert set(frozen_at_init(lstm)[0]) == {"weight_ih_l0", "weight_hh_l0"}
    assert frozen_at_init(gru)[1] == 4 and len(frozen_at_init(gru)[0]) == 4
    custom = nn.Linear(32, 32)
    nn.init.normal_(custom.weight, std=0.02)  # e.g. a transformer's init: not PyTorch's default, no claim
    assert frozen_at_init(custom.requires_grad_(False)) == ([], 1)
    shrunk = nn.Linear(32, 32)
    with torch.no_grad():
        shrunk.weight.mul_(0.5)  # inside the bound, but with half the rms: changed, not at init
    assert frozen_at_init(shrunk.requires_grad_(False)) == ([], 1)


def test_frozen_at_init_knows_the_normal_inits_and_a_norm_layers_ones():
    """torchvision's ResNet: He-normal convolutions (fan_out) and BatchNorm scales of one."""
    torch.manual_seed(0)
    body = nn.Sequential(nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.Linear(64, 64))
    nn.init.kaiming_normal_(body[0].weight, mode="fan_out", nonlinearity="relu")
    nn.init.xavier_normal_(body[3].weight)
    body.requires_grad_(False)
    assert frozen_at_init(body) == (["0.weight", "1.weight", "3.weight"], 3)
    with torch.no_grad():
        body[0].weight.add_(0.3 * body[0].weight.std() * torch.randn_like(body[0].weight))  # rms up 4%
        body[1].weight.add_(0.01 * torch.randn(32))
        body[3].weight.uniform_(-0.125 * 3**0.5, 0.125 * 3**0.5)  # the rms of Xavier-normal, not its shape
    assert frozen_at_init(body) == ([], 3)
