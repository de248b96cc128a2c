"""Diagnosis by intervention: the remedy of the planted cause makes a copy learn, the
others do not, and the user's model, optimizer and RNG are untouched — called directly
and as the ``interventions`` probe of ``nndx.probe``."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nndx
from nndx.collector import interventions as interventions_module
from nndx.collector import probe as probe_module
from nndx.collector.interventions import interventions
from nndx.report import DiagnosticReport

torch.set_num_threads(1)


def _data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 20, generator=gen)
    y = (x @ torch.randn(20, 4, generator=gen)).argmax(1)
    return x, y


def _mlp(seed: int = 0, *extra: nn.Module) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4), *extra)


class FunctionalSigmoidHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out = nn.Linear(20, 64), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.out(F.relu(self.hidden(x))))


def _dead(model: nn.Sequential) -> nn.Sequential:
    nn.init.constant_(model[0].bias, -8.0)
    return model


def _std_one(model: nn.Sequential) -> nn.Sequential:
    for layer in (model[0], model[2]):
        nn.init.normal_(layer.weight, std=1.0)
    return model


def test_the_init_remedy_restores_only_layers_no_standard_init_gives():
    """N(0, 1) on a wide layer is restored to PyTorch's init; a GPT-style N(0, 0.02) layer
    and a zero last layer (both deliberate and harmless) keep their weights, and the
    global RNG is where it was."""
    from nndx.collector import remedies

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 768), nn.ReLU(), nn.Linear(768, 4))
    nn.init.normal_(model[0].weight, std=1.0)
    nn.init.normal_(model[2].weight, std=0.02)
    nn.init.zeros_(model[4].weight)
    kept = [model[2].weight.clone(), model[4].weight.clone()]
    rng = torch.get_rng_state()
    remedies.default_init(remedies.Setup(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, F.mse_loss))
    assert torch.equal(torch.get_rng_state(), rng)
    assert remedies._gain(model[0].weight) < 1.0  # was 16
    assert torch.equal(model[2].weight, kept[0]) and torch.equal(model[4].weight, kept[1])
    with pytest.raises(remedies.NotApplicable):  # nothing left to restore
        remedies.default_init(remedies.Setup(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, F.mse_loss))
    nn.init.zeros_(model[2].weight)  # all zero before the last layer: no standard init either
    remedies.default_init(remedies.Setup(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, F.mse_loss))
    assert model[2].weight.any()
    # one value in every entry (uvadlc's const_init, 0.005): every unit the same, at a harmless gain of 0.08
    nn.init.constant_(model[0].weight, 0.005)
    remedies.default_init(remedies.Setup(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, F.mse_loss))
    assert model[0].weight.std() > 0


def test_constant_weights_are_confirmed_as_the_init_that_breaks_learning():
    """uvadlc's constant init: every weight 0.005, so every unit of a layer computes the same thing
    and gets the same gradient. The gain is small and no weight is zero: restoring PyTorch's init is
    still the remedy that makes the copy learn."""
    x, y = _data()
    model = _mlp(0)
    for layer in (model[0], model[2]):
        nn.init.constant_(layer.weight, 0.005)
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert _statuses(result).get("BAD_INIT") == "confirmed", result


def test_the_dead_unit_remedy_needs_units_zero_on_more_than_one_sample():
    """On one sample half of a live ReLU layer is zero: re-initialising those units would
    'confirm' DEAD_RELU on a healthy network trained one sample at a time."""
    from nndx.collector import remedies

    x, y = _data()

    def setup(model, inputs):
        return remedies.Setup(model, torch.optim.SGD(model.parameters(), lr=0.1), inputs, None, F.cross_entropy)

    with pytest.raises(remedies.NotApplicable):
        remedies.reinit_dead_units(setup(_mlp(), x[:1]))
    dead = _dead(_mlp())
    before = dead[0].weight.clone()
    remedies.reinit_dead_units(setup(dead, x[:1]))  # every unit zero: dead on any batch
    assert not torch.equal(dead[0].weight, before)


def _statuses(result) -> dict[str, str]:
    return {r.cause: r.status for r in result.results}


def test_a_healthy_setup_learns_and_no_remedy_is_judged():
    x, y = _data()
    model = _mlp()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(model.parameters(), 1e-3))
    assert result.results == [] and "nothing for a remedy to explain" in result.message
    assert result.baseline_final_loss < 0.5 * result.baseline_initial_loss


@pytest.mark.parametrize(
    "name, build, expected",
    [
        ("lr far too high", lambda m: (m, torch.optim.SGD(m.parameters(), lr=50.0)), "LR_TOO_HIGH"),
        ("lr far too low", lambda m: (m, torch.optim.SGD(m.parameters(), lr=1e-4)), "LR_TOO_LOW"),
        ("softmax before CE", lambda m: (m.append(nn.Softmax(dim=1)), torch.optim.SGD(m.parameters(), lr=0.1)), "DOUBLE_SOFTMAX"),
        ("dead units", lambda m: (_dead(m), torch.optim.Adam(m.parameters(), 1e-3)), "DEAD_RELU"),
        ("weights of std 1", lambda m: (_std_one(m), torch.optim.Adam(m.parameters(), 1e-3)), "BAD_INIT"),
    ],
)
def test_the_planted_causes_remedy_is_confirmed_and_no_other(name, build, expected):
    x, y = _data()
    model, optimizer = build(_mlp())
    statuses = _statuses(interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer))
    assert statuses.get(expected) == "confirmed", statuses
    assert [cause for cause, status in statuses.items() if status == "confirmed"] == [expected]


def test_a_functional_sigmoid_on_the_logits_is_found_and_removed():
    x, y = _data()
    model = FunctionalSigmoidHead()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    tried = {r.cause: r for r in result.results}
    assert "WRONG_OUTPUT_ACTIVATION" in tried, result
    assert tried["WRONG_OUTPUT_ACTIVATION"].remedy == "the Sigmoid on the output removed"


def test_a_loss_that_cannot_run_on_class_labels_is_fixed_by_the_matching_loss():
    x, y = _data()
    model = _mlp()
    result = interventions(model, (x, y.float()), nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), 1e-2))
    assert result.baseline_initial_loss is None  # [128, 4] against [128]: the setup cannot train as given
    assert _statuses(result).get("WRONG_LOSS") == "confirmed"


def test_the_users_model_optimizer_and_rng_are_untouched():
    x, y = _data()
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=50.0, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {} and optimizer.param_groups[0]["lr"] == 50.0
    assert torch.equal(rng, torch.get_rng_state())


class TickingClock:
    """A clock that advances one second each time it is read: the budget is then counted
    in clock reads, the same on every machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_budget_bounds_the_remedies_tried(monkeypatch):
    monkeypatch.setattr(interventions_module, "_clock", TickingClock())
    x, y = _data()
    model = _mlp()
    steps = 10  # a run reads the clock once per step: the baseline fits in 40 ticks, not every remedy after it
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-5),
                           steps=steps, budget_seconds=40)  # fmt: skip
    assert result.baseline_final_loss is not None and result.budget_seconds == 40
    statuses = [r.status for r in result.results]
    assert "skipped" in statuses, result
    first_skipped = statuses.index("skipped")
    assert all(s == "skipped" for s in statuses[first_skipped:])  # nothing runs once the budget is spent
    assert all("budget" in r.message for r in result.results[first_skipped:])


