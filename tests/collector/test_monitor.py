"""The Monitor in small real training loops: each loop bug is seen in the report, and
the same model trained correctly shows none of it."""

import copy
import math

import pytest
import torch
from torch import nn

import nndx
from nndx.collector.watch import History as _History
from nndx.collector import stats as stats_module
from nndx.collector.watch import base as base_module
from nndx.collector.watch import layers as layers_module
from nndx.collector.watch import loop as loop_module
from nndx.integrations.monitor import Monitor, TrainingFailure, watch
from nndx.report import CauseCode, DiagnosticReport, Finding

STEPS = 6


def make_model(dropout: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(0.5))
    layers.append(nn.Linear(16, 3))
    return nn.Sequential(*layers)


def batch(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def train(model, optimizer, mon, steps=STEPS, *, zero_grad=True, loss_fn=None, clip=None, x=None, y=None):
    """A correct loop unless told otherwise."""
    x0, y0 = batch()
    x = x0 if x is None else x
    y = y0 if y is None else y
    loss_fn = loss_fn or nn.functional.cross_entropy
    for _ in range(steps):
        if zero_grad:
            optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        mon.log(loss)
    return mon.report()


def monitored(model=None, lr=0.1, **options):
    model = model or make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return model, optimizer, Monitor(model, optimizer, **options)


# ---------------------------------------------------------------- lifecycle


def hook_count(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    return (
        sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        + sum(len(p._backward_hooks or {}) for p in model.parameters())
        + len(optimizer._optimizer_step_pre_hooks)
        + len(optimizer._optimizer_step_post_hooks)
        + ("zero_grad" in optimizer.__dict__)
        + ("zero_grad" in model.__dict__)
    )


def test_hooks_removed_on_exit_and_training_is_bit_identical():
    bare = make_model(dropout=True)
    watched = copy.deepcopy(bare)
    # SGD with momentum and weight decay: optimizer state to compare (Adam's first step
    # imports torch._dynamo, ~10 s on a loaded machine)
    bare_opt = torch.optim.SGD(bare.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-3)
    watched_opt = torch.optim.SGD(watched.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-3)
    x, y = batch()
    torch.manual_seed(5)
    for _ in range(STEPS):
        bare_opt.zero_grad()
        nn.functional.cross_entropy(bare(x), y).backward()
        nn.utils.clip_grad_norm_(bare.parameters(), 0.5)
        bare_opt.step()
    torch.manual_seed(5)
    with Monitor(watched, watched_opt, every=1, loss_fn=nn.CrossEntropyLoss()) as mon:
        assert hook_count(watched, watched_opt) > 0
        for _ in range(STEPS):
            watched_opt.zero_grad()
            loss = mon.loss_fn(watched(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(watched.parameters(), 0.5)
            watched_opt.step()
            mon.log(loss)
    assert hook_count(watched, watched_opt) == 0
    assert mon.closed
    for (name, a), b in zip(bare.state_dict().items(), watched.state_dict().values()):
        assert torch.equal(a, b), name
    sa, sb = bare_opt.state_dict()["state"], watched_opt.state_dict()["state"]
    assert sa and all(torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]) for k in sa)
    # the class methods are back, not a stale wrapper
    assert watched_opt.zero_grad.__func__ is torch.optim.SGD.zero_grad
    assert watched.zero_grad.__func__ is nn.Module.zero_grad


def test_monitor_leaves_rng_untouched():
    model, opt, mon = monitored(every=1, loss_fn=nn.CrossEntropyLoss())
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    train(model, opt, mon, loss_fn=mon.loss_fn)
    mon.close()
    assert torch.equal(torch.rand(3), expected)


def test_watch_is_a_started_monitor_and_close_is_idempotent():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = watch(model, opt, every=2)
    assert isinstance(mon, Monitor) and hook_count(model, opt) > 0
    report = train(model, opt, mon, steps=3)
    mon.close()
    mon.close()
    assert hook_count(model, opt) == 0
    assert report.loop.steps == 3
    assert mon.report().run.finished_at is not None
    assert nndx.Monitor is Monitor and nndx.watch is watch and nndx.TrainingFailure is TrainingFailure


def test_bad_arguments_are_clear_errors():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="nn.Module"):
        Monitor(object(), opt)
    with pytest.raises(TypeError, match="Optimizer"):
        Monitor(model, object())
    with pytest.raises(ValueError, match="every"):
        Monitor(model, opt, every=0)
    with pytest.raises(ValueError, match="stop_on"):
        Monitor(model, opt, stop_on="sometimes")
    assert hook_count(model, opt) == 0  # nothing attached by a failed construction
    with Monitor(model, opt) as mon:
        with pytest.raises(ValueError, match="scalar"):
            mon.log(torch.ones(3))
        with pytest.raises(TypeError, match="number"):
            mon.log("low")
        with pytest.raises(ValueError, match="split"):
            mon.log(1.0, split="")


def test_a_failing_hook_is_recorded_and_training_goes_on(monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("snapshot exploded")

    monkeypatch.setattr(layers_module, "snapshot_parameters", broken)
    model, opt, mon = monitored(every=1)
    report = train(model, opt, mon)
    mon.close()
    assert report.loop.steps == STEPS  # the loop ran to the end
    assert report.errors and report.errors[0].source == "monitor.step_pre"
    assert "snapshot exploded" in report.errors[0].message


@pytest.mark.parametrize("every", [1, 5])
def test_values_are_fetched_from_the_device_once_per_recorded_step(monkeypatch, every):
    """On a GPU every fetch stalls the stream: the layer statistics, the parameter norms,
    the losses, gradient norms and LRs of a recorded step (and of the unrecorded steps
    before it) come back in one fetch, live alerts and the wrapped loss included.
    bench/gpu.py counts the synchronisations themselves on a GPU."""
    fetches, resolved = [], []
    real_fetch, real_resolve = base_module.fetch, stats_module.Pending.resolve
    monkeypatch.setattr(base_module, "fetch", lambda tensors: fetches.append(mon.ctx.step) or real_fetch(tensors))
    monkeypatch.setattr(stats_module.Pending, "resolve", lambda self: resolved.append(1) or real_resolve(self))
    model, opt, mon = monitored(every=every, alert_every=5, loss_fn=nn.CrossEntropyLoss())
    x, y = batch()
    for _ in range(20):
        opt.zero_grad()
        loss = mon.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        mon.log(loss)
    assert fetches == list(range(0, 20, every)) and resolved == []
    report = mon.report()
    mon.close()
    assert len({layer.step for layer in report.layers}) == 20 // every  # every recorded step arrived
    assert len(report.loss_history["train"]) == 20  # the last loss, logged after the last step, too
    assert mon.findings == []


def test_frozen_weights_are_read_for_the_full_report_not_for_each_live_check(monkeypatch):
    """frozen_at_init is a pass over every frozen weight (a whole backbone) and a fetch;
    no live rule reads it, so the live checks' windowed reports skip it."""
    calls = []
    real = loop_module.frozen_at_init
    monkeypatch.setattr(loop_module, "frozen_at_init", lambda model: calls.append(1) or real(model))
    model = make_model()
    model[0].requires_grad_(False)
    model, opt, mon = monitored(model, every=1, alert_every=5)
    train(model, opt, mon, steps=20)  # 4 live checks, then the full report
    assert len(calls) == 1
    assert mon.report().loop.frozen_checked == 1 and len(calls) == 2


# ---------------------------------------------------------------- counting: steps, backward, zero_grad


def test_correct_loop_counts_one_backward_and_one_reset_per_step():
    model, opt, mon = monitored()
    loop = train(model, opt, mon).loop
    assert (loop.steps, loop.backward_calls, loop.zero_grad_calls, loop.forward_calls) == (STEPS,) * 4
    assert loop.params_not_in_optimizer == [] and loop.optimizer_params_not_in_model == 0
    assert loop.params_grad_none == [] and loop.frozen_params == []
    assert loop.no_grad_forwards_in_train_mode == 0
    assert all(p.after_clip is None for p in loop.grad_norm_history)
    assert len(loop.grad_norm_history) == STEPS
    mon.close()


def test_missing_zero_grad_counts_no_reset():
    model, opt, mon = monitored()
    loop = train(model, opt, mon, zero_grad=False).loop
    assert loop.steps == STEPS and loop.backward_calls == STEPS
    assert loop.zero_grad_calls == 0
    # the gradients really accumulated: the global norm grows step over step
    norms = [p.before_clip for p in loop.grad_norm_history]
    assert norms[-1] > 2 * norms[0]
    mon.close()


def test_deliberate_accumulation_k4_is_told_apart():
    model, opt, mon = monitored()
    x, y = batch()
    for _ in range(3):
        opt.zero_grad()
        for micro in range(4):
            (nn.functional.cross_entropy(model(x[micro::4]), y[micro::4]) / 4).backward()
        opt.step()
    loop = mon.report().loop
    mon.close()
    assert loop.steps == 3 and loop.backward_calls == 12 and loop.zero_grad_calls == 3
    assert loop.backward_calls / loop.zero_grad_calls == 4
    assert loop.backward_since_reset_at_steps == 12


@pytest.mark.parametrize("reset", ["zero_grad", "set_to_none"])
def test_an_attacks_backward_passes_reset_before_the_step_are_no_accumulation(reset):
    """PGD adversarial training (locuslab/robust_overfitting): seven backward passes through
    the model per batch find the perturbation, then the gradients are reset and the training
    loss's one backward is the one the step applies."""
    from nndx.rules import diagnose

    model, opt, mon = monitored()
    x, y = batch()
    for _ in range(STEPS):
        delta = torch.zeros_like(x, requires_grad=True)
        for _ in range(7):
            nn.functional.cross_entropy(model(x + delta), y).backward()
            delta.data = (delta + 0.01 * delta.grad.sign()).clamp(-0.1, 0.1)
            delta.grad.zero_()
        if reset == "zero_grad":
            opt.zero_grad()
        else:
            for p in model.parameters():
                p.grad = None
        nn.functional.cross_entropy(model(x + delta.detach()), y).backward()
        opt.step()
    report = mon.report()
    mon.close()
    assert report.loop.backward_calls == 8 * STEPS and report.loop.backward_since_reset_at_steps <= STEPS
    assert "NNDX302" not in {f.rule_id for f in diagnose(report).findings}


@pytest.mark.parametrize("reset", ["set_to_none", "zero_"])
def test_gradients_reset_by_hand_count_as_resets(reset):
    model, opt, mon = monitored()
    x, y = batch()
    for _ in range(STEPS):
        for p in model.parameters():
            if reset == "set_to_none":
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    loop = mon.report().loop
    mon.close()
    # the first reset happens before any gradient exists and cannot be seen
    assert loop.zero_grad_calls == STEPS - 1


def test_gradients_changed_in_place_are_no_reset_when_the_step_is_skipped():
    """A GradScaler's unscale_ (or clipping) changes the gradients in place; when the
    scaler then skips optimizer.step() (inf gradients), that is no gradient reset."""
    model, opt, mon = monitored()
    x, y = batch()
    with mon:
        for _ in range(10):
            nn.functional.cross_entropy(model(x), y).backward()
            for p in model.parameters():
                p.grad.mul_(0.5)  # unscale_, then the skipped step
    assert mon.report().loop.zero_grad_calls == 0
    model, opt, mon = monitored()
    with mon:
        for _ in range(10):
            nn.functional.cross_entropy(model(x), y).backward()
            for p in model.parameters():
                p.grad.zero_()
    assert mon.report().loop.zero_grad_calls == 9


def test_optimizer_and_model_zero_grad_in_one_step_count_once():
    model, opt, mon = monitored()
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert mon.report().loop.zero_grad_calls == STEPS
    mon.close()


# ---------------------------------------------------------------- parameters: optimizer, grads, frozen


def test_optimizer_over_another_models_parameters():
    model = make_model()
    other = make_model()
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        loop = train(model, opt, mon).loop
    assert loop.params_not_in_optimizer == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert loop.optimizer_params_not_in_model == 4


class Branchy(nn.Module):
    def __init__(self, detach: bool):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(8, 16)
        self.side = nn.Linear(8, 16)
        self.head = nn.Linear(16, 3)
        self.unused = nn.Linear(16, 3)
        self.detach = detach

    def forward(self, x):
        side = self.side(x)
        if self.detach:
            side = side.detach()
        return self.head(torch.relu(self.trunk(x) + side))


def test_detached_branch_and_unused_parameters_have_grad_none():
    model = Branchy(detach=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        loop = train(model, opt, mon).loop
    assert loop.params_grad_none == ["side.weight", "side.bias", "unused.weight", "unused.bias"]


def test_attached_branch_has_no_grad_none():
    model = Branchy(detach=False)
    del model.unused
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        loop = train(model, opt, mon).loop
    assert loop.params_grad_none == []


def test_frozen_parameters_listed():
    model = make_model()
    model[0].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with Monitor(model, opt) as mon:
        loop = train(model, opt, mon).loop
    assert loop.frozen_params == ["0.weight", "0.bias"]
    assert loop.params_not_in_optimizer == []  # frozen parameters are not "trainable"
    assert loop.trainable_param_count == 16 * 3 + 3
    assert loop.frozen_at_init == ["0.weight"]  # frozen straight after construction: never trained


class Unregistered(nn.Module):
    """Three ways a trained tensor escapes model.parameters(), and one that is meant to."""

    def __init__(self, hide: bool):
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.head = nn.Linear(16, 3)
        self.blocks = [nn.Linear(16, 16)] if hide else nn.ModuleList([nn.Linear(16, 16)])
        gate = nn.Parameter(torch.ones(16))
        self.gate = gate.clone() if hide else gate  # nn.Parameter(...).to("cuda") keeps such a copy
        self.ema = [nn.Linear(16, 16)]  # an EMA copy hidden on purpose: used without a graph

    def forward(self, x):
        h = torch.relu(self.first(x)) * self.gate
        with torch.no_grad():
            self.ema[0](h)
        return self.head(torch.relu(self.blocks[0](h)))


def test_tensors_that_get_gradients_outside_the_parameters_and_every_optimizer_are_named():
    model = Unregistered(hide=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        loop = train(model, opt, mon).loop
    assert sorted(loop.unregistered_params) == ["blocks[0].bias", "blocks[0].weight", "gate"]
    assert loop.params_not_in_optimizer == []  # nothing registered is missing from the optimizer

    registered = Unregistered(hide=False)
    opt = torch.optim.SGD(registered.parameters(), lr=0.1)
    with Monitor(registered, opt) as mon:
        assert train(registered, opt, mon).loop.unregistered_params == []
    # handed to the optimizer by hand: trained, so not named
    hidden = Unregistered(hide=True)
    gate = hidden.gate.grad_fn.next_functions[0][0].variable  # the Parameter behind the copy
    extra = [p for block in hidden.blocks for p in block.parameters()] + [gate]
    opt = torch.optim.SGD([*hidden.parameters(), *extra], lr=0.1)
    with Monitor(hidden, opt) as mon:
        assert train(hidden, opt, mon).loop.unregistered_params == []


# ---------------------------------------------------------------- eval in train mode


def evaluate(model, mon, context):
    x, _ = batch()
    with context():
        model(x)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_evaluation_in_train_mode_with_dropout_is_counted(context):
    model, opt, mon = monitored(make_model(dropout=True))
    train(model, opt, mon, steps=2)
    evaluate(model, mon, context)  # forgot model.eval()
    evaluate(model, mon, context)
    loop = mon.report().loop
    mon.close()
    assert loop.no_grad_forwards_in_train_mode == 2 and loop.has_dropout


def test_no_grad_forwards_inside_every_step_are_the_algorithm_not_a_forgotten_eval():
    """MixMatch guesses labels, FixMatch pseudo-labels, with the model itself under no_grad in
    train mode, inside every step: by design, info. Evaluation forgotten in train mode runs at a
    few steps (each epoch's end): a warning."""
    import nndx

    def run(guess_every: int):
        model, opt, mon = monitored(make_model(dropout=True), every=5)
        x, y = batch()
        for step in range(20):
            if step % guess_every == 0:
                with torch.no_grad():
                    model(x)  # label guessing, or (every 10th step) a validation pass
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            mon.log(torch.tensor(1.0 - step / 40))
        report = mon.report()
        mon.close()
        return report, next((f for f in nndx.diagnose(report).findings if f.rule_id == "NNDX306"), None)

    guessed, finding = run(guess_every=1)
    assert guessed.loop.no_grad_forwards_in_train_mode == 20 and guessed.loop.no_grad_train_forward_steps == 20
    assert finding.severity == "info"
    evaluated, finding = run(guess_every=10)
    assert evaluated.loop.no_grad_train_forward_steps == 2 and finding.severity == "warning"


def test_evaluation_in_eval_mode_or_without_dropout_is_not_counted():
    model, opt, mon = monitored(make_model(dropout=True))
    train(model, opt, mon, steps=2)
    model.eval()
    evaluate(model, mon, torch.no_grad)
    model.train()
    assert mon.report().loop.no_grad_forwards_in_train_mode == 0
    mon.close()
    model, opt, mon = monitored(make_model(dropout=False))
    train(model, opt, mon, steps=2)
    evaluate(model, mon, torch.no_grad)  # train mode, but nothing in the model cares
    loop = mon.report().loop
    mon.close()
    assert loop.no_grad_forwards_in_train_mode == 0 and not loop.has_dropout
    # DeepCTR-Torch's default nn.Dropout(0) drops nothing: train mode does not matter either
    model, opt, mon = monitored(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 3)))
    train(model, opt, mon, steps=2)
    evaluate(model, mon, torch.no_grad)
    loop = mon.report().loop
    mon.close()
    assert loop.no_grad_forwards_in_train_mode == 0 and not loop.has_dropout


def test_batchnorm_without_running_statistics_is_the_same_in_either_mode():
    """Reptile's BatchNorm(track_running_stats=False) normalises by the batch in train and eval mode
    alike and keeps no statistics to move: evaluating without model.eval() changes nothing."""
    for tracking, counted in ((False, 0), (True, 1)):
        model, opt, mon = monitored(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16, track_running_stats=tracking),
                                                  nn.ReLU(), nn.Linear(16, 3)))  # fmt: skip
        train(model, opt, mon, steps=2)
        evaluate(model, mon, torch.no_grad)
        loop = mon.report().loop
        mon.close()
        assert loop.no_grad_forwards_in_train_mode == counted and loop.has_batchnorm is tracking


