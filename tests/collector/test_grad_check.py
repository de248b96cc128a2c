import numpy as np
import pytest
import torch
from _probe_models import (  # noqa: F401
    CustomLinear,
    assert_untouched,
    batch,
    custom_backward_mlp,
    mlp,
    single_thread,
    snapshot,
)
from torch import nn

from nndx.collector.probes.grad_check import grad_check, grad_check_arrays


def test_healthy_model_passes_with_few_forwards_and_no_localisation():
    result = grad_check(custom_backward_mlp(None), batch(), nn.CrossEntropyLoss(), directions=3)
    assert result.status == "passed" and result.mode == "directional"
    assert result.max_relative_error < 1e-5
    # the loss's own gradient checked on one forward's outputs, backward's forward, the determinism checks (two
    # forwards, one more differentiated from another random state), two at nudged parameters (entries the forward
    # overwrites itself), the directions
    assert result.forward_passes == 1 + 1 + 2 + 1 + 2 + 2 * 3
    assert result.parameters == []


@pytest.mark.parametrize("bug", ["transposed", "scaled", "far_element"])
def test_planted_wrong_backward_is_caught_and_named(bug):
    result = grad_check(custom_backward_mlp(bug), batch(), nn.CrossEntropyLoss())
    assert result.status == "failed"
    by_name = {p.name: p for p in result.parameters}
    assert by_name["2.weight"].status == "bug"
    assert [n for n, p in by_name.items() if p.status != "ok"] == ["2.weight"]
    assert "2.weight" in result.message
    assert not by_name["2.weight"].autograd_zero  # a wrong gradient, not none


def test_a_wrong_backward_in_a_deep_network_is_found_by_halving_not_tensor_by_tensor():
    """DenseNet's 360 tensors, one with a wrong backward: checked one by one that is 360 x 3
    directions x 2 forwards (567 s on a CPU). Halving the tensors whose confined check is not
    clean finds it in a few dozen checks, and still names only it."""

    class Branches(nn.Module):  # 16 parallel layers summed: every tensor's gradient of one size
        def __init__(self) -> None:
            super().__init__()
            self.branches = nn.ModuleList(nn.Linear(8, 8) if i != 10 else CustomLinear(8, 8, "scaled")
                                          for i in range(16))  # fmt: skip
            self.head = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(sum(branch(x) for branch in self.branches) / 8))

    torch.manual_seed(0)
    result = grad_check(Branches(), batch(), nn.CrossEntropyLoss())
    assert [p.name for p in result.parameters if p.status != "ok"] == ["branches.10.weight"]
    assert len(result.parameters) == 34 and result.forward_passes < 34 * 3 * 2 / 2  # one by one: over 34 x 3 x 2


@pytest.mark.parametrize("mode", ["directional", "elementwise"])
def test_a_detached_body_has_no_autograd_gradient_where_the_loss_depends_on_it(mode):
    import nndx
    from nndx.report import DiagnosticReport, Probes

    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x)).detach())

    result = grad_check(Detached(), batch(), nn.CrossEntropyLoss(), mode=mode)
    by_name = {p.name: p for p in result.parameters}
    assert by_name["body.weight"].status == "bug" and by_name["body.weight"].autograd_zero
    assert not by_name["head.weight"].autograd_zero
    top = nndx.diagnose(DiagnosticReport(probes=Probes(grad_check=result))).top()
    assert (top.rule_id, top.code.value) == ("NNDX615", "DETACHED_GRAPH")


def test_elementwise_mode_samples_across_the_tensor_and_reports_the_worst_index():
    healthy = grad_check(custom_backward_mlp(None), batch(), nn.CrossEntropyLoss(), mode="elementwise")
    assert healthy.status == "passed" and all(p.status == "ok" for p in healthy.parameters)
    broken = grad_check(custom_backward_mlp("transposed"), batch(), nn.CrossEntropyLoss(), mode="elementwise",
                        elements_per_tensor=8)  # fmt: skip
    weight = {p.name: p for p in broken.parameters}["2.weight"]
    assert broken.status == "failed" and weight.status == "bug"
    assert len(weight.worst_index) == 2 and weight.worst_index[0] != weight.worst_index[1]  # off-diagonal
    # 6 tensors, up to 8 elements each, 2 forwards per element, plus the forward the loss's own gradient
    # was checked on, the backward's forward and the determinism check's two
    assert broken.forward_passes == 1 + 1 + 2 + 1 + 2 + 2 * (8 + 8 + 8 + 8 + 8 + 3)


