import math
import statistics
import subprocess
import sys

import pytest
import torch
from torch import nn

from nndx.fix import resurrect_dead_units, suggest_clip_norm
from nndx.report import DiagnosticReport, GradNormPoint, LoopStats, ParameterStats



@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These models are tiny: on a busy machine thread hand-offs dominate their cost."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------- suggest_clip_norm


def deep_mlp(seed: int = 1) -> nn.Sequential:
    """20 Linear+ReLU layers of width 32, Kaiming init, no normalisation."""
    generator = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(20):
        linear = nn.Linear(32, 32)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(32, 32, generator=generator) * math.sqrt(2 / 32))
            linear.bias.zero_()
        layers += [linear, nn.ReLU()]
    head = nn.Linear(32, 1)
    with torch.no_grad():
        head.weight.copy_(torch.randn(1, 32, generator=generator) * math.sqrt(1 / 32))
        head.bias.zero_()
    return nn.Sequential(*layers, head)


def train_deep_mlp(clip: float | None = None, steps: int = 64) -> tuple[list[float], list[float]]:
    """SGD with a learning rate that grows 5% a step (an over-eager warm-up): healthy at
    first, then the gradient norms explode to Inf/NaN. Returns (grad norms, losses)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=generator)
    y = x[:, :4].sum(dim=1, keepdim=True)
    model = deep_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.003, momentum=0.9)
    norms, losses = [], []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 0.003 * 1.05**step
        index = torch.randint(0, 256, (32,), generator=generator)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[index]), y[index])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else math.inf).item())
        losses.append(loss.item())
        optimizer.step()
    return norms, losses


def history_report(norms: list[float]) -> DiagnosticReport:
    points = [GradNormPoint(step=i, before_clip=n) for i, n in enumerate(norms)]
    return DiagnosticReport(loop=LoopStats(grad_norm_history=points))


@pytest.fixture(scope="module")
def exploding_run():
    return train_deep_mlp()


@pytest.mark.slow
def test_clip_suggestion_on_exploding_20_layer_mlp(exploding_run):
    norms, losses = exploding_run
    assert not math.isfinite(losses[-1])  # the run really explodes
    baseline_loss = statistics.median(losses[:20])
    exploding = [n for n, loss in zip(norms, losses) if math.isfinite(n) and not loss < 10 * baseline_loss]
    assert exploding

    suggestion = suggest_clip_norm(history_report(norms))
    assert suggestion.clip_norm is not None and math.isfinite(suggestion.clip_norm)
    assert suggestion.clip_norm < min(exploding)
    assert suggestion.clip_norm > statistics.median(norms[:40])
    assert suggestion.nonfinite_steps == sum(not math.isfinite(n) for n in norms) > 0
    assert suggestion.exploding_from_step is not None and suggestion.source == "grad_norm_history"
    assert suggestion.evidence()["suggested_clip_norm"] == suggestion.clip_norm

    # the same run clipped at the suggestion stays finite
    _, clipped_losses = train_deep_mlp(clip=suggestion.clip_norm)
    assert all(math.isfinite(loss) for loss in clipped_losses)


def test_isolated_spikes_are_left_out_but_training_continues():
    norms = [1.0 + 0.01 * (i % 7) for i in range(50)]
    norms[20] = 80.0  # a single bad batch
    norms[30] = math.nan
    suggestion = suggest_clip_norm(history_report(norms))
    assert suggestion.spike_steps == [20, 30]
    assert suggestion.exploding_from_step is None
    assert suggestion.healthy_steps == 48 and suggestion.nonfinite_steps == 1
    assert 1.0 < suggestion.clip_norm <= 1.06
    assert suggestion.max_finite_norm == 80.0


def test_too_few_healthy_steps_gives_no_value():
    suggestion = suggest_clip_norm(history_report([1.0, 2.0, math.inf, math.nan]))
    assert suggestion.clip_norm is None and "healthy" in suggestion.message
    empty = suggest_clip_norm(DiagnosticReport())
    assert empty.clip_norm is None and empty.source == "none" and "no gradient norms" in empty.message
    with pytest.raises(ValueError):
        suggest_clip_norm(history_report([1.0] * 10), percentile=0)


def test_falls_back_to_parameter_grad_norms():
    parameters = [
        ParameterStats(name=name, step=step, weight_norm=1.0, grad_norm=3.0 * (step + 1) if name == "w" else 4.0 * (step + 1))
        for step in range(10)
        for name in ("w", "b")
    ]
    suggestion = suggest_clip_norm(DiagnosticReport(parameters=parameters))
    assert suggestion.source == "parameters" and suggestion.steps == 10
    assert suggestion.max_healthy_norm == pytest.approx(50.0)  # sqrt(30² + 40²) at step 9


def test_fix_module_imports_without_torch():
    code = "import sys, nndx.fix; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- resurrect_dead_units


def relu_mlp(dead_bias: float | None, dead_units: int = 64) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    if dead_bias is not None:
        with torch.no_grad():
            model[0].bias[:dead_units] = dead_bias
            model[2].bias[:dead_units] = dead_bias
    return model


def classification_data():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=generator)
    return x, x[:, :4].argmax(dim=1)


def loss_drop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 60) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses[0] - losses[-1]


def test_resurrection_recovers_a_network_with_dead_units():
    x, y = classification_data()
    assert loss_drop(relu_mlp(dead_bias=-5.0), x, y) < 0.05  # only the output bias learns

    model = relu_mlp(dead_bias=-5.0)
    result = resurrect_dead_units(model, (x, y))
    assert result.dead_fraction_before > 0.7
    assert result.dead_fraction_after < 0.2
    assert [layer.layer for layer in result.layers] == ["0", "2"]
    assert result.total_units == 128 and result.dead_units_before == sum(layer.dead_units for layer in result.layers)
    assert loss_drop(model, x, y) > 0.5


def test_live_units_are_left_bit_identical():
    x, _ = classification_data()
    model = relu_mlp(dead_bias=-5.0, dead_units=48)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    training_flags = [m.training for m in model.modules()]
    rng_state = torch.get_rng_state()
    result = resurrect_dead_units(model, x, seed=7)
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert [m.training for m in model.modules()] == training_flags

    first = result.layers[0]
    assert first.dead_units >= 48
    revived = set(first.reinitialized)
    live = [i for i in range(64) if i not in revived]
    assert live and set(range(48)) <= revived
    assert torch.equal(model[0].weight[live], before["0.weight"][live])
    assert torch.equal(model[0].bias[live], before["0.bias"][live])
    rows = sorted(revived)
    assert not torch.equal(model[0].weight[rows], before["0.weight"][rows])
    assert torch.all(model[0].bias[rows] == 0)
    assert torch.equal(model[4].weight, before["4.weight"])  # the output layer feeds no ReLU


def test_conv_channels_and_unsupported_producers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    with torch.no_grad():
        model[0].bias[:6] = -50.0
    result = resurrect_dead_units(model, torch.randn(4, 3, 8, 8))
    conv = result.layers[0]
    assert conv.layer == "0" and conv.units == 8 and conv.reinitialized == list(range(6))
    assert result.skipped == ["4"]  # fed by BatchNorm, not a Linear/Conv
    assert result.dead_units_after == 0

    transposed = nn.Sequential(nn.ConvTranspose2d(3, 4, 3), nn.ReLU())
    before = transposed[0].weight.detach().clone()
    result = resurrect_dead_units(transposed, torch.randn(2, 3, 5, 5))
    assert result.skipped == ["1"] and torch.equal(transposed[0].weight, before)