def test_a_baseline_the_budget_cuts_short_tries_no_remedy(monkeypatch):
    monkeypatch.setattr(interventions_module, "_clock", TickingClock())
    x, y = _data()
    model = _mlp()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=50.0),
                           steps=50, budget_seconds=10)  # fmt: skip
    assert result.results == [] and result.baseline_final_loss is None and "budget" in result.message


def test_a_slower_and_a_faster_learning_rate_that_both_help_blame_neither(monkeypatch):
    """On one batch of an actor-critic's episode any change of step size lowered the loss:
    an experiment whose two opposite remedies both work confirms no direction."""
    x, y = _data()
    model = _mlp()
    base_lr = 0.05
    real_run = interventions_module._run

    def scripted(setup, steps, seed, deadline):
        real_run(setup, 2, seed, deadline)  # the setup still runs (and could fail) as it would
        lr = setup.optimizer.param_groups[0]["lr"]
        falls = not math.isclose(lr, base_lr)  # any LR but the setup's own makes it learn
        return [1.0 - (0.6 * i / steps if falls else 0.0) for i in range(steps + 1)]

    monkeypatch.setattr(interventions_module, "_run", scripted)
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=base_lr))
    by_cause = {r.cause: r for r in result.results}
    assert by_cause["LR_TOO_HIGH"].status == by_cause["LR_TOO_LOW"].status == "inconclusive", result
    assert "neither direction" in by_cause["LR_TOO_LOW"].message

    def one_way(setup, steps, seed, deadline):  # only a slower LR helps: that direction stands
        lr = setup.optimizer.param_groups[0]["lr"]
        return [1.0 - (0.6 * i / steps if lr < base_lr * 0.5 else 0.0) for i in range(steps + 1)]

    monkeypatch.setattr(interventions_module, "_run", one_way)
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=base_lr))
    by_cause = {r.cause: r.status for r in result.results}
    assert by_cause["LR_TOO_HIGH"] == "confirmed" and by_cause["LR_TOO_LOW"] != "confirmed", result