def test_dropout_made_deterministic_per_evaluation():
    # without a fixed seed per evaluation, two dropout masks would make L(w±εv) differ wildly
    model = mlp(dropout=0.5, batchnorm=True)
    result = grad_check(model, batch(), nn.CrossEntropyLoss())
    assert result.status == "passed", result


def test_zero_gradient_parameters_are_not_false_alarms():
    model = mlp()
    with torch.no_grad():
        model[0].bias.fill_(-50.0)  # dead first layer: many exact-zero gradients
    result = grad_check(model, batch(), nn.CrossEntropyLoss(), mode="elementwise")
    assert result.status == "passed", result.parameters


def test_model_float32_untouched_and_rng_restored():
    model = custom_backward_mlp("scaled")
    before = snapshot(model)
    grad_check(model, batch(), nn.CrossEntropyLoss())
    assert_untouched(before, model)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def quadratic_problem(bug: bool):
    rng = np.random.default_rng(0)
    params = {"a": rng.normal(size=(4, 3)), "b": rng.normal(size=5)}
    original = {n: v.copy() for n, v in params.items()}

    def loss(p):
        return float((p["a"] ** 2).sum() * 0.5 + np.sin(p["b"]).sum())

    grads = {"a": params["a"].copy(), "b": np.cos(params["b"])}
    if bug:
        grads["b"] = grads["b"].copy()
        grads["b"][4] *= -1
    return params, original, loss, grads


@pytest.mark.parametrize("mode", ["directional", "elementwise"])
def test_framework_free_form(mode):
    params, original, loss, grads = quadratic_problem(bug=False)
    ok = grad_check_arrays(params, loss, grads, mode=mode)
    assert ok.status == "passed"
    params, original, loss, grads = quadratic_problem(bug=True)
    bad = grad_check_arrays(params, loss, grads, mode=mode)
    assert bad.status == "failed"
    assert [p.name for p in bad.parameters if p.status == "bug"] == ["b"]
    if mode == "elementwise":
        assert {p.name: p for p in bad.parameters}["b"].worst_index == [4]
    assert all(np.array_equal(params[n], original[n]) for n in params)  # arrays not modified


def test_framework_free_form_rejects_mismatched_input():
    params, _, loss, grads = quadratic_problem(bug=False)
    with pytest.raises(ValueError, match="same names"):
        grad_check_arrays(params, loss, {"a": grads["a"]})
    with pytest.raises(ValueError, match="shape"):
        grad_check_arrays(params, loss, {"a": grads["a"].T, "b": grads["b"]})
    with pytest.raises(ValueError, match="mode"):
        grad_check_arrays(params, loss, grads, mode="everything")


def test_a_model_whose_every_difference_crosses_a_kink_is_checked_within_a_budget_of_forwards():
    """DARTS's cells (hundreds of tensors behind ReLUs and max-pools) crossed a kink in nearly every
    difference at every step size: each half of the tensors stayed suspect, so the halving went down
    to every tensor, 3 directions x 5 step sizes x 2 forwards each, for 3,350 s. The check stops at
    its budget of forwards, says so, and calls nothing broken; a wrong backward is still found within it."""
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(8, 3))
    for module in model:
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
    zeros = (torch.zeros(16, 8), torch.randint(0, 3, (16,)))  # every ReLU at its kink, exactly
    result = grad_check(model, zeros, nn.CrossEntropyLoss(), max_forwards=120)
    assert result.status == "passed" and "budget of 120 forwards" in result.message, result.message
    assert result.forward_passes <= 120 + 20
    broken = grad_check(custom_backward_mlp("scaled"), batch(), nn.CrossEntropyLoss(), max_forwards=120)
    assert broken.status == "failed" and "2.weight" in broken.message