def test_training_after_eval_without_train_is_counted_from_its_first_step():
    model, opt, mon = monitored(make_model(dropout=True))
    train(model, opt, mon, steps=3)
    model.eval()  # validation, and model.train() never called back
    evaluate(model, mon, torch.no_grad)
    train(model, opt, mon, steps=4)
    loop = mon.report().loop
    mon.close()
    assert loop.backward_after_eval_forward == 4 and loop.backward_calls == 7
    assert loop.first_eval_backward_step == 3


def test_training_in_train_mode_is_not_counted_whatever_runs_in_eval_mode():
    # validation in eval mode without no_grad, then model.train() back: the backward passes follow
    # train-mode forwards; a frozen batch-norm inside a training model; a model whose mode changes nothing
    model, opt, mon = monitored(make_model(dropout=True))
    for _ in range(3):
        train(model, opt, mon, steps=2)
        model.eval()
        model(batch()[0])
        model.train()
    assert mon.report().loop.backward_after_eval_forward == 0
    mon.close()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    model[1].eval()
    model, opt, mon = monitored(model)
    train(model, opt, mon, steps=3)
    assert mon.report().loop.backward_after_eval_forward == 0
    mon.close()
    model, opt, mon = monitored(make_model(dropout=False))
    model.eval()
    train(model, opt, mon, steps=3)
    loop = mon.report().loop
    mon.close()
    assert loop.backward_after_eval_forward == 0 and loop.backward_calls == 3