def test_a_learning_rate_is_not_blamed_for_working_around_a_structural_bug():
    x, y = _data()
    model = FunctionalSigmoidHead()
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    statuses = _statuses(result)
    assert statuses.get("WRONG_OUTPUT_ACTIVATION") == "confirmed", result
    assert statuses.get("LR_TOO_LOW") in (None, "skipped") and statuses.get("LR_TOO_HIGH") in (None, "skipped")


def test_at_a_learning_rate_too_slow_to_show_anything_a_structural_remedy_is_tried_where_the_setup_moves():
    """Plain SGD at 1e-3 barely moves a correct model in 100 steps, so removing a softmax
    before cross-entropy shows nothing there, and a 1000x LR "fixes" it. Tried at the
    largest factor where the setup as given still does not learn, removing the softmax
    makes it learn: that is the cause, the LR only compensated (the PyTorch quickstart
    with an nn.Softmax appended)."""
    x, y = _data()
    model = _mlp(0, nn.Softmax(dim=1))
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    statuses = _statuses(result)
    assert statuses.get("DOUBLE_SOFTMAX") == "confirmed", result
    assert statuses.get("LR_TOO_LOW") == "skipped", result
    softmax = next(r for r in result.results if r.cause == "DOUBLE_SOFTMAX")
    assert "learning rate multiplied by" in softmax.remedy and softmax.remedied_progress > softmax.baseline_progress
    # the same slow LR on logits: the LR is all there is, and nothing structural is confirmed
    plain = _mlp(0)
    result = interventions(plain, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(plain.parameters(), lr=1e-4))
    statuses = _statuses(result)
    assert statuses.get("LR_TOO_LOW") == "confirmed", result
    assert [c for c, s in statuses.items() if s == "confirmed"] == ["LR_TOO_LOW"]


# --------------------------------------------------------------------------- through nndx.probe


def _digits(count: int = 256):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x[:count], dtype=torch.float32)
    return (x - x.mean(0)) / (x.std(0) + 1e-6), torch.tensor(y[:count])


def _digits_mlp(seed: int, *extra: nn.Module) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10), *extra)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    return ({k: v.clone() for k, v in model.state_dict().items()}, copy.deepcopy(optimizer.state_dict()),
            torch.get_rng_state())  # fmt: skip


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a == b