def test_relu_kink_within_eps_is_not_a_false_alarm():
    # this seed puts a layer-2 pre-activation 4e-8 from zero: every plain central
    # difference with eps=1e-5 crosses the kink (torch.autograd.gradcheck fails here too)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    g = torch.Generator().manual_seed(1)
    data = (torch.randn(32, 10, generator=g), torch.randint(0, 2, (32,), generator=g))
    result = grad_check(model, data, nn.CrossEntropyLoss())
    assert result.status == "passed" and "kink" in result.message
    assert all(p.status != "bug" for p in result.parameters)


class _ScaledBackward(torch.autograd.Function):
    """y = x Wᵀ + b whose weight gradient is multiplied by ``scale`` (1: correct)."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale):
        ctx.save_for_backward(x, weight)
        ctx.scale = scale
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return grad_out @ weight, (grad_out.t() @ x) * ctx.scale, grad_out.sum(0), None


class _ScaledLinear(nn.Linear):
    scale = 1.0

    def forward(self, x):
        return _ScaledBackward.apply(x, self.weight, self.bias, self.scale)


def test_trained_to_a_tiny_loss_passes_and_a_ten_percent_scaled_backward_is_still_caught():
    # A model overfit to loss ~1e-5 has directional derivatives ~1e-7, and a ReLU
    # pre-activation within 1e-8 of its kink (the overfit digits MLP had one at 1.8e-9)
    # forces ε down to 1e-8, where the float64 round-off of the cross-entropy (~1e-17,
    # absolute) makes the difference quotient noisy by ~1e-9: that noise used to be
    # reported as a relative error of 1e-3..1e-2, a "bug" in a healthy model.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), _ScaledLinear(64, 64), nn.ReLU(), nn.Linear(64, 3)).double()
    x, y = batch(n=32)
    x = x.double()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(400):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():  # the smallest active first-layer pre-activation moved to 2e-9 from its kink
        h = model[0](x)
        i, j = divmod(int(torch.where(h > 0, h, torch.inf).argmin()), h.shape[1])
        model[0].bias[j] -= h[i, j] - 2e-9
        assert nn.functional.cross_entropy(model(x), y).item() < 1e-4

    healthy = grad_check(model, (x, y), nn.CrossEntropyLoss())
    assert healthy.status == "passed", healthy.parameters
    assert all(p.status != "bug" for p in healthy.parameters) and "kink" in healthy.message

    model[2].scale = 1.1
    broken = grad_check(model, (x, y), nn.CrossEntropyLoss())
    assert broken.status == "failed"
    assert [p.name for p in broken.parameters if p.status == "bug"] == ["2.weight"]


class FunctionalKinks(nn.Module):
    """Kinks only functional code sees: relu of a shifted pre-activation, abs, a comparison
    mask and a clamp, over many units (so some sit within ε of a kink)."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Linear(8, 256), nn.Linear(256, 3)

    def forward(self, x):
        h = self.a(x)
        h = torch.relu(h * 3 - 0.01) + torch.abs(h - 0.02) + torch.where(h > 0.01, h, 0.1 * h).clamp(-1, 1)
        return self.c(h)


@pytest.mark.slow
def test_functional_kinks_are_no_broken_backward():
    # before the functional kinks were recorded, 5 of these 12 trials reported a bug
    for seed in range(12):
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)
        result = grad_check(FunctionalKinks(), (x, y), nn.CrossEntropyLoss(), seed=seed, eps=1e-3)
        assert result.status == "passed", (seed, result.message)