def test_a_forward_called_directly_still_tells_the_mode():
    """barlowtwins' main.py trains with ``loss = model.forward(y1, y2)``: the model's own hooks
    never fire, its layers' do, and model.eval() without model.train() back is still seen."""
    model, opt, mon = monitored(make_model(dropout=True))
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model.forward(x), y).backward()
        opt.step()

    step()
    model.eval()
    step()
    step()
    loop = mon.report().loop
    mon.close()
    assert loop.backward_after_eval_forward == 2 and loop.backward_calls == 3
    # a layer frozen in eval mode inside a training model, called the same way: not counted
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    model[1].eval()
    model, opt, mon = monitored(model)
    step()
    step()
    assert mon.report().loop.backward_after_eval_forward == 0
    mon.close()


# ---------------------------------------------------------------- LR, clipping, inputs


def test_lr_history_shows_a_scheduler_collapsing_the_lr():
    model, opt, mon = monitored(lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)  # stepped per batch
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        scheduler.step()
    lrs = [p.lrs[0] for p in mon.report().loop.lr_history]
    mon.close()
    assert lrs[0] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.1 * 0.1 ** (STEPS - 1))
    model, opt, mon = monitored(lr=0.1)
    healthy = [p.lrs[0] for p in train(model, opt, mon).loop.lr_history]
    mon.close()
    assert healthy == [pytest.approx(0.1)] * STEPS