QUICK = {"overfit_one_batch": {"steps": 40}, "lr_range": {"steps": 30}}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_sigmoid_before_cross_entropy_is_confirmed_and_ranked_first_through_probe(seed):
    x, y = _digits()
    model = _digits_mlp(seed, nn.Sigmoid())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, **QUICK)
    result = report.interventions
    assert result.status == "done" and _statuses(result).get("WRONG_OUTPUT_ACTIVATION") == "confirmed", result
    confirmed = next(r for r in result.results if r.status == "confirmed")
    assert confirmed.remedied_final_loss < 0.5 * confirmed.baseline_final_loss  # the evidence the prompt shows
    top = nndx.diagnose(report).roots()[0]
    assert top.code.value == "WRONG_OUTPUT_ACTIVATION" and top.confirmation == "confirmed", top


@pytest.mark.parametrize("seed", [0, 1])
def test_a_healthy_mlp_on_digits_costs_only_the_baseline_and_finds_nothing(seed):
    x, y = _digits()
    model = _digits_mlp(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, **QUICK)
    result = report.interventions
    assert result.status == "done" and result.results == [], result
    assert "nothing for a remedy to explain" in result.message
    assert not [e for e in report.errors if e.source == "interventions"]
    diagnosis = nndx.diagnose(report)
    assert not [f for f in diagnosis.findings if f.rule_id.startswith("NNDX8") or f.confirmation is not None]
    assert diagnosis.healthy, [(f.rule_id, f.severity) for f in diagnosis.findings]


def test_turned_off_the_probe_leaves_no_interventions():
    x, y = _digits(64)
    model = _digits_mlp(0, nn.Sigmoid())  # a setup that would run remedies
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    others = [name for name in probe_module.PROBES if name != "interventions"]
    left_out = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, probes=others, **QUICK)
    assert left_out.interventions is None
    assert not [f for f in nndx.diagnose(left_out).findings if f.confirmation is not None]
    off = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, probes=["interventions"],
                     interventions={"budget_seconds": 0})  # fmt: skip
    assert off.interventions.results == [] and off.interventions.baseline_initial_loss is None
    assert "budget is 0" in off.interventions.message


def test_on_a_trained_model_without_its_initial_state_it_says_skipped():
    class SteppedMonitor:
        def report(self):
            return DiagnosticReport.model_validate({"loop": {"steps": 300}})

    x, y = _digits(64)
    model = _digits_mlp(0)
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), probes=["interventions"], monitor=SteppedMonitor())
    assert report.interventions.status == "skipped" and "300 optimizer steps" in report.interventions.message
    assert report.interventions.results == []


def test_a_probe_that_raises_is_an_error_not_a_crash(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(interventions_module, "_chance_loss", broken)
    x, y = _digits(64)
    model = _digits_mlp(0)
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), probes=["interventions"])
    assert report.interventions.status == "error" and "planted failure" in report.interventions.message
    assert [e.source for e in report.errors] == ["interventions"]


def test_the_users_model_optimizer_rng_and_hooks_are_bit_identical_after_probe():
    x, y = _digits(64)
    model = _digits_mlp(0, nn.Sigmoid())  # remedies run: the most the probe does
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()  # momentum buffers: optimizer state to keep
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    before = _state(model, optimizer)
    grads = [p.grad.clone() for p in model.parameters()]
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, probes=["interventions"],
                        initial_state={k: v.clone() for k, v in model.state_dict().items()})  # fmt: skip
    assert report.interventions.results  # the remedies ran
    after = _state(model, optimizer)
    assert _same(before, after)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert calls == [] and optimizer.param_groups[0]["lr"] == 0.1