class BoundedActivations(nn.Module):
    """Activation modules whose kinks are not at zero (hardswish at ±3, softshrink at
    ±0.5, ReLU6 at 0 and 6), over pre-activations spread wide enough to sit near them."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Linear(8, 256), nn.Linear(768, 3)
        self.acts = nn.ModuleList([nn.Hardswish(), nn.Softshrink(), nn.ReLU6()])

    def forward(self, x):
        h = self.a(x) * 8
        return self.c(torch.cat([act(h) for act in self.acts], dim=1))


@pytest.mark.slow
def test_kinks_of_activation_modules_away_from_zero_are_no_broken_backward():
    # with hardswish recorded as a kink at 0 and softshrink not at all, trials reported a bug
    for seed in range(12):
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)
        result = grad_check(BoundedActivations(), (x, y), nn.CrossEntropyLoss(), seed=seed, eps=1e-3)
        assert result.status == "passed", (seed, result.message)


class _Shake(torch.autograd.Function):
    """Shake-shake (Gastaldi 2017, as CuriousAI's mean-teacher writes it): a random convex
    mix of two branches forward, another random mix backward, by design."""

    @staticmethod
    def forward(ctx, a, b):
        gate = torch.rand(a.shape[0], 1, dtype=a.dtype, device=a.device)
        return gate * a + (1 - gate) * b

    @staticmethod
    def backward(ctx, grad):
        gate = torch.rand(grad.shape[0], 1, dtype=grad.dtype, device=grad.device)
        return gate * grad, (1 - gate) * grad


class ShakeShake(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.c(torch.tanh(_Shake.apply(self.a(x), self.b(x))))


def test_a_backward_that_draws_its_own_randomness_is_not_called_broken():
    result = grad_check(ShakeShake(), batch(), nn.CrossEntropyLoss())
    assert result.status == "skipped" and "randomness of its own" in result.message


class Saturated(nn.Module):
    """A logit summed over the batch (DeepFM's FM term without its dim) drives every
    sigmoid to within 1e-13 of 1, where BCELoss's backward clamps p(1 - p) at 1e-12."""

    def __init__(self, bug=None):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 4), CustomLinear(4, 1, bug)

    def forward(self, x):
        z = self.b(torch.tanh(self.a(x))).squeeze(1)
        return torch.sigmoid(z + 6 * z.mean() + 30)


def test_a_torch_loss_clamped_at_saturated_outputs_is_no_broken_backward():
    x, y = torch.randn(64, 8), (torch.rand(64) < 0.3).float()
    healthy = grad_check(Saturated(), (x, y), nn.BCELoss())
    assert healthy.status == "skipped" and "BCELoss's own gradient" in healthy.message
    # away from saturation, the stand-in still finds a broken backward under torch's own loss
    broken = grad_check(nn.Sequential(CustomLinear(8, 1, "scaled"), nn.Sigmoid(), nn.Flatten(0)), (x, y), nn.BCELoss())
    assert broken.status == "failed" and "0.weight" in broken.message


class MaxOverTime(nn.Module):
    """A per-step Linear max-reduced over time (a temporal CNN's pooling), written as amax."""

    def __init__(self):
        super().__init__()
        self.step, self.head = nn.Linear(4, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.step(x).amax(dim=1))


def test_a_max_over_a_dimension_is_a_kink_too():
    # before amax was recorded as a kink, 2 of these 12 trials reported a bug
    for seed in range(12):
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(128, 12, 4, generator=g), torch.randint(0, 3, (128,), generator=g)
        result = grad_check(MaxOverTime(), (x, y), nn.CrossEntropyLoss(), seed=seed, eps=1e-3)
        assert result.status == "passed", (seed, result.message)


class Float32Inside(nn.Module):
    """Casts to float32 inside forward (as mixed-precision code does): float64 rounding
    is not what the differences can resolve."""

    def __init__(self, bug=None):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.c = nn.Linear(8, 32), CustomLinear(32, 3, bug)

    def forward(self, x):
        return self.c(torch.tanh(self.a(x)).float().to(x.dtype))


def test_a_forward_that_computes_in_float32_is_judged_by_float32_rounding():
    healthy = grad_check(Float32Inside(), batch(), nn.CrossEntropyLoss())
    assert healthy.status == "passed" and "computes in float32" in healthy.message
    broken = grad_check(Float32Inside("transposed"), batch(), nn.CrossEntropyLoss())
    assert broken.status == "failed" and [p.name for p in broken.parameters if p.status == "bug"] == ["c.weight"]


class MaskedInside(nn.Module):
    """Builds a causal mask with ``torch.ones`` (float32 whatever the model's dtype), as
    attention code does: a constant of exact 0s and 1s, which rounds nothing."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.c = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        keep = torch.tril(torch.ones(x.shape[0], x.shape[0], device=x.device)).bool()
        scores = (self.a(x) @ x.T).masked_fill(~keep, -1e9)
        return self.c(torch.softmax(scores, dim=-1) @ x)


def test_a_float32_constant_built_in_the_forward_does_not_coarsen_the_check():
    result = grad_check(MaskedInside(), batch(), nn.CrossEntropyLoss())
    assert result.status == "passed" and "float32" not in result.message
    assert result.forward_passes <= 13  # the joint check was clean: no per-tensor localisation


class OnlyFloat32(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.c = nn.Linear(8, 16), nn.Linear(16, 3)
        self.register_buffer("scale", torch.ones(16))

    def forward(self, x):
        return self.c(torch.relu(self.a(x.float())) * self.scale.float())


def test_a_model_that_cannot_run_in_float64_is_checked_in_float32():
    result = grad_check(OnlyFloat32(), batch(), nn.CrossEntropyLoss())
    assert result.status == "passed" and result.message.startswith("checked in float32")


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.calls = nn.Linear(8, 3), 0

    def forward(self, x):
        self.calls += 1  # e.g. a cached state or a counter: the loss is no function of the weights
        return self.a(x) * (1 + 0.01 * self.calls)


def test_a_forward_that_keeps_state_is_skipped_not_called_broken():
    result = grad_check(Stateful(), batch(), nn.CrossEntropyLoss())
    assert result.status == "skipped" and "keeps state" in result.message


def _advantage_loss(outputs, targets):
    """An actor-critic loss, as pytorch/examples writes it: the advantage ``R - value`` is a
    constant for the policy term (``.item()`` there, ``.detach()`` here), on purpose."""
    logits, value = outputs
    actions, returns = targets
    log_prob = torch.log_softmax(logits, dim=1).gather(1, actions[:, None]).squeeze(1)
    advantage = returns - value.squeeze(1).detach()
    return -(log_prob * advantage).mean() + nn.functional.smooth_l1_loss(value.squeeze(1), returns)


class _ActorCritic(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body, self.value = body, nn.Linear(3, 1)

    def forward(self, x):
        logits = self.body(x)
        return logits, self.value(logits)


def _rl_batch():
    x, y = batch()
    return x, (y, torch.linspace(-1.0, 2.0, len(y)))


def test_a_deliberate_stop_gradient_in_the_loss_is_no_broken_backward():
    result = grad_check(_ActorCritic(custom_backward_mlp(None)), _rl_batch(), _advantage_loss)
    assert result.status == "passed", result.message
    assert result.loss_projected and "stop-gradient" in result.message


def test_behind_such_a_loss_a_wrong_backward_in_the_model_is_still_caught():
    result = grad_check(_ActorCritic(custom_backward_mlp("transposed")), _rl_batch(), _advantage_loss)
    assert result.status == "failed" and result.loss_projected
    assert {p.name: p.status for p in result.parameters}["body.2.weight"] == "bug"


def _advantage_loss_in_place(output, targets):
    """The advantage loss on a value head squashed in place first (``tanh_``), as losses that
    rewrite their inputs do (CenterNet's ``sigmoid_``)."""
    logits, value = output
    return _advantage_loss((logits, value.tanh_()), targets)


def test_a_loss_with_a_stop_gradient_that_works_in_place_on_the_outputs_is_checked_too():
    """The stop-gradient check differentiates the loss at leaf copies of the outputs: a loss that
    works in place on what it is given gets clones of those leaves, as it gets the outputs of a
    forward in the user's loop, and the check passes instead of raising."""
    result = grad_check(_ActorCritic(custom_backward_mlp(None)), _rl_batch(), _advantage_loss_in_place)
    assert result.status == "passed" and result.loss_projected, result.message


def _dice_in_float32(logits, target):
    """Pytorch-UNet's loss: cross-entropy plus a Dice term on ``.float()`` casts, which round
    in float32 whatever the model computes in."""
    probs = torch.softmax(logits, dim=1).float()
    one_hot = nn.functional.one_hot(target, logits.shape[1]).float()
    dice = (2 * (probs * one_hot).sum() + 1e-6) / (probs.sum() + one_hot.sum() + 1e-6)
    return nn.functional.cross_entropy(logits, target) + (1 - dice)


def test_a_loss_that_casts_to_float32_is_judged_by_float32_rounding():
    healthy = grad_check(custom_backward_mlp(None), batch(), _dice_in_float32)
    assert healthy.status == "passed", healthy.message
    assert "computes in float32" in healthy.message and "stop-gradient" not in healthy.message
    broken = grad_check(custom_backward_mlp("transposed"), batch(), _dice_in_float32)
    assert broken.status == "failed" and {p.name: p.status for p in broken.parameters}["2.weight"] == "bug"


def test_a_frozen_layer_is_no_state_the_forward_writes():
    """The float64 copy converts frozen parameters in place (``param.data = ...``): that is
    no write of the forward's, so the check runs (a momentum encoder's update is one)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    for p in model[0].parameters():
        p.requires_grad = False
    result = grad_check(model, (torch.randn(16, 8), torch.randint(0, 3, (16,))), nn.CrossEntropyLoss())
    assert result.status == "passed", result.message


class _SimSiam(nn.Module):
    """SimSiam's builder: the projection z and the prediction p of one encoder, z returned
    detached as the other view's target (a stop-gradient on purpose)."""

    def __init__(self, body: nn.Module | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = body or nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        self.predictor = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 3))

    def forward(self, x):
        z1, z2 = self.encoder(x), self.encoder(x.flip(0))
        return self.predictor(z1), self.predictor(z2), z1.detach(), z2.detach()


def _negative_cosine(outputs, _targets):
    p1, p2, z1, z2 = outputs
    cos = nn.functional.cosine_similarity
    return -(cos(p1, z2).mean() + cos(p2, z1).mean()) / 2


class _DetachedState(nn.Module):
    """torchdiffeq's ode_demo with the state detached inside the dynamics (a reported bug):
    the gradient through the state's earlier steps is cut, through the last step kept."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        y = x
        for _ in range(3):
            y = y + 0.5 * self.net(y.detach() ** 3)
        return self.head(y)


def test_stop_gradients_in_the_forward_are_named_not_called_a_broken_backward():
    import nndx
    from nndx.report import DiagnosticReport, Probes

    for model, loss in ((_SimSiam(), _negative_cosine), (_DetachedState(), nn.CrossEntropyLoss())):
        result = grad_check(model, batch(), loss)
        # SimSiam's two targets; the state's three steps (nndx's own detaches, recording kinks, do not count)
        assert result.status == "passed" and result.stop_gradients in (2, 3), result.message
        assert "detach" in result.message
        findings = nndx.diagnose(DiagnosticReport(probes=Probes(grad_check=result))).findings
        assert [(f.rule_id, f.code.value, f.severity) for f in findings] == [("NNDX618", "DETACHED_GRAPH", "info")]
    # a wrong backward behind a stop-gradient is still a wrong backward
    broken = grad_check(_SimSiam(custom_backward_mlp("transposed")), batch(), _negative_cosine)
    assert broken.status == "failed" and "detach" not in broken.message
    top = nndx.diagnose(DiagnosticReport(probes=Probes(grad_check=broken))).top()
    assert top.code.value == "BROKEN_BACKWARD"


class _CutRecurrence(nn.Module):
    """Tree-LSTM's reported bug, as a chain: each step's state is computed from the last
    one's detach() alone, so no gradient reaches an earlier step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cell, self.head = nn.GRUCell(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.zeros_like(x)
        for step in range(4):  # the first detach is of a constant, which no gradient needed
            h = self.cell(x.roll(step, 1), h.detach())
        return self.head(h)


class _StackedStraightThrough(nn.Module):
    """Two vector quantisers in a row (VQ-VAE-2's, a residual VQ's): each ``x + (q - x).detach()``
    keeps a path for the gradient past its stop-gradient, on purpose."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encode, self.between, self.head = nn.Linear(8, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        z = self.encode(x)
        for _ in range(2):
            z = self.between(z + (z.round() - z).detach())
        return self.head(z)


def test_a_state_detached_and_computed_on_at_every_step_is_told_from_stop_gradients_on_purpose():
    import nndx
    from nndx.report import DiagnosticReport, Probes

    cut = grad_check(_CutRecurrence(), batch(), nn.CrossEntropyLoss())
    assert cut.status == "passed" and cut.stop_gradients == 4 and cut.chained_stop_gradients == 2, cut.message
    findings = nndx.diagnose(DiagnosticReport(probes=Probes(grad_check=cut))).findings
    assert [(f.rule_id, f.code.value, f.severity) for f in findings] == [("NNDX618", "DETACHED_GRAPH", "warning")]
    # a target branch, a state whose residual path keeps a gradient, straight-through estimators in a row
    for model, loss in ((_SimSiam(), _negative_cosine), (_DetachedState(), nn.CrossEntropyLoss()),
                        (_StackedStraightThrough(), nn.CrossEntropyLoss())):  # fmt: skip
        result = grad_check(model, batch(), loss)
        assert result.status == "passed" and result.stop_gradients and result.chained_stop_gradients == 0, (
            type(model).__name__, result.message)


class MaskedLinear(nn.Linear):
    """jzbontar/pixelcnn-pytorch's masked layer: the mask is applied to ``weight.data`` in place
    at every forward, so whatever a step writes into the masked entries is wiped before it is
    used. Autograd gives those entries a gradient that no forward ever sees."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        g = torch.Generator().manual_seed(1)
        self.register_buffer("mask", (torch.rand(n_out, n_in, generator=g) > 0.5).float())

    def forward(self, x):
        self.weight.data *= self.mask
        return super().forward(x)


def test_weights_masked_in_place_by_the_forward_are_no_broken_backward():
    torch.manual_seed(0)
    model = nn.Sequential(MaskedLinear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    result = grad_check(model, batch(), nn.CrossEntropyLoss())
    assert result.status == "passed", result.message
    assert "overwrites" in result.message and "0.weight" in result.message
    # a wrong backward behind the mask is still caught
    torch.manual_seed(0)
    broken = nn.Sequential(MaskedLinear(8, 16), nn.Tanh(), CustomLinear(16, 3, "scaled"))
    assert grad_check(broken, batch(), nn.CrossEntropyLoss()).status == "failed"


class RenormalisedEmbedding(nn.Embedding):
    """mklimasz/TransE-PyTorch: the entity rows are L2-normalised through ``weight.data`` at
    every forward. What a step writes there is read (divided by its norm), not wiped: the loss
    is a function of the weight that autograd does not see, so no gradient check can compare."""

    def forward(self, x):
        self.weight.data.div_(self.weight.data.norm(dim=1, keepdim=True))
        return super().forward(x)


def test_weights_renormalised_in_place_by_the_forward_are_skipped_not_failed():
    torch.manual_seed(0)
    model = nn.Sequential(RenormalisedEmbedding(20, 8), nn.Flatten(), nn.Linear(16, 3))
    x, y = torch.randint(0, 20, (8, 2)), torch.randint(0, 3, (8,))
    result = grad_check(model, (x, y), nn.CrossEntropyLoss())
    assert result.status == "skipped" and "0.weight" in result.message and "rewrites" in result.message


class _CastsThenRecurs(nn.Module):
    """HAN's word encoder: a lookup whose output the forward casts with ``.float()`` before a GRU,
    so a float64 copy feeds float32 into float64 weights and the GRU raises a ValueError."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.rnn, self.head = nn.Linear(8, 6), nn.GRU(6, 5, batch_first=True), nn.Linear(5, 3)

    def forward(self, x):
        out, _ = self.rnn(self.embed(x).float().unsqueeze(1))
        return self.head(out[:, -1])


def test_a_forward_that_casts_to_float32_before_a_recurrent_layer_is_checked_in_float32():
    result = grad_check(_CastsThenRecurs(), batch(), nn.CrossEntropyLoss())
    assert result.status == "passed" and "checked in float32" in result.message, result.message


class BagOfWords(nn.Module):
    """MemN2N's sentence encoding: nn.Embedding(padding_idx=0) whose nil row is then refilled
    with normal_ (the forward reads it; the backward never gives it a gradient), and, tied, the
    same table as the answer's output matrix, through which the nil row gets a gradient again."""

    def __init__(self, head: nn.Module | None):
        super().__init__()
        self.embed = nn.Embedding(12, 8, padding_idx=0)
        self.embed.weight.data.normal_(0, 0.1)
        self.head = head

    def forward(self, words):
        h = torch.tanh(self.embed(words).sum(1))
        return self.head(h) if self.head is not None else h @ self.embed.weight[:3].T


def test_an_embeddings_padding_row_is_checked_as_the_forwards_derivative():
    words = torch.randint(0, 12, (16, 5), generator=torch.Generator().manual_seed(0))
    words[:, -2:] = 0  # padded sentences
    y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(1))
    for head in (nn.Linear(8, 3), None):
        torch.manual_seed(0)
        model = BagOfWords(head)
        result = grad_check(model, (words, y), nn.CrossEntropyLoss())
        assert result.status == "passed", result.message
        assert model.embed.padding_idx == 0  # the user's model keeps it
    torch.manual_seed(0)  # a wrong backward beside it is still caught
    assert grad_check(BagOfWords(CustomLinear(8, 3, "scaled")), (words, y), nn.CrossEntropyLoss()).status == "failed"


class _SkipGram(nn.Module):
    """node2vec's loss as its model: ``-log(1 - sigmoid(<h_u, h_v>) + 1e-15)`` for random pairs,
    embeddings N(0, 1) of dimension 32 (dot products to ~50), through a projection."""

    def __init__(self, project: nn.Linear):
        super().__init__()
        torch.manual_seed(0)
        self.embedding, self.project = nn.Embedding(60, 32), project
        with torch.no_grad():
            self.project.weight.copy_(torch.eye(32) + 0.01 * torch.randn(32, 32))

    def forward(self, pairs):
        h = self.project(self.embedding(pairs).reshape(-1, 32)).reshape(-1, 2, 32)
        out = (h[:, 0] * h[:, 1]).sum(-1)
        return -torch.log(1 - torch.sigmoid(out) + 1e-15).mean()


def test_a_loss_that_loses_its_precision_is_no_broken_backward_where_every_derivative_is_torchs():
    """At dot products over 30, ``1 - sigmoid(x)`` takes float64's quanta of 1e-16: the
    differences of a correct backward were off by 15%, and the healthy node2vec (PyG's loss)
    got BROKEN_BACKWARD as an error. Where every backward node is torch's own, that is the
    forward's rounding; a custom Function's backward 10% wrong is still named."""
    pairs = torch.randint(0, 60, (400, 2), generator=torch.Generator().manual_seed(1))
    healthy = grad_check(_SkipGram(nn.Linear(32, 32)), (pairs, None), lambda loss, _target: loss)
    assert healthy.status == "passed" and "torch's own" in healthy.message, healthy.message
    assert healthy.max_relative_error > 1e-3  # the differences do disagree
    wrong = _ScaledLinear(32, 32)
    wrong.scale = 1.1
    broken = grad_check(_SkipGram(wrong), (pairs, None), lambda loss, _target: loss)
    assert broken.status == "failed" and "project.weight" in [p.name for p in broken.parameters if p.status == "bug"]


class _SignSTE(torch.autograd.Function):
    """BinaryNet's Binarize: sign forward, the gradient passed straight through."""

    @staticmethod
    def forward(ctx, x):
        return x.sign()

    @staticmethod
    def backward(ctx, grad):
        return grad


class _BinarizedLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, _SignSTE.apply(self.weight), self.bias)