def test_lr_of_each_param_group_recorded():
    model = make_model()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1}, {"params": model[2].parameters(), "lr": 0.01}])
    with Monitor(model, opt) as mon:
        loop = train(model, opt, mon, steps=2).loop
    assert [p.lrs for p in loop.lr_history] == [[0.1, 0.01], [0.1, 0.01]]


def test_workspace_is_reused_not_grown_and_freed_on_close():
    model, opt, mon = monitored()
    train(model, opt, mon, steps=2)
    kept = mon.workspace_bytes
    assert kept > 0
    train(model, opt, mon, steps=10)
    assert mon.workspace_bytes == kept
    mon.close()
    assert mon.workspace_bytes == 0


def test_workspace_follows_the_shapes_of_the_newest_step():
    # variable batch (or sequence) lengths: buffers of shapes no longer seen are dropped
    model, opt, mon = monitored()
    x, y = batch()
    train(model, opt, mon, steps=1, x=x, y=y)
    full = mon.workspace_bytes
    train(model, opt, mon, steps=1, x=x[:2], y=y[:2])
    small = mon.workspace_bytes
    train(model, opt, mon, steps=1, x=x[:2], y=y[:2])
    mon.close()
    assert 0 < small < full and mon.report().layers[-1].activation is not None


def test_gradient_norm_measured_on_recorded_steps_only_with_clipping_seen_there():
    # the norm is a pass over every gradient: with every=3 it is read where the layers are
    model, opt, mon = monitored(every=3)
    report = train(model, opt, mon, steps=7, clip=0.01)
    mon.close()
    recorded = sorted({layer.step for layer in report.layers})
    assert recorded == [0, 3, 6]
    assert [p.step for p in report.loop.grad_norm_history] == recorded
    assert all(p.after_clip == pytest.approx(0.01, rel=1e-3) and p.before_clip > 0.05 for p in report.loop.grad_norm_history)
    assert len(report.loop.lr_history) == len(report.loop.input_norm_history) == 7  # these stay per step