def test_a_remedy_that_does_not_apply_leaves_the_users_random_stream_alone():
    """The cross-entropy remedy decides it does not apply (one output column) after a
    forward through dropout; that draw must not reach the user's stream, called directly
    or through probe (the lstm forecaster's next dropout masks changed)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))
    x, _ = _data()
    y = x[:, 0].round()  # integer-valued floats, as class labels would be, and (N,) against (N, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-7)  # stuck: the remedies run
    for run in (lambda: interventions(model, (x, y), nn.MSELoss(), optimizer=optimizer, steps=5),
                lambda: nndx.probe(model, (x, y), nn.MSELoss(), optimizer=optimizer, probes=["interventions"])):
        torch.manual_seed(1)
        expected = torch.rand(3)
        torch.manual_seed(1)
        result = run()
        result = getattr(result, "interventions", result)
        assert result.results, result  # remedies were tried
        assert torch.equal(torch.rand(3), expected)



def _soft_cross_entropy(logits: torch.Tensor, target_pmfs: torch.Tensor) -> torch.Tensor:
    return -(target_pmfs * torch.log_softmax(logits, dim=1)).sum(1).mean()


@pytest.mark.parametrize("lr, climbs", [(20.0, True), (0.1, False)])
def test_a_slower_lr_that_stops_a_climb_confirms_it_on_a_batch_with_little_to_learn(lr, climbs):
    """C51's first batch: target distributions near uniform, so the loss starts within a few
    percent of its floor and no remedy can bring it to 75% of its start. SGD at lr 20 makes it
    climb far above its start; the slower LR that stops the climb names LR_TOO_HIGH. At a sane
    LR there is no climb, and the LR is not blamed."""
    x, _ = _data()
    targets = torch.softmax(0.3 * torch.randn(128, 4, generator=torch.Generator().manual_seed(3)), dim=1)
    model = _mlp()
    result = interventions(model, (x, targets), _soft_cross_entropy, optimizer=torch.optim.SGD(model.parameters(), lr))
    assert (result.baseline_final_loss > 1.5 * result.baseline_initial_loss) == climbs
    assert (_statuses(result).get("LR_TOO_HIGH") == "confirmed") == climbs, _statuses(result)


class ScoreNet(nn.Module):
    """Two inputs, as a noise-conditional score network takes them: the data and a noise level's index."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(5, 8)
        self.body = nn.Sequential(nn.Linear(28, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([x, self.embed(level)], 1))


def test_of_several_inputs_the_one_on_a_raw_scale_is_standardised_and_confirmed():
    x, y = _data()
    level = torch.randint(0, 5, (len(x),), generator=torch.Generator().manual_seed(1))
    model = ScoreNet()
    raw = interventions(model, ((x * 200 + 100, level), y), nn.CrossEntropyLoss(),
                        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))  # fmt: skip
    assert _statuses(raw) == {"UNNORMALIZED_INPUTS": "confirmed"}
    from nndx.collector import remedies

    setup = remedies.Setup(model=model, optimizer=None, inputs=(x, level), targets=y, loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(remedies.NotApplicable, match="raw scale"):
        remedies.standardize_inputs(setup)  # standard inputs beside an index: nothing to standardise


def test_raw_pixels_an_autoencoder_reconstructs_are_scaled_on_both_sides():
    """MorvanZhou's autoencoder fed raw pixels (0..16) as its input and as its MSE target behind
    a sigmoid: standardising the inputs alone leaves targets no sigmoid reaches, so the remedy
    would not help and read as "not confirmed". Targets that are the inputs are scaled with them."""
    gen = torch.Generator().manual_seed(0)
    pixels = (torch.rand(64, 64, generator=gen) * 17).floor()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 64), nn.Sigmoid())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    result = interventions(model, (pixels, pixels), nn.MSELoss(), optimizer=optimizer)
    assert _statuses(result)["UNNORMALIZED_INPUTS"] == "confirmed"
    from nndx.collector import remedies

    setup = remedies.Setup(model=model, optimizer=optimizer, inputs=pixels, targets=pixels.clone(),
                           loss_fn=nn.MSELoss())  # fmt: skip
    scaled = remedies.standardize_inputs(setup)
    assert float(scaled.targets.max()) <= 1.0 and torch.equal(scaled.inputs, scaled.targets)
    labels = torch.zeros(64, dtype=torch.long)
    assert remedies.standardize_inputs(replace(setup, targets=labels)).targets is labels  # classes: left alone