def test_a_straight_through_estimator_is_a_surrogate_not_a_broken_backward():
    import nndx
    from nndx.report import DiagnosticReport, Probes

    torch.manual_seed(0)
    binary = nn.Sequential(_BinarizedLinear(8, 16), nn.BatchNorm1d(16), nn.Hardtanh(), _BinarizedLinear(16, 3))
    result = grad_check(binary, batch(), nn.CrossEntropyLoss())
    flat = {p.name for p in result.parameters if p.loss_flat}
    assert result.status == "passed" and {"0.weight", "3.weight"} <= flat, result.message
    assert "straight-through" in result.message
    assert not any(f.code.value == "BROKEN_BACKWARD" for f in nndx.diagnose(
        DiagnosticReport(probes=Probes(grad_check=result))).findings)  # fmt: skip
    # a wrong backward beside it is still one, and only it is named
    torch.manual_seed(0)
    broken = nn.Sequential(_BinarizedLinear(8, 16), nn.Tanh(), CustomLinear(16, 16, "transposed"), nn.Tanh(),
                           nn.Linear(16, 3))  # fmt: skip
    result = grad_check(broken, batch(), nn.CrossEntropyLoss())
    bugs = [p.name for p in result.parameters if p.status == "bug" and not p.loss_flat]
    assert result.status == "failed" and bugs == ["2.weight"], result.message