def test_user_clipping_seen_as_norm_before_and_after():
    model, opt, mon = monitored()
    loop = train(model, opt, mon, clip=0.01).loop
    mon.close()
    assert all(p.after_clip is not None for p in loop.grad_norm_history)
    assert all(p.after_clip == pytest.approx(0.01, rel=1e-3) for p in loop.grad_norm_history)
    assert all(p.before_clip > 0.05 for p in loop.grad_norm_history)
    # clipping with a threshold that is never reached changes nothing and is not reported
    model, opt, mon = monitored()
    loop = train(model, opt, mon, clip=1e6).loop
    mon.close()
    assert all(p.after_clip is None for p in loop.grad_norm_history)


@pytest.mark.parametrize("clip", [None, 0.1, 1e-4])
def test_a_grad_scalers_loss_scale_is_taken_out_of_the_norm_before_clipping(clip):
    """Under GradScaler, backward leaves gradients x65536 and ``scaler.step`` (or ``unscale_``)
    divides them back before the step: the norm at backward is reported in the loss's own units,
    so a mild clip is not read as clipping by 2**-16 — and a far too small one still is."""
    from nndx.rules import diagnose

    model, opt, mon = monitored()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    x, y = batch()
    with mon:
        for _ in range(8):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if clip is not None:
                scaler.unscale_(opt)
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(opt)
            scaler.update()
            mon.log(loss)
    report = mon.report()
    history = report.loop.grad_norm_history
    assert len(history) == 8 and all(0.01 < p.before_clip < 100 for p in history)  # unscaled: not ~1e4
    for point in history:  # unscaling alone is no clipping
        assert point.after_clip == (None if clip is None or point.before_clip < clip else pytest.approx(clip, rel=1e-3))
    fired = {f.rule_id for f in diagnose(report).findings}
    assert ("NNDX308" in fired) == (clip == 1e-4)