def test_a_remedy_that_starts_worse_and_ends_near_the_baseline_is_not_confirmed():
    """Udacity's denoising autoencoder whose loss targets its own noisy input: a sigmoid output
    over [0, 1] targets is right, yet without it the copy starts at 0.43 (against 0.16) and falls
    to 0.063, near the baseline's 0.081. Judged by its own start it "learned"; against the
    baseline's scale it gained 0.11 of the start, not the 0.2 a confirmation needs."""
    gen = torch.Generator().manual_seed(0)
    clean = (torch.rand(20, 1, 8, 8, generator=gen) > 0.7).float()
    noisy = (clean + 0.5 * torch.randn(clean.shape, generator=gen)).clamp(0, 1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1), nn.Sigmoid())
    result = interventions(model, (noisy, noisy), nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters()))
    assert result.baseline_final_loss > 0.5 * result.baseline_initial_loss  # the baseline counts as stuck
    assert _statuses(result).get("WRONG_OUTPUT_ACTIVATION") != "confirmed"


def test_non_negative_targets_out_of_a_sigmoids_reach_are_scaled_to_its_range():
    """Udacity's denoising autoencoder given raw 0..255 pixels as its targets, its input scaled:
    standardised targets (mean 0, std 1) stay out of the sigmoid's reach below zero, so that
    remedy showed nothing, while removing the sigmoid did. Targets none of which is negative are
    scaled to [0, 1] instead, which a sigmoid reaches."""
    gen = torch.Generator().manual_seed(0)
    clean = (torch.rand(32, 64, generator=gen) > 0.6).float() * torch.rand(32, 64, generator=gen)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64), nn.Sigmoid())
    result = interventions(model, (clean, clean * 255), nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters()))
    assert _statuses(result)["UNNORMALIZED_TARGETS"] == "confirmed"
    from nndx.collector import remedies

    signed = remedies.Setup(model=model, optimizer=None, inputs=clean, targets=clean * 255 - 100, loss_fn=nn.MSELoss())
    assert float(remedies.standardize_targets(signed).targets.min()) < 0  # signed targets: standardised


class _Shrink(nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return 1e-9 * z


def test_a_remedy_that_did_not_help_says_nothing_where_no_run_could_learn():
    """Outputs shrunk to ~0 before a sigmoid: no run moves the loss, the sigmoid removed or the LR
    10-1000x either way. 'Not confirmed' there would count against causes the experiment could
    not have shown (loeber's CNN with a ReLU on its logits, SGD at 1e-3 on batches of 4); where a
    run learns, a remedy that did not help keeps its verdict."""
    x, y = _data()
    model = _mlp(0, _Shrink(), nn.Sigmoid())
    result = interventions(model, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    statuses = _statuses(result)
    assert statuses.get("WRONG_OUTPUT_ACTIVATION") == "inconclusive", result
    assert "not_confirmed" not in statuses.values() and "confirmed" not in statuses.values(), statuses
    assert all("no run of this experiment learned" in r.message for r in result.results)
    slow = _mlp(0)
    result = interventions(slow, (x, y), nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(slow.parameters(), lr=1e-4))
    assert _statuses(result) == {"LR_TOO_HIGH": "not_confirmed", "LR_TOO_LOW": "confirmed"}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_chance_level_of_a_summed_loss_is_not_one_samples(reduction):
    """d2l's GAN sums its BCE over the batch (reduction='sum'): 11.09 for 16 samples at chance. Read
    against ln 2 as the chance level, a baseline that fell to 5.03 'did not learn' (7x chance) and the
    lr x 10 remedy that fitted the batch was an error-level LR_TOO_LOW; against where it started it
    learned 55% of its way down."""
    model = nn.Linear(2, 1)
    chance = interventions_module._chance_loss(model, torch.randn(16, 2), nn.BCEWithLogitsLoss(reduction=reduction))
    assert chance == (pytest.approx(math.log(2)) if reduction == "mean" else None)