def test_zero_batches_show_in_the_input_norm_history():
    model, opt, mon = monitored()
    x, y = batch()
    for step in range(STEPS):
        opt.zero_grad()
        inputs = torch.zeros_like(x) if step % 2 else x
        nn.functional.cross_entropy(model(inputs), y).backward()
        opt.step()
    norms = [p.value for p in mon.report().loop.input_norm_history]
    mon.close()
    assert [n == 0.0 for n in norms] == [False, True] * (STEPS // 2)
    assert all(n > 1 for n in norms[::2])


# ---------------------------------------------------------------- the loss function


def loss_calls(loss_fn, output_transform=lambda out: out, target_transform=lambda y: y, out_features=3):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, out_features))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    with Monitor(model, opt, loss_fn=loss_fn) as mon:
        for _ in range(3):
            opt.zero_grad()
            mon.loss_fn(output_transform(model(x)), target_transform(y)).backward()
            opt.step()
    return mon.report().loop.loss_calls


def test_mse_with_n1_output_against_n_target_is_recorded():
    with pytest.warns(UserWarning):  # torch warns once, and training still goes on silently
        (call,) = loss_calls(nn.MSELoss(), target_transform=lambda y: y.float(), out_features=1)
    assert call.loss_type == "MSELoss" and call.output_shape == [32, 1] and call.target_shape == [32]
    assert call.calls == 3
    (healthy,) = loss_calls(nn.MSELoss(), lambda out: out.squeeze(1), lambda y: y.float(), out_features=1)
    assert healthy.output_shape == healthy.target_shape == [32]


def test_float_targets_to_cross_entropy_are_recorded():
    (call,) = loss_calls(nn.CrossEntropyLoss(), target_transform=lambda y: nn.functional.one_hot(y, 3).float())
    assert call.target_dtype == "float32" and call.target_shape == [32, 3]
    (healthy,) = loss_calls(nn.CrossEntropyLoss())
    assert healthy.target_dtype == "int64" and healthy.target_shape == [32]


def test_softmax_before_cross_entropy_looks_like_probabilities():
    (call,) = loss_calls(nn.CrossEntropyLoss(), lambda out: out.softmax(dim=1))
    assert call.output_rows_sum_to_one is True
    assert 0.0 <= call.output_min and call.output_max <= 1.0
    (healthy,) = loss_calls(nn.CrossEntropyLoss())
    assert healthy.output_rows_sum_to_one is False


def test_functional_loss_named_like_its_module():
    (call,) = loss_calls(nn.functional.cross_entropy)
    assert call.loss_type == "CrossEntropyLoss"


# ---------------------------------------------------------------- losses, layers, parameters


def test_losses_per_split_with_nonfinite_kept_and_json_round_trip():
    model, opt, mon = monitored()
    train(model, opt, mon, steps=3)
    mon.log(torch.tensor(0.5), split="val", accuracy=torch.tensor(0.75))
    mon.log(float("nan"))
    mon.log(torch.tensor(float("inf")), split="val", accuracy=0.1)
    report = mon.report()
    mon.close()
    train_losses = report.loss_history["train"]
    assert [p.step for p in train_losses] == [0, 1, 2, 2]
    assert all(math.isfinite(p.value) for p in train_losses[:3]) and math.isnan(train_losses[3].value)
    val = report.loss_history["val"]
    assert [(p.step, p.value, p.accuracy) for p in val[:1]] == [(2, 0.5, 0.75)]
    assert math.isinf(val[1].value)
    back = DiagnosticReport.model_validate_json(report.model_dump_json())
    assert math.isnan(back.loss_history["train"][3].value) and math.isinf(back.loss_history["val"][1].value)
    assert back.loop == report.loop


def test_layer_and_parameter_statistics_every_n_steps():
    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = make_model()
            self.spare = nn.Linear(2, 2)  # never runs and is in no optimizer: no grad, no update

        def forward(self, x):
            return self.net(x)

    model = WithSpare()
    opt = torch.optim.SGD(model.net.parameters(), lr=0.1)
    with Monitor(model, opt, every=3) as mon:
        report = train(model, opt, mon, steps=7)
    assert sorted({s.step for s in report.layers}) == [0, 3, 6]
    assert {s.name for s in report.layers} == {"net.0", "net.1", "net.2"}  # spare never ran
    assert all(s.activation is not None and s.gradient is not None for s in report.layers)
    by_name = {p.name: p for p in report.parameters if p.step == 3}
    assert by_name["net.0.weight"].update_ratio > 0 and by_name["net.0.weight"].grad_norm > 0
    assert by_name["spare.weight"].update_ratio == 0 and by_name["spare.weight"].grad_norm is None
    assert report.model.layers and report.model.last_layer == "Linear"
    assert report.run.torch_version == torch.__version__ and report.run.dtype == "float32"


def test_history_is_bounded_evenly_spread_and_keeps_nan():
    history = _History(capacity=16)
    for i in range(1000):
        history.append(i, pinned=(i == 333))
    values = history.values()
    assert len(values) <= 16 + 2 + 1
    assert values[0] == 0 and values[-1] == 999 and 333 in values
    regular = [v for v in values[:-1] if v != 333]
    gaps = {b - a for a, b in zip(regular, regular[1:])}
    assert len(gaps) == 1  # one stride: evenly spread
    small = _History(capacity=16)
    for i in range(10):
        small.append(i)
    assert small.values() == list(range(10))  # nothing dropped below capacity


def test_long_runs_keep_bounded_histories():
    model, opt, mon = monitored(every=1, history_size=8, layer_history_size=4)
    report = train(model, opt, mon, steps=30)
    mon.close()
    loop = report.loop
    assert len(loop.lr_history) <= 10 and loop.lr_history[0].step == 0 and loop.lr_history[-1].step == 29
    assert len(report.loss_history["train"]) <= 10
    assert len({s.step for s in report.layers}) <= 6
    assert loop.steps == 30


def test_training_failure_carries_findings():
    finding = Finding(rule_id="X1", code=CauseCode.LR_TOO_HIGH, severity="error", title="t", symptom="s", fix="f", step=4)
    error = TrainingFailure([finding])
    assert error.finding is finding and "LR_TOO_HIGH at step 4" in str(error)


def test_closure_step_backward_inside_optimizer_step_is_seen():
    # LBFGS and Lightning run forward and backward inside optimizer.step(closure)
    model, opt, mon = monitored()
    x, y = batch()

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(STEPS):
        mon.log(opt.step(closure))
    loop = mon.report().loop
    mon.close()
    assert (loop.steps, loop.backward_calls, loop.zero_grad_calls) == (STEPS,) * 3
    assert loop.backward_calls_in_step == STEPS  # inside optimizer.step(closure): not accumulation
    assert [p.step for p in loop.grad_norm_history] == list(range(STEPS))
    assert all(p.before_clip > 0 and p.after_clip is None for p in loop.grad_norm_history)


def test_two_monitors_closed_out_of_order_leave_the_model_clean():
    model, opt, first = monitored()
    second = Monitor(model, opt)
    train(model, opt, first, steps=2)
    first.close()
    train(model, opt, second, steps=2)
    second.close()
    assert hook_count(model, opt) == 0
    assert second.report().loop.zero_grad_calls == 4 and first.report().loop.zero_grad_calls == 2


@pytest.mark.parametrize("clip", [None, 0.01])
def test_parameter_grad_norms_are_those_the_step_used(clip):
    model, opt, mon = monitored(every=1)
    report = train(model, opt, mon, steps=3, clip=clip)  # grads stay as the last step left them
    mon.close()
    last = {p.name: p for p in report.parameters if p.step == 2}
    for name, p in model.named_parameters():
        assert last[name].grad_norm == pytest.approx(torch.linalg.vector_norm(p.grad).item(), rel=1e-5)


def test_sampled_layer_statistics_estimate_the_whole_batch():
    x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))

    def one_step(max_elements):
        model = make_model()
        nn.init.constant_(model[0].bias[:8], -50.0)  # half the hidden units dead
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Monitor(model, opt, max_elements=max_elements) as mon:
            train(model, opt, mon, steps=1, x=x, y=y)
        return {s.name: s for s in mon.report().layers}

    exact, sampled = one_step(None), one_step(16 * 32)  # 32 of the 256 samples
    assert exact["1"].activation.dead_unit_fraction == sampled["1"].activation.dead_unit_fraction == 0.5
    for name in exact:
        ratio = sampled[name].gradient.norm / exact[name].gradient.norm
        assert 0.6 < ratio < 1.6, (name, ratio)  # scaled to the whole batch, not 1/sqrt(8) of it


def test_relu_on_logits_and_target_scale_are_seen_at_the_loss():
    (clipped,) = loss_calls(nn.CrossEntropyLoss(), lambda out: torch.relu(out))
    assert 0.2 < clipped.output_zero_fraction < 0.8 and clipped.output_min == 0.0
    (healthy,) = loss_calls(nn.CrossEntropyLoss())
    assert healthy.output_zero_fraction == 0.0 and healthy.target_mean is None  # integer targets: no scale
    (regression,) = loss_calls(nn.MSELoss(), lambda out: out.squeeze(1), lambda y: y.float() * 1000 + 5000, out_features=1)
    assert regression.target_mean == pytest.approx(5000 + 1000 * batch()[1].float().mean().item(), rel=1e-5)
    assert regression.target_std == pytest.approx(1000 * batch()[1].float().std().item(), rel=1e-5)


@pytest.mark.parametrize("mode", ["forgotten", "eval", "not_evaluation"])
def test_a_validation_loss_computed_in_train_mode_with_grad_enabled_is_seen(mode):
    """udacity's MNIST MLP validates with neither torch.no_grad() nor model.eval(): with model.eval()
    left out, its dropout drops units in every validation forward, and the no-grad count sees none of
    them. Forwards in train mode that no backward followed, then a loss logged as "val": counted. In
    eval mode, or logged under a split that is no evaluation (a GAN's "D"), nothing."""
    import nndx

    model, opt, mon = monitored(make_model(dropout=True), every=5)
    x, y = batch()
    for epoch in range(4):
        model.train()
        for _ in range(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            mon.log(loss)
        if mode == "eval":
            model.eval()
        val = sum(nn.functional.cross_entropy(model(x), y).item() for _ in range(3))
        mon.log(val / 3, split="D" if mode == "not_evaluation" else "val")
    report = mon.report()
    mon.close()
    found = {f.rule_id: f for f in nndx.diagnose(report).findings}
    if mode == "forgotten":
        assert report.loop.train_mode_evaluations == 4
        assert found["NNDX306"].severity == "warning" and found["NNDX306"].code.value == "EVAL_MODE_FORGOTTEN"
    else:
        assert report.loop.train_mode_evaluations == 0 and "NNDX306" not in found
