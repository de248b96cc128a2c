"""The Monitor on the loops people write (issue 14, class 3): no optimizer, several
models and optimizers, tuple/dict/ModelOutput outputs, token inputs, time-major
sequences; and the detectors whose evidence is the Monitor's (class 6): the autograd
graph kept across steps, no optimizer step, parameters that never change — each
firing on the broken loop and silent on healthy ones that look suspicious."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from _probe_models import train_under
from torch import nn

import nndx
from nndx.integrations.monitor import Monitor

STEPS = 12


def fired(report, rule_id):
    return [f for f in nndx.diagnose(report).findings if f.rule_id == rule_id]


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def data(n=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def hook_count(*objects):
    count = 0
    for obj in objects:
        if isinstance(obj, nn.Module):
            count += sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in obj.modules())
            count += sum(len(p._backward_hooks or {}) for p in obj.parameters())
        else:
            count += len(obj._optimizer_step_pre_hooks) + len(obj._optimizer_step_post_hooks)
        count += "zero_grad" in obj.__dict__
    return count


# ---------------------------------------------------------------- no optimizer: updates by hand


def manual_loop(mon, model, steps=STEPS, *, update="data", lr=0.1, accumulate=1, clip=None, skip=(), reset="zero_grad"):
    x, y = data()
    for i in range(steps):
        if i % accumulate == 0 and reset == "zero_grad":
            model.zero_grad()
        elif i % accumulate == 0:  # the gradients dropped by hand, with no call the Monitor hears
            for p in model.parameters():
                p.grad = None
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        mon.log(loss)
        if (i + 1) % accumulate:
            continue
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        for name, p in model.named_parameters():
            if p.grad is None or name.startswith(skip):
                continue
            if update == "data":  # the word-language-model example: no version bump
                p.data.add_(p.grad, alpha=-lr)
            elif update == "no_grad":
                with torch.no_grad():
                    p.sub_(lr * p.grad)


@pytest.mark.parametrize("update", ["data", "no_grad"])
def test_manual_updates_are_steps_with_update_ratios_and_an_unknown_lr(update):
    model = mlp()
    with Monitor(model, every=3) as mon:
        manual_loop(mon, model, update=update)
    report = mon.report()
    loop = report.loop
    assert report.errors == []
    assert (loop.steps, loop.backward_calls, loop.zero_grad_calls) == (STEPS, STEPS, STEPS)
    assert loop.optimizers == [] and loop.lr_history == []  # unknown, not 0
    assert any("no optimizer" in text for text in loop.limitations)
    assert sorted({p.step for p in report.parameters}) == [0, 3, 6, 9]
    assert all(p.update_ratio is not None and p.update_ratio > 0 for p in report.parameters)
    assert [p.step for p in loop.grad_norm_history] == [0, 3, 6, 9]
    assert [p.step for p in report.loss_history["train"]] == list(range(STEPS))
    assert loop.params_never_changed == []
    assert not fired(report, "NNDX321") and not fired(report, "NNDX322") and not fired(report, "NNDX301")


class BasicOptim:
    """fastbook's chapter 4 optimizer: no torch.optim.Optimizer, no state."""

    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    def step(self, *args, **kwargs):
        for p in self.params:
            p.data -= p.grad.data * self.lr

    def zero_grad(self, *args, **kwargs):
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize("zero_grad", [True, False])
def test_an_optimizer_of_the_users_own_class_is_watched_as_updates_by_hand(zero_grad):
    """fastbook's BasicOptim is no torch optimizer and holds none: the Monitor and the probes
    take it as a loop that updates by hand (a note says so) instead of refusing the run; its
    missing zero_grad is then seen like any other."""
    model = mlp()
    opt = BasicOptim(model.parameters(), 0.05)
    x, y = data()
    with Monitor(model, opt, every=3) as mon:
        for _ in range(STEPS):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            mon.log(loss)
            opt.step()
            if zero_grad:
                opt.zero_grad()
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=opt, monitor=mon, probes=["hooks"])
    assert report.errors == []
    assert report.loop.steps == STEPS
    assert any("BasicOptim is no torch.optim.Optimizer" in text for text in report.loop.limitations)
    assert any("BasicOptim is no torch.optim.Optimizer" in text for text in report.run.notes)
    codes = {f.code for f in nndx.diagnose(report).findings if f.severity != "info"}
    assert ("MISSING_ZERO_GRAD" in codes) is not zero_grad
    with pytest.raises(TypeError, match="optimizer must be"):
        Monitor(model, "sgd")


def test_manual_accumulation_and_clipping_are_seen():
    model = mlp()
    with Monitor(model, every=1) as mon:
        manual_loop(mon, model, accumulate=3, clip=0.01)
    loop = mon.report().loop
    assert loop.steps == STEPS // 3 and loop.backward_calls == STEPS and loop.zero_grad_calls == STEPS // 3
    assert loop.grad_norm_history and all(p.after_clip == pytest.approx(0.01, rel=1e-3) for p in loop.grad_norm_history)


@pytest.mark.parametrize("clip", [1e-4, 1e6])
def test_clipping_is_seen_when_the_loop_drops_the_gradients_by_hand(clip):
    """``p.grad = None`` before the next forward: by the time the Monitor hears the update the
    clipped gradients are gone, so ``clip_grad_norm_`` itself tells it (and is put back)."""
    original = torch.nn.utils.clip_grad_norm_
    model = mlp()
    with Monitor(model, every=1) as mon:
        manual_loop(mon, model, clip=clip, reset="none")
    assert torch.nn.utils.clip_grad_norm_ is original
    report = mon.report()
    history = report.loop.grad_norm_history
    assert len(history) >= STEPS - 1 and all(p.before_clip > 1e-3 for p in history)
    if clip == 1e-4:
        assert all(p.after_clip == pytest.approx(1e-4, rel=1e-2) for p in history)
        assert fired(report, "NNDX308")
    else:  # a threshold never reached clips nothing
        assert all(p.after_clip is None for p in history) and not fired(report, "NNDX308")


def test_monitors_closed_in_any_order_put_clip_grad_norm_back():
    original = torch.nn.utils.clip_grad_norm_
    for first_closed in (0, 1):
        monitors = [Monitor(mlp(seed), every=1) for seed in (0, 1)]
        assert torch.nn.utils.clip_grad_norm_ is not original
        monitors[first_closed].close()
        monitors[1 - first_closed].close()
        assert torch.nn.utils.clip_grad_norm_ is original


def test_manual_loop_without_any_update_fires_no_optimizer_step():
    model = mlp()
    with Monitor(model, every=5) as mon:
        manual_loop(mon, model, update="none")
    report = mon.report()
    assert report.loop.steps == 0 and report.loop.backward_calls == STEPS
    (finding,) = fired(report, "NNDX321")
    assert finding.severity == "error" and "0 parameter updates" in finding.symptom


def test_manual_loop_that_skips_parameters_is_seen():
    model = mlp()
    with Monitor(model, every=5) as mon:
        manual_loop(mon, model, skip=("0.",))  # forgets the first layer
    report = mon.report()
    assert report.loop.params_never_changed == ["0.weight", "0.bias"]
    (finding,) = fired(report, "NNDX322")
    assert finding.evidence["params_never_changed"] == ["0.weight", "0.bias"]


# ---------------------------------------------------------------- no optimizer step, parameters that never change


def optimizer_loop(mon, model, opt, steps=STEPS, *, step=True, zero_before_step=False):
    x, y = data()
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if zero_before_step:
            opt.zero_grad()  # the gradients are gone before the step
        if step:
            opt.step()
        mon.log(loss)


def test_optimizer_step_never_called_fires_live_and_in_the_report():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, every=5) as mon:
        optimizer_loop(mon, model, opt, step=False)
        assert mon.check_now()  # no step ever ends, so the live check runs by hand here
    report = mon.report()
    (finding,) = fired(report, "NNDX321")
    assert finding.code.value == "OPTIMIZER_NOT_CONNECTED" and "0 optimizer.step() calls" in finding.symptom
    assert "NNDX321" in {f.rule_id for f in mon.findings}


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation as davda54/sam writes it: a wrapper sharing its base optimizer's
    param groups, whose ``step`` asserts a closure it declares optional; the example's loop calls
    ``first_step`` / ``second_step`` and never ``step``."""

    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        norm = torch.norm(torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"] if p.grad is not None]))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["old_p"] = p.data.clone()
                    p.add_(p.grad * group["rho"] / (norm + 1e-12))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if "old_p" in self.state[p]:
                    p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure, but it was not provided"
        self.first_step(zero_grad=True)
        torch.enable_grad()(closure)()
        self.second_step()


@pytest.mark.parametrize("stepped", ["first_and_second_step", "step_with_closure"])
def test_an_optimizer_wrapper_stepped_through_its_inner_optimizer_counts_each_step_once(stepped):
    """davda54/sam's example never calls SAM.step(): its second_step calls base_optimizer.step().
    Hooked on the wrapper alone, 192 backward passes made "0 optimizer steps" (NNDX321, error) on a
    run that trained to 90%. Either way of stepping counts once per step, and nothing fires."""
    model = mlp()
    opt = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    x, y = data()
    with Monitor(model, opt, every=1) as mon:
        for _ in range(STEPS):
            if stepped == "first_and_second_step":
                nn.functional.cross_entropy(model(x), y).backward()
                opt.first_step(zero_grad=True)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.second_step(zero_grad=True)
            else:
                def closure():
                    value = nn.functional.cross_entropy(model(x), y)
                    value.backward()
                    return value

                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step(closure)
                opt.zero_grad()
            mon.log(loss)
    assert mon.steps == STEPS
    report = mon.report()
    assert report.loop.steps == STEPS and report.loop.backward_calls == 2 * STEPS
    assert not fired(report, "NNDX321")
    assert hook_count(opt, opt.base_optimizer) == 0  # every hook removed


def test_a_step_that_raised_does_not_swallow_the_steps_after_it():
    """A step that throws after its pre-hooks ran never reaches its post-hooks: another watched
    optimizer's steps after it still count (a GAN's, here one that keeps training)."""

    class Flaky(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("a step that fails once")

    model = mlp()
    flaky = Flaky(model[0].parameters(), lr=0.1)
    steady = torch.optim.SGD(model[2].parameters(), lr=0.1)
    x, y = data()
    with Monitor(model, [flaky, steady], every=1) as mon:
        nn.functional.cross_entropy(model(x), y).backward()
        with pytest.raises(RuntimeError):
            flaky.step()
        for _ in range(3):
            steady.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            steady.step()
    assert mon.steps == 3


def test_complex_parameters_are_a_limitation_not_an_exception():
    """FNO's SpectralConv1d keeps complex weights: every real-valued norm raised, and the Monitor
    refused to attach (in a script, an exception in the user's loop). The complex tensors are left
    out, said so, and the rest of the model is watched."""

    class Spectral(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = nn.Parameter(torch.randn(8, 8, 5, dtype=torch.cfloat) / 8)
            self.head = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mixed = torch.einsum("bix,iox->box", torch.fft.rfft(x), self.weights)
            return self.head(torch.fft.irfft(mixed, n=x.size(-1)).mean(-1))

    model = Spectral()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 8, 8), torch.randint(0, 3, (16,))
    with Monitor(model, opt, every=1) as mon:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            mon.log(loss)
    report = mon.report()
    assert report.errors == [] and report.loop.steps == STEPS
    assert any("complex" in line and "weights" in line for line in report.loop.limitations)
    assert {p.name for p in report.parameters} == {"head.weight", "head.bias"}


def test_the_mode_is_read_from_the_layers_whose_output_it_changes_not_from_the_root():
    """makemore part 3 evaluates after ``layer.training = False`` on each layer, never
    ``model.eval()``: its BatchNorms are in eval mode while the root's flag says train, and its
    no-grad evaluation is no forgotten eval(). The reverse, a root in eval with one BatchNorm put
    back in train mode, evaluates in train mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()

    def no_grad_forwards_in_train_mode(set_modes) -> int:
        with Monitor(model, opt, every=1) as mon:
            for _ in range(3):
                model.train()
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                set_modes()
                with torch.no_grad():
                    model(x)
        return mon.report().loop.no_grad_forwards_in_train_mode

    def layers_only():
        for layer in model:
            layer.training = False

    def one_batchnorm_back():
        model.eval()
        model[1].train()

    assert no_grad_forwards_in_train_mode(layers_only) == 0
    assert no_grad_forwards_in_train_mode(one_batchnorm_back) == 3


def test_parameters_behind_dead_units_are_unchanged_without_blaming_the_optimizer():
    """Behind a ReLU dead for every sample the gradients are exactly zero, so those
    parameters never move: the dead units are the cause (NNDX201), not an update that
    failed to reach them."""
    model = mlp()
    with torch.no_grad():
        model[0].bias.fill_(-50.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, every=5) as mon:
        optimizer_loop(mon, model, opt)
    report = mon.report()
    assert "0.weight" in report.loop.params_never_changed
    assert not fired(report, "NNDX322")
    assert fired(report, "NNDX201")


def test_gradients_zeroed_before_the_step_leave_every_parameter_unchanged():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Monitor(model, opt, every=5) as mon:
        optimizer_loop(mon, model, opt, zero_before_step=True)
    report = mon.report()
    assert report.loop.params_never_changed == [n for n, _ in model.named_parameters()]
    (finding,) = fired(report, "NNDX322")
    assert finding.severity == "error"
    assert not fired(report, "NNDX321")  # steps ran


class FrozenBackbone(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.backbone.requires_grad_(False)

    def forward(self, x):
        return self.head(self.backbone(x))


class BiasBeforeBatchNorm(nn.Module):
    """A biased conv before batch-norm: the bias's gradient vanishes (batch-norm removes
    any constant shift), so plain SGD leaves it unchanged — healthy."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, bias=True)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


@pytest.mark.parametrize("make", [FrozenBackbone, BiasBeforeBatchNorm])
def test_healthy_models_with_parameters_that_do_not_move_are_silent(make):
    model = make()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    x = torch.randn(16, 8) if make is FrozenBackbone else torch.randn(16, 3, 8, 8)
    y = torch.randint(0, 3, (16,))
    with Monitor(model, opt, every=2) as mon:
        train_under(mon, model, opt, x, y, steps=STEPS)
    report = mon.report()
    assert not fired(report, "NNDX321") and not fired(report, "NNDX322") and not fired(report, "NNDX320")
    if make is FrozenBackbone:
        assert report.loop.params_never_changed == []  # frozen ones are not trainable


# ---------------------------------------------------------------- several models and optimizers: a GAN


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def gan_loop(iterations, G, D, opt_g, opt_d, log, d_every=1):
    """The DCGAN example's loop: D on real and fake (every d_every iterations), then G."""
    g = torch.Generator().manual_seed(2)
    bce = nn.BCEWithLogitsLoss()
    for i in range(iterations):
        real = torch.randn(16, 8, generator=g) * 0.5 + 1.0
        fake = G(torch.randn(16, 4, generator=g))
        if i % d_every == 0:
            D.zero_grad()
            loss_d = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
            loss_d.backward()
            opt_d.step()
            log(loss_d, "D")
        G.zero_grad()
        loss_g = bce(D(fake), torch.ones(16, 1))
        loss_g.backward()
        opt_g.step()
        log(loss_g, "G")


def gan():
    torch.manual_seed(0)
    G, D = Generator(), Discriminator()
    return G, D, torch.optim.Adam(G.parameters(), lr=2e-4), torch.optim.Adam(D.parameters(), lr=2e-4)


@pytest.mark.parametrize("d_every", [1, 3])
def test_one_monitor_over_a_gan(d_every):
    G, D, opt_g, opt_d = gan()
    iterations = 9
    with Monitor({"G": G, "D": D}, [opt_g, opt_d], every=1) as mon:
        gan_loop(iterations, G, D, opt_g, opt_d, lambda loss, split: mon.log(loss, split=split), d_every=d_every)
        assert hook_count(G, D, opt_g, opt_d) > 0
    assert hook_count(G, D, opt_g, opt_d) == 0
    report = mon.report()
    loop = report.loop
    d_steps = len(range(0, iterations, d_every))
    assert report.errors == [] and loop.limitations == []
    assert loop.steps == iterations + d_steps and loop.optimizers == ["Adam", "Adam"]
    assert loop.backward_calls == iterations + d_steps and loop.backward_calls_in_step == 0
    assert loop.params_not_in_optimizer == [] and loop.optimizer_params_not_in_model == 0
    assert {p.name.split(".")[0] for p in report.parameters} == {"G", "D"}
    assert {s.name.split(".")[0] for s in report.layers} == {"G", "D"}
    assert set(report.loss_history) == {"D", "G"} and len(report.loss_history["G"]) == iterations
    for step in {p.step for p in report.parameters}:
        moved = {p.name[0] for p in report.parameters if p.step == step and p.update_ratio is not None}
        assert len(moved) == 1  # each step's update ratios are those of the network it stepped
    assert all(len(p.lrs) == 2 for p in loop.lr_history)
    assert loop.params_never_changed == []
    assert loop.optimizer_steps == [iterations, d_steps] and loop.optimizer_steps_without_reset == [0, 0]
    for rule_id in ("NNDX320", "NNDX321", "NNDX322", "NNDX303", "NNDX304", "NNDX301"):
        assert not fired(report, rule_id), rule_id


def test_two_monitors_on_a_gan_do_not_fight():
    G, D, opt_g, opt_d = gan()
    mon_g, mon_d = Monitor(G, opt_g, every=2), Monitor(D, opt_d, every=2)

    def log(loss, split):
        (mon_d if split == "D" else mon_g).log(loss)

    gan_loop(6, G, D, opt_g, opt_d, log)
    mon_d.close()
    mon_g.close()
    assert hook_count(G, D, opt_g, opt_d) == 0
    assert (mon_g.report().loop.steps, mon_d.report().loop.steps) == (6, 6)
    assert mon_g.report().errors == mon_d.report().errors == []


def test_gan_players_frozen_in_turn_are_each_trained_against_the_other():
    """StyleGAN2's loop (rosinality): requires_grad switched off on the generator while the
    discriminator steps and the other way round, so no parameter of the opponent is in
    either loss's graph. Each player's loss is still trained against the other (need not
    fall), which the discriminator's input and the generator's loss graph tell. Two
    Monitors on two models trained one on top of the other's output are no adversaries:
    an encoder's own Monitor is not fed the decoder's output."""
    G, D, opt_g, opt_d = gan()
    g = torch.Generator().manual_seed(2)
    mon_g, mon_d = Monitor(G, opt_g, every=2), Monitor(D, opt_d, every=2)
    for _ in range(6):
        real = torch.randn(16, 8, generator=g) * 0.5 + 1.0
        G.requires_grad_(False), D.requires_grad_(True)
        fake = G(torch.randn(16, 4, generator=g))
        loss_d = F.softplus(D(fake)).mean() + F.softplus(-D(real)).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        mon_d.log(loss_d)
        G.requires_grad_(True), D.requires_grad_(False)
        loss_g = F.softplus(-D(G(torch.randn(16, 4, generator=g)))).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        mon_g.log(loss_g)
    mon_d.close()
    mon_g.close()
    assert mon_g.report().loop.logged_loss_through_other_models is True
    assert mon_d.report().loop.logged_loss_through_other_models is True

    G, _, opt_g, _ = gan()
    mon = Monitor(G, opt_g, every=2)
    for _ in range(3):
        loss = G(torch.randn(16, 4, generator=g)).square().mean()
        opt_g.zero_grad()
        loss.backward()
        opt_g.step()
        mon.log(loss)
    mon.close()
    assert mon.report().loop.logged_loss_through_other_models is False


@pytest.mark.parametrize("fakes_detached_in", ["d_step", "g_step"])
def test_a_generator_stepped_on_detached_fakes_is_a_cut_graph(fakes_detached_in):
    """The discriminator's loss on undetached fakes gives the generator gradients, which
    its reset clears; a generator loss computed from detached fakes reaches only the
    discriminator. The generator's logged loss says so."""
    G, D, opt_g, opt_d = gan()
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    with Monitor(G, opt_g, every=2) as mon_g, Monitor(D, opt_d, every=2) as mon_d:
        for _ in range(8):
            real, fake = torch.randn(16, 8, generator=g) + 1.0, G(torch.randn(16, 4, generator=g))
            opt_d.zero_grad(), opt_g.zero_grad()
            seen_by_d = fake.detach() if fakes_detached_in == "d_step" else fake
            loss_d = bce(D(real), torch.ones(16, 1)) + bce(D(seen_by_d), torch.zeros(16, 1))
            loss_d.backward()
            opt_d.step()
            mon_d.log(loss_d)
            opt_d.zero_grad(), opt_g.zero_grad()
            loss_g = bce(D(fake.detach() if fakes_detached_in == "g_step" else fake), torch.ones(16, 1))
            loss_g.backward()
            opt_g.step()
            mon_g.log(loss_g)
    generator, discriminator = mon_g.report(), mon_d.report()
    assert discriminator.loop.logged_loss_reaches_params is True and not fired(discriminator, "NNDX304")
    # the generator's loss runs through the discriminator; the discriminator is fed the generator's fakes
    # (undetached in one of its two steps): each is trained against the other
    assert discriminator.loop.logged_loss_through_other_models is True
    assert generator.loop.logged_loss_through_other_models is True
    if fakes_detached_in == "d_step":  # the usual GAN loop
        assert generator.loop.logged_loss_reaches_params is True and not fired(generator, "NNDX304")
    else:
        assert generator.loop.logged_loss_reaches_params is False
        (finding,) = fired(generator, "NNDX304")
        assert finding.severity == "error" and not fired(generator, "NNDX322")  # named once, as the cut it is


def test_a_loss_logged_after_backward_is_read_and_a_number_is_not():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        optimizer_loop(mon, model, opt)  # logs the loss tensor after its backward
    assert mon.report().loop.logged_loss_reaches_params is True
    x, y = data()
    with Monitor(model, opt) as mon:
        for _ in range(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            mon.log(loss.item())
    assert mon.report().loop.logged_loss_reaches_params is None


def test_what_the_loop_does_to_the_outputs_before_its_own_loss_is_read_from_the_logged_losss_graph():
    """Co-teaching's loop: softmax of each network's outputs, the small-loss samples picked by
    index, F.cross_entropy in a loss function of the loop's own; logged after the backward."""
    x, y = data()

    def run(softmax: bool) -> list[list[str]]:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Monitor(model, opt) as mon:
            for _ in range(4):
                opt.zero_grad()
                out = model(x)
                out = F.softmax(out, dim=1) if softmax else out
                keep = F.cross_entropy(out, y, reduction="none").argsort()[: len(y) // 2]
                loss = F.cross_entropy(out[keep], y[keep]) / len(keep)
                loss.backward()
                opt.step()
                mon.log(loss)
        codes = [f.code.value for f in nndx.diagnose(mon.report()).findings]
        assert codes[:1] == ["DOUBLE_SOFTMAX"] if softmax else "DOUBLE_SOFTMAX" not in codes, codes
        return mon.report().loop.ops_before_loss

    (path,) = run(softmax=True)
    assert path[1:] == ["Softmax", "Index", "LogSoftmax", "NllLoss", "Div"], path
    (path,) = run(softmax=False)
    assert "Softmax" not in path and path[-3:] == ["LogSoftmax", "NllLoss", "Div"], path


def test_a_sigmoid_that_is_the_losss_target_is_no_second_sigmoid():
    """Consistency training: BCE with logits of one view against the sigmoid of another view's
    outputs, both in the graph. The sigmoid enters the loss as its target, not its input."""
    x, _ = data()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        for _ in range(4):
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(x), torch.sigmoid(model(x + 0.1 * torch.randn_like(x))))
            loss.backward()
            opt.step()
            mon.log(loss)
    paths = mon.report().loop.ops_before_loss
    assert any(path[1:3] == ["Sigmoid", "BinaryCrossEntropyWithLogits#1"] for path in paths), paths
    assert "NNDX314" not in {f.rule_id for f in nndx.diagnose(mon.report()).findings}


def test_gradients_zeroed_by_hand_count_only_for_weights_that_are_not_zero():
    """The Lottery Ticket loop: weights pruned to 0, their gradients masked before the step.
    Its published mask ``w < eps`` freezes every negative weight too."""
    x, y = data()
    x[:, 0] = 0.0  # an input that is always 0: autograd's own zero gradients for its weights

    def run(mask) -> nndx.report.DiagnosticReport:
        torch.manual_seed(0)
        model = mlp()
        with torch.no_grad():
            first = next(model.parameters())
            first[first.abs() < first.abs().median()] = 0.0  # half pruned
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        with Monitor(model, opt, every=1) as mon:
            for _ in range(4):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                for p in model.parameters():
                    p.grad.data = torch.where(mask(p.detach()), torch.zeros_like(p.grad), p.grad)
                opt.step()
                mon.log(loss)
        return mon.report()

    healthy = run(lambda w: w.abs() < 1e-6)
    assert healthy.loop.grads_masked_by_hand == {} and not fired(healthy, "NNDX330")
    buggy = run(lambda w: w < 1e-6)
    assert 0.3 < max(buggy.loop.grads_masked_by_hand.values()) < 0.7, buggy.loop.grads_masked_by_hand
    (finding,) = fired(buggy, "NNDX330")
    assert finding.severity == "warning" and finding.code.value == "FROZEN_PARAMETERS"


def test_gradients_masked_before_the_second_of_two_steps_after_one_backward_are_counted():
    """An actor-critic loop: one backward, the actor's step, then the critic's gradients masked
    by hand and its step. Each optimizer's step is compared with the backward for its own
    parameters."""
    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 3)
    opt_body, opt_head = torch.optim.SGD(body.parameters(), lr=0.1), torch.optim.SGD(head.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with Monitor(nn.Sequential(body, head), [opt_body, opt_head], every=1) as mon:
        for _ in range(3):
            opt_body.zero_grad()
            opt_head.zero_grad()
            loss = F.cross_entropy(head(body(x)), y)
            loss.backward()
            opt_body.step()
            head.weight.grad[head.weight.detach() < 0] = 0.0
            opt_head.step()
            mon.log(loss)
    assert list(mon.report().loop.grads_masked_by_hand) == ["1.weight"]


def test_model_names_must_be_usable():
    with pytest.raises(TypeError, match="names"):
        Monitor({"a.b": mlp()})
    with pytest.raises(TypeError, match="Optimizer"):
        Monitor(mlp(), [object()])


# ---------------------------------------------------------------- outputs, token inputs, sequences


class ModelOutput(OrderedDict):
    """What Hugging Face models return: a dict whose keys are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TokenModel(nn.Module):
    """Token ids in, an output of the given kind out, with the loss computed inside (HF)."""

    def __init__(self, kind):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.embed = nn.Embedding(20, 8)
        self.rnn = nn.GRU(8, 16)  # time-major: [T, B, F]
        self.head = nn.Linear(16, 20)

    def forward(self, input_ids, labels=None):
        out, hidden = self.rnn(self.embed(input_ids))
        logits = self.head(out)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 20), labels.reshape(-1))
        if self.kind == "tuple":
            return loss, logits, hidden
        if self.kind == "dict":
            return {"loss": loss, "logits": logits}
        return ModelOutput(loss=loss, logits=logits)


@pytest.mark.parametrize("kind", ["tuple", "dict", "model_output"])
def test_outputs_of_any_shape_token_inputs_and_time_major_sequences(kind):
    model = TokenModel(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    with Monitor(model, opt, every=2) as mon:
        for _ in range(6):
            tokens = torch.randint(0, 20, (7, 4), generator=g)  # [T=7, B=4]
            opt.zero_grad()
            out = model(input_ids=tokens, labels=tokens)
            loss = out[0] if kind == "tuple" else out["loss"] if kind == "dict" else out.loss
            loss.backward()
            opt.step()
            mon.log(loss)
    report = mon.report()
    assert report.errors == [] and report.loop.limitations == []
    assert report.loop.input_dtype == "int64" and report.loop.input_norm_history == []  # tokens: no norm
    layers = {s.name: s for s in report.layers if s.step == 4}
    assert set(layers) == {"embed", "rnn", "head"}
    assert layers["rnn"].activation.unit_count == 16 and layers["rnn"].gradient.norm > 0
    assert report.loop.graph_nodes_history and all(p.earlier_nodes == 0 for p in report.loop.graph_nodes_history)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_scripted_model_is_a_limitation_not_an_exception():
    model = torch.jit.script(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        optimizer_loop(mon, model, opt, steps=3)
    report = mon.report()
    assert report.loop.steps == 3 and report.loop.backward_calls == 3
    assert any("not watched" in text and "RuntimeError" in text for text in report.loop.limitations)
    assert hook_count(opt) == 0


# ---------------------------------------------------------------- the autograd graph kept across steps


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.rec, self.out = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x, h):
        h = torch.tanh(self.inp(x) + self.rec(h))
        return self.out(h), h


@pytest.mark.parametrize("detach", [False, True])
def test_a_hidden_state_carried_without_detach_grows_the_graph(detach):
    """The word-language-model loop without ``repackage_hidden``: updates through
    ``p.data`` bump no version counter, so backward(retain_graph=True) runs through every
    earlier step's graph without an error while it grows."""
    model = Recurrent()
    x, y = data()
    h = torch.zeros(32, 16)
    with Monitor(model, every=2) as mon:
        for _ in range(STEPS):
            model.zero_grad()
            out, h = model(x, h.detach() if detach else h)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward(retain_graph=not detach)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
            mon.log(loss)
    report = mon.report()
    history = report.loop.graph_nodes_history
    assert report.loop.steps == STEPS and [p.step for p in history] == list(range(0, STEPS, 2))
    if detach:  # truncated BPTT done right: the same graph every step
        assert len({p.nodes for p in history}) == 1 and all(p.earlier_nodes == 0 for p in history)
        assert not fired(report, "NNDX320")
    else:
        assert all(b.nodes > a.nodes for a, b in zip(history, history[1:]))
        assert all(p.earlier_nodes > 0 for p in history[1:])
        (finding,) = fired(report, "NNDX320")
        assert finding.code.value == "GRAPH_RETAINED" and finding.severity == "error"
        assert "NNDX320" in {f.rule_id for f in mon.findings}  # a live alert too


@pytest.mark.parametrize("keep", ["loss tensor", "loss.item()", "outputs detached", "outputs of forwards not backed"])
def test_a_running_sum_of_loss_tensors_keeps_every_graph_alive(keep):
    """``total += loss`` holds each step's graph in a chain no model output leads to (the
    graph behind the outputs never grows); ``loss.item()`` or detached outputs do not. After
    backward those graphs hold no activations (info); outputs of forwards that no backward
    followed, kept with their graphs, hold their activations too (an alarm)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()
    total, kept = 0.0, []
    with Monitor(model, opt, every=5) as mon:
        for _ in range(40):
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            total = total + (loss if keep == "loss tensor" else loss.item())
            if keep == "outputs detached":
                kept.append(out.detach())
            if keep == "outputs of forwards not backed":
                kept.append(model(x))  # a validation forward with grad enabled, its output kept
            mon.log(loss)
    report = mon.report()
    assert all(a.nodes == b.nodes for a, b in zip(report.loop.graph_nodes_history, report.loop.graph_nodes_history[1:]))
    if keep == "loss tensor":
        (finding,) = fired(report, "NNDX320")
        assert finding.code.value == "GRAPH_RETAINED" and finding.evidence["older_graphs_alive"] >= 4
        assert finding.evidence["older_graphs_holding"] == 0 and finding.severity == "info"
    elif keep == "outputs of forwards not backed":
        (finding,) = fired(report, "NNDX320")
        assert finding.evidence["older_graphs_holding"] >= 4 and finding.severity == "error"
    else:
        assert all(p.older_graphs_alive == 0 for p in report.loop.graph_nodes_history)
        assert not fired(report, "NNDX320")


def test_the_graph_watcher_keeps_few_of_a_steps_graphs_alive():
    """Whether backward freed a graph is read at the step's end, so a few forwards' graphs are
    held until then; a loop of forwards inside one step (validation with grad enabled) must not
    have all of its graphs, activations and all, kept alive by nndx."""
    import weakref

    from nndx.collector.watch.graph import GraphSize

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()
    hidden = []
    model[1].register_forward_hook(lambda _m, _i, out: hidden.append(weakref.ref(out)))
    with Monitor(model, opt, every=1) as mon:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        hidden.clear()
        for _ in range(20):
            model(x)  # outputs dropped: only nndx could keep their graphs
        alive = sum(ref() is not None for ref in hidden)
        assert 0 < alive <= GraphSize.HELD_FORWARDS < len(hidden) == 20
        opt.step()
        mon.log(torch.tensor(0.0))
    assert sum(ref() is not None for ref in hidden) == 0


class ScratchBatchNorm(nn.Module):
    """d2l's batch norm from scratch (chapter 8.5): the moving statistics are plain attributes,
    reassigned each training step; before d2l's fix (PR #1342) they kept their graph."""

    def __init__(self, features, detach):
        super().__init__()
        self.gamma, self.beta = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features))
        self.moving_mean, self.moving_var = torch.zeros(features), torch.ones(features)
        self.detach = detach

    def forward(self, x):
        mean, var = x.mean(dim=0), x.var(dim=0, unbiased=False)
        moving_mean = 0.9 * self.moving_mean + 0.1 * mean
        moving_var = 0.9 * self.moving_var + 0.1 * var
        self.moving_mean, self.moving_var = ((moving_mean.data, moving_var.data) if self.detach
                                             else (moving_mean, moving_var))  # fmt: skip
        return self.gamma * (x - mean) / torch.sqrt(var + 1e-5) + self.beta


class TaggerState(nn.Module):
    """The LSTM tagger tutorial's ``self.hidden``: this step's state, reset before each sentence."""

    def __init__(self):
        super().__init__()
        self.lstm, self.out = nn.LSTM(8, 16), nn.Linear(16, 3)
        self.hidden = None

    def forward(self, x):
        out, self.hidden = self.lstm(x[:, None, :], self.hidden)
        return self.out(out[:, 0])


@pytest.mark.parametrize("model", ["kept", "detached", "tagger"])
def test_a_graph_the_model_keeps_on_itself_across_steps_is_seen(model):
    """The moving statistics keep each step's graph, chained to the step before, on the module:
    no output leads to them and no loss reads them in training, so the outputs' graph never
    grows; memory does. Detached (``.data``), or a state that holds only the current step's
    graph (reset every step), nothing is kept."""
    torch.manual_seed(0)
    if model == "tagger":
        net = TaggerState()
    else:
        net = nn.Sequential(nn.Linear(8, 16), ScratchBatchNorm(16, detach=model == "detached"), nn.ReLU(),
                            nn.Linear(16, 3))  # fmt: skip
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = data()
    with Monitor(net, opt, every=2) as mon:
        for _ in range(STEPS):
            if model == "tagger":
                net.hidden = None
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            mon.log(loss)
    report = mon.report()
    found = fired(report, "NNDX320")
    if model == "kept":
        (finding,) = found
        assert "1.moving_mean" in finding.symptom and finding.severity == "error", finding.symptom
    else:
        assert found == [] and all(p.stored_earlier_nodes == 0 for p in report.loop.graph_nodes_history)


def test_graph_walk_is_bounded():
    from nndx.collector.watch.graph import GraphSize

    x = torch.ones(3, requires_grad=True)
    y = x
    for _ in range(GraphSize.MAX_NODES + 10):
        y = y * 1.0
    nodes, earlier, truncated = GraphSize(4).walk([y.grad_fn], step=0)
    assert nodes == GraphSize.MAX_NODES and truncated and earlier == 0


# ---------------------------------------------------------------- the initial state


def test_initial_state_is_the_state_at_attach_time_and_not_aliased():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        optimizer_loop(mon, model, opt, steps=3)
    state = mon.initial_state()
    assert list(state) == list(model.state_dict())  # parameters and buffers, state_dict keys
    for key, value in state.items():
        assert torch.equal(value, before[key]), key
        assert value.device.type == "cpu"
        assert value.data_ptr() != model.state_dict()[key].data_ptr()
    assert not torch.equal(state["0.weight"], model[0].weight)  # training moved the model, not the copy
    assert state["1.num_batches_tracked"].item() == 0 and model[1].num_batches_tracked.item() == 3
    state["0.weight"].add_(1.0)  # writing to the returned copy leaves the model alone
    assert not torch.equal(model[0].weight, before["0.weight"] + 1.0)
    copy = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    copy.load_state_dict(Monitor(copy, initial_state="cpu").initial_state())


def test_initial_state_is_bounded_and_says_so():
    model = mlp()
    with Monitor(model, initial_state_max_bytes=100) as mon:
        pass
    assert mon.initial_state() is None
    (limitation,) = [text for text in mon.report().loop.limitations if "initial state" in text]
    assert "initial_state_max_bytes" in limitation
    with Monitor(model, initial_state=None) as off:
        pass
    assert off.initial_state() is None


def test_initial_state_of_each_model():
    G, D, opt_g, opt_d = gan()
    expected = {k: v.clone() for k, v in G.state_dict().items()}
    with Monitor({"G": G, "D": D}, [opt_g, opt_d]) as mon:
        gan_loop(2, G, D, opt_g, opt_d, lambda *_: None)
    assert set(mon.initial_state()) == {f"G.{k}" for k in G.state_dict()} | {f"D.{k}" for k in D.state_dict()}
    for by in ("G", G):
        state = mon.initial_state(by)
        assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)
    with pytest.raises(KeyError):
        mon.initial_state("E")


def test_update_detection_ignores_a_nan_that_stays_nan():
    model = mlp()
    with torch.no_grad():
        model[0].weight[0, 0] = math.nan
    with Monitor(model, every=5) as mon:
        manual_loop(mon, model, update="none", steps=3)
    assert mon.report().loop.steps == 0


@pytest.mark.parametrize("reset", ["zero_", "none", "never"])
def test_manual_loop_gradient_resets_by_hand(reset):
    """The tutorial's loop: update under no_grad, then ``p.grad.zero_()``."""
    model = mlp()
    x, y = data()
    with Monitor(model, every=4) as mon:
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    if reset == "zero_":
                        p.grad.zero_()
                    elif reset == "none":
                        p.grad = None
            mon.log(loss)
    report = mon.report()
    assert report.loop.steps == STEPS
    if reset == "never":
        assert report.loop.zero_grad_calls == 0
        assert fired(report, "NNDX301")
    else:
        assert report.loop.zero_grad_calls == STEPS
        assert not fired(report, "NNDX301")
    # gradients zeroed in place after the update are reset, not clipped (fastText's torchtext loop
    # got GRAD_CLIP_TOO_SMALL: "clipped" to a norm of 0 on every step)
    history = report.loop.grad_norm_history
    assert history and all(p.after_clip is None for p in history)
    assert not fired(report, "NNDX308")


def test_a_failing_layer_hook_is_recorded_and_training_goes_on(monkeypatch):
    import nndx.collector.stats as stats

    def broken(*_args, **_kwargs):
        raise RuntimeError("sample exploded")

    monkeypatch.setattr(stats, "leading_samples", broken)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, every=1) as mon:
        optimizer_loop(mon, model, opt, steps=3)
    report = mon.report()
    assert report.loop.steps == 3
    assert {e.source for e in report.errors} == {"monitor.layer_forward"}


def test_a_recurrent_state_whose_graph_is_kept_does_not_break_the_layer_hooks():
    """An LSTM's (h, c) carried without detach: later backward passes run through earlier
    steps' outputs, whose gradient hooks then get None for the state no loss used."""
    torch.manual_seed(0)
    lstm, head = nn.LSTM(4, 8), nn.Linear(8, 2)
    model = nn.ModuleDict({"lstm": lstm, "head": head})
    x, y = torch.randn(5, 3, 4), torch.randint(0, 2, (5 * 3,))
    state = None
    with Monitor(model, every=1) as mon:
        for _ in range(4):
            model.zero_grad()
            out, state = lstm(x, state)
            loss = nn.functional.cross_entropy(head(out).reshape(-1, 2), y)
            loss.backward(retain_graph=True)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    report = mon.report()
    assert report.errors == [] and report.loop.steps == 4


# ---------------------------------------------------------------- the loop's own exception


class CarriedRNN(nn.Module):
    def __init__(self, inplace_bug: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.fc, self.inplace_bug = nn.RNN(4, 8, batch_first=True), nn.Linear(8, 3), inplace_bug

    def forward(self, x, h):
        out, h = self.rnn(x, h)
        last = torch.sigmoid(out[:, -1])
        if self.inplace_bug:
            last *= 2.0  # in place on the output sigmoid saved for its backward
        return self.fc(last), h


@pytest.mark.parametrize("bug", ["hidden state kept", "in-place on an activation"])
def test_the_loops_exception_is_kept_and_read_for_its_cause(bug):
    """A training loop that raises inside ``with Monitor(...)``: the exception still
    propagates, and the report keeps it (source "training"). An in-place error on a
    parameter's shape after a step is a graph kept across the step; on an activation,
    an in-place op autograd needed."""
    model = CarriedRNN(inplace_bug=bug == "in-place on an activation")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x, y, h = torch.randn(16, 5, 4, generator=g), torch.randint(0, 3, (16,), generator=g), torch.zeros(1, 16, 8)
    with pytest.raises(RuntimeError, match="inplace"):
        with Monitor(model, opt, every=1) as mon:
            for _ in range(5):
                opt.zero_grad()
                out, h = model(x, h if bug == "hidden state kept" else h.detach())
                loss = nn.functional.cross_entropy(out, y)
                loss.backward(retain_graph=bug == "hidden state kept")
                opt.step()
                mon.log(loss)
    report = mon.report()
    assert [e.source for e in report.errors] == ["training"]
    (finding,) = fired(report, "NNDX702")
    expected = "GRAPH_RETAINED" if bug == "hidden state kept" else "INPLACE_AUTOGRAD"
    assert finding.code.value == expected and nndx.diagnose(report).top().code.value == expected


@pytest.mark.parametrize("reset", ["zero_grad_after_forward", "grad_none_before_forward"])
def test_manual_loop_step_size_is_measured_and_a_collapsing_schedule_fires(reset):
    """Without an optimizer the LR is a number in the user's code; |update| / |gradient| is
    plain SGD's LR. A per-epoch decay stepped every batch drives it to ~0 (NNDX307); a
    constant LR does not. Also when the loop sets .grad to None before its next forward,
    where the update is detected."""
    x, y = data()

    def run(decay: float):
        model, lr = mlp(), 0.2
        with Monitor(model, every=2) as mon:
            for _ in range(40):
                if reset == "grad_none_before_forward":
                    for p in model.parameters():
                        p.grad = None
                loss = nn.functional.cross_entropy(model(x), y)
                if reset == "zero_grad_after_forward":
                    model.zero_grad()
                loss.backward()
                mon.log(loss)
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
                lr *= decay
        return mon.report()

    constant = run(1.0)
    sizes = [p.lrs[0] for p in constant.loop.effective_lr_history]
    assert len(sizes) >= 15 and all(s == pytest.approx(0.2, rel=1e-3) for s in sizes)
    assert constant.loop.lr_history == [] and not fired(constant, "NNDX307")
    collapsing = run(0.5)
    assert collapsing.loop.effective_lr_history[-1].lrs[0] < 1e-6
    assert fired(collapsing, "NNDX307")[0].evidence["lr_source"].startswith("the step size")


@pytest.mark.parametrize("reset", ["zero_grad_before_forward", "grad_zeroed_after_update"])
def test_manual_loop_whose_lr_turns_negative_fires_and_momentum_does_not(reset):
    """A linear decay sized to one epoch and run for three (torchtext's fastText loop:
    lr = lr0 * (1 - progress), updated by hand) turns the LR negative: every update then
    climbs the gradient. The measured step size carries the update's direction, so NNDX307
    names it (error) whether the loop zeroes the gradients before the forward or right after
    the update; a hand-written heavy-ball momentum that overshoots now and then does not."""
    x, y = data()

    def run(schedule, momentum=0.0):
        model = mlp()
        velocity = [torch.zeros_like(p) for p in model.parameters()]
        with Monitor(model, every=2) as mon:
            for i in range(60):
                if reset == "zero_grad_before_forward":
                    model.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                mon.log(loss)
                lr = schedule(i)
                for p, v in zip(model.parameters(), velocity):
                    v.mul_(momentum).add_(p.grad)
                    p.data.add_(v, alpha=-lr)
                    if reset == "grad_zeroed_after_update":
                        p.grad.zero_()
        return mon.report()

    broken = run(lambda i: 0.1 * (1 - i / 20))
    sizes = [p.lrs[0] for p in broken.loop.effective_lr_history]
    assert sizes[0] > 0 and sizes[-1] < 0
    (finding,) = fired(broken, "NNDX307")
    assert finding.severity == "error" and finding.evidence["negative_from_step"] >= 18
    assert not fired(run(lambda i: 0.1 * (1 - i / 60)), "NNDX307")
    heavy_ball = run(lambda i: 0.5, momentum=0.9)
    assert not [f for f in fired(heavy_ball, "NNDX307") if "negative" in f.symptom]


@pytest.mark.parametrize("clip", [None, 1e-4])
def test_clipping_inside_a_closure_step_is_seen(clip):
    """Lightning runs forward, backward and gradient_clip_val's clipping inside
    optimizer.step(closure): the gradients the step leaves are the clipped ones."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        return loss

    with Monitor(model, opt, every=1) as mon:
        for _ in range(8):
            mon.log(opt.step(closure))
    history = mon.report().loop.grad_norm_history
    assert len(history) == 8
    if clip is None:
        assert all(p.after_clip is None for p in history)
    else:
        assert all(p.after_clip == pytest.approx(clip, rel=1e-3) and p.before_clip > 100 * clip for p in history)
        assert fired(mon.report(), "NNDX308")


def test_probes_after_a_manual_loop_train_with_sgd_at_the_measured_step_size():
    """No optimizer object: the probes (and the interventions) train with plain SGD at the
    step size the Monitor measured, not nndx's Adam at 1e-3; the user's model is untouched."""
    model = mlp()
    with Monitor(model, every=1) as mon:
        manual_loop(mon, model, lr=0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = nndx.probe(model, data(), nn.functional.cross_entropy, monitor=mon,
                        probes=["overfit_one_batch", "interventions"])  # fmt: skip
    note = next(n for n in report.run.notes if "step size the Monitor measured" in n)
    assert "lr 0.05" in note
    assert report.interventions.optimizer == "user"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # without a Monitor nothing was measured: nndx's default, said so in the interventions
    alone = nndx.probe(model, data(), nn.functional.cross_entropy, probes=["interventions"])
    assert alone.interventions.optimizer == "default"


class GraphConvNet(nn.Module):
    """Two graph convolutions over a sparse adjacency, as the PyTorch GCN example feeds it."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(12, 16), nn.Linear(16, 3)

    def forward(self, features: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(torch.sparse.mm(adj, self.first(features)))
        return torch.log_softmax(torch.sparse.mm(adj, self.second(hidden)), dim=1)


def _graph(nodes: int = 60) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (nodes,), generator=gen)
    features = torch.rand(nodes, 12, generator=gen) + nn.functional.one_hot(labels, 12).float()
    edges = torch.randint(0, nodes, (2, 4 * nodes), generator=gen)
    adj = torch.sparse_coo_tensor(edges, torch.full((4 * nodes,), 0.2), (nodes, nodes)) + torch.eye(nodes).to_sparse()
    return (features.to_sparse(), adj.coalesce()), labels


def test_sparse_graph_inputs_are_measured_not_errors():
    """Sparse features and adjacency (the PyTorch GCN example): every probe runs or says why
    it cannot (a graph's rows are no separable samples), none raises, and the Monitor
    records the inputs' norms."""
    torch.manual_seed(0)
    model, (inputs, labels) = GraphConvNet(), _graph()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, every=5) as mon:
        for _ in range(20):
            optimizer.zero_grad()
            loss = nn.functional.nll_loss(model(*inputs), labels)
            loss.backward()
            optimizer.step()
            mon.log(loss)
    report = nndx.probe(model, (inputs, labels), nn.functional.nll_loss, optimizer=optimizer, monitor=mon,
                        progress=False)  # fmt: skip
    assert report.errors == []
    assert report.probes.sample_independence.status == "skipped"
    assert "sparse" in report.probes.sample_independence.message
    assert report.probes.nan_origin.status != "error" and report.probes.eval_mode.status != "error"
    assert report.probes.grad_check.status != "error"
    norms = report.loop.input_norm_history
    assert norms and all(math.isfinite(p.value) and p.value > 0 for p in norms)


@pytest.mark.parametrize("zero_grad", [True, False])
def test_gradients_never_reset_under_a_grad_scaler_that_skips_every_step(zero_grad):
    """Once the summed gradients overflow, a GradScaler skips every optimizer.step() and the
    Monitor sees backward passes with hardly a step: that is still zero_grad missing (here the
    first scaled backward overflows, as a large loss under float16 does). With zero_grad the
    scaler lowers its scale, steps resume, and nothing fires."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    x, y = data()
    with Monitor(model, opt) as mon:
        for _ in range(40):
            if zero_grad:
                opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            mon.log(loss)
    report = mon.report()
    assert (report.loop.steps < 3) == (not zero_grad)
    assert bool(fired(report, "NNDX301")) == (not zero_grad)


def test_a_discriminator_whose_step_calls_the_generators_optimizer_is_no_step_not_zero_grad_missing():
    """The relativistic GAN's copy-paste bug: the discriminator block calls optimizer_G's zero_grad and
    step. The discriminator's optimizer never steps and never resets, its gradients pile up finite: the
    parameters are never updated (NNDX321), which no zero_grad would change (no NNDX301)."""
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(generator.parameters(), 1e-3), torch.optim.Adam(discriminator.parameters(), 1e-3)
    real = torch.randn(64, 8)
    with Monitor(discriminator, opt_d) as mon:
        for _ in range(30):
            fake = generator(torch.randn(64, 4))
            opt_g.zero_grad()
            g_loss = nn.functional.softplus(-discriminator(fake)).mean()
            g_loss.backward()
            opt_g.step()
            opt_g.zero_grad()  # should be opt_d's
            d_loss = nn.functional.softplus(-discriminator(real)).mean() + nn.functional.softplus(
                discriminator(fake.detach())).mean()
            d_loss.backward()
            opt_g.step()  # should be opt_d's
            mon.log(d_loss)
    report = mon.report()
    assert report.loop.steps == 0 and not report.loop.params_grad_nonfinite
    assert fired(report, "NNDX321") and not fired(report, "NNDX301")


@pytest.mark.parametrize("reset", ["both", "encoder_only", "model", "by_hand", "set_to_zero"])
def test_an_optimizer_whose_gradients_are_never_reset_is_named_among_several(reset):
    """An encoder-decoder loop with an optimizer each (the PyTorch seq2seq tutorial):
    forgetting decoder_optimizer.zero_grad() leaves the counts over both looking healthy."""
    torch.manual_seed(0)
    encoder, decoder = nn.Linear(8, 16), nn.Linear(16, 3)
    model = nn.Sequential(encoder, nn.ReLU(), decoder)
    enc_opt, dec_opt = torch.optim.Adam(encoder.parameters(), 1e-3), torch.optim.Adam(decoder.parameters(), 1e-3)
    x, y = data()
    with Monitor(model, [enc_opt, dec_opt]) as mon:
        for _ in range(STEPS):
            if reset == "model":
                model.zero_grad()
            elif reset == "by_hand":
                for p in model.parameters():
                    p.grad = None
            else:
                enc_opt.zero_grad(set_to_none=reset != "set_to_zero")
                if reset != "encoder_only":
                    dec_opt.zero_grad(set_to_none=reset != "set_to_zero")
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            enc_opt.step()
            dec_opt.step()
            mon.log(loss)
    report = mon.report()
    assert report.loop.optimizer_steps == [STEPS, STEPS]
    hits = fired(report, "NNDX301")
    if reset == "encoder_only":
        assert report.loop.optimizer_steps_without_reset == [0, STEPS - 1]
        assert hits and hits[0].severity == "error" and "optimizer 1" in hits[0].symptom
    else:
        assert report.loop.optimizer_steps_without_reset == [0, 0] and not hits


def test_resets_through_zero_grad_are_known_without_reading_a_gradient(monkeypatch):
    """Reading a gradient's values is a host sync on a GPU: a reset made through
    optimizer.zero_grad() or model.zero_grad() is known from the call itself, whichever
    optimizer or model made it, with set_to_none or in place."""
    from nndx.collector.watch import loop as loop_module

    reads = []
    happened = loop_module._GradReset.happened
    monkeypatch.setattr(loop_module._GradReset, "happened", lambda self: reads.append(1) or happened(self))
    torch.manual_seed(0)
    encoder, decoder = nn.Linear(8, 16), nn.Linear(16, 3)
    model = nn.Sequential(encoder, nn.ReLU(), decoder)
    enc_opt, dec_opt = torch.optim.SGD(encoder.parameters(), 0.1), torch.optim.SGD(decoder.parameters(), 0.1)
    x, y = data()
    with Monitor(model, [enc_opt, dec_opt]) as mon:
        for i in range(STEPS):
            if i % 2:
                model.zero_grad(set_to_none=False)
            else:
                enc_opt.zero_grad(set_to_none=False)
                dec_opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # changes the gradients in place
            enc_opt.step()
            dec_opt.step()
            mon.log(loss)
    assert reads == []
    assert mon.report().loop.optimizer_steps_without_reset == [0, 0]


class TargetNet(nn.Module):
    """An online net, a frozen target the loop moves by an EMA (initialised apart, as a
    target loaded from elsewhere would be) and a frozen embedding nothing moves."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.online, self.target, self.fixed = nn.Linear(8, 3), nn.Linear(8, 3), nn.Linear(8, 8)
        for p in [*self.target.parameters(), *self.fixed.parameters()]:
            p.requires_grad = False

    def forward(self, x):
        return self.online(self.fixed(x)) + 0.0 * self.target(x)


def test_frozen_parameters_the_loop_moves_without_gradient_follow_the_trained_ones():
    model = TargetNet()
    opt = torch.optim.SGD(model.online.parameters(), lr=0.05)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))

    def ema():
        with torch.no_grad():
            for t, o in zip(model.target.parameters(), model.online.parameters()):
                t.mul_(0.9).add_(o, alpha=0.1)

    with Monitor(model, opt) as mon:
        train_under(mon, model, opt, x, y, steps=4, after=ema)
    loop = mon.report().loop
    assert loop.frozen_tracking == ["target.weight", "target.bias"]
    assert set(loop.frozen_params) - set(loop.frozen_tracking) == {"fixed.weight", "fixed.bias"}


class LARC:
    """apex's LARC as SwAV uses it: no torch Optimizer, but it holds one as ``.optim`` and
    calls its step after scaling each parameter's gradient by a trust ratio."""

    def __init__(self, optimizer: torch.optim.Optimizer, trust_coefficient: float = 0.001) -> None:
        self.optim, self.trust_coefficient = optimizer, trust_coefficient

    @property
    def param_groups(self):
        return self.optim.param_groups

    def zero_grad(self) -> None:
        self.optim.zero_grad()

    def step(self) -> None:
        with torch.no_grad():
            for group in self.optim.param_groups:
                for p in group["params"]:
                    if p.grad is not None and p.grad.norm() > 0:
                        p.grad.mul_(min(1.0, self.trust_coefficient * p.norm() / (p.grad.norm() * group["lr"])))
        self.optim.step()


def test_an_optimizer_wrapper_holding_a_torch_optimizer_is_watched_through_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = LARC(torch.optim.SGD(model.parameters(), lr=4.8, momentum=0.9))
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    with nndx.Monitor(model, optimizer, every=2) as monitor:
        for _ in range(10):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            monitor.log(loss)
    loop = monitor.report().loop
    assert loop.steps == 10 and loop.lr_history and loop.lr_history[0].lrs == [4.8]
    assert any("LARC wraps the optimizer" in note for note in loop.limitations)
    with pytest.raises(TypeError, match="optimizer must be"):
        nndx.Monitor(model, object())
    with pytest.raises(TypeError, match="holding None"):
        nndx.Monitor(model, [optimizer, None])


class ScheduledOptim:
    """CPC's warm-up wrapper (jefflai108): ``.optimizer`` inside, and no ``param_groups`` of its own."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.n_steps = optimizer, 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.n_steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] = 1e-3 * min(1.0, self.n_steps / 5)
        self.optimizer.step()


def test_the_probes_take_the_same_wrappers_as_the_monitor_and_copy_the_optimizer_inside():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    inner = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer = ScheduledOptim(inner)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer, probes=["hooks", "lr_range"],
                        progress=False)
    assert not report.errors
    assert report.probes.lr_range.status == "passed"
    assert any("ScheduledOptim wraps the optimizer" in note for note in report.run.notes)
    assert optimizer.n_steps == 0 and not inner.state  # copied, never stepped
    with pytest.raises(TypeError, match="optimizer must be"):
        nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=object(), progress=False)
    assert nndx.lr_find(model, optimizer, nn.CrossEntropyLoss(), (x, y), steps=10, progress=False).history["lr"]


def test_per_sample_gradients_under_torch_func_do_not_reach_the_monitors_hooks():
    """DP-SGD (Opacus, or written with torch.func): vmap(grad(...)) over functional_call runs the
    model's forward on batched tensors that must not leave the transform. A layer statistic kept
    from inside it made the user's optimizer.step() raise; the ordinary forward is still watched."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))

    def sample_loss(params, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, params, (xi[None],)), yi[None])

    with Monitor(model, optimizer, every=1) as mon:
        for _ in range(4):
            params = {k: v.detach() for k, v in model.named_parameters()}
            per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
            for k, p in model.named_parameters():
                p.grad = per_sample[k].mean(0)
            optimizer.step()
            optimizer.zero_grad()
            with torch.no_grad():
                mon.log(nn.functional.cross_entropy(model(x), y))
    report = mon.report()
    assert mon.steps == 4 and not report.errors, report.errors
    assert report.layers, "the ordinary forwards' layer statistics are still recorded"


class StyleExtractor(nn.Module):
    """Neural style transfer (the PyTorch tutorial): a fixed convolutional extractor, frozen
    with requires_grad_(False), and a content loss on its features; the optimizer trains the
    input image. ``optimise="model"`` is the bug: the same frozen extractor is what the
    optimizer holds, and nothing trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))

    def forward(self, image):
        return self.features(image)


@pytest.mark.parametrize("optimise", ["image", "model"])
def test_an_image_optimised_through_a_frozen_model_is_no_frozen_or_detached_model(optimise):
    extractor = StyleExtractor().requires_grad_(False).eval()
    content = torch.rand(1, 3, 8, 8)
    target = extractor(content).detach()
    image = torch.rand(1, 3, 8, 8, requires_grad=True)
    loss_fn = nn.MSELoss()
    params = [image] if optimise == "image" else list(extractor.parameters())
    optimizer = torch.optim.Adam(params, lr=0.05)
    with Monitor(extractor, optimizer, every=5) as mon:
        for _ in range(30):
            optimizer.zero_grad()
            loss = loss_fn(extractor(image), target)
            if loss.requires_grad:
                loss.backward()
            optimizer.step()
            mon.log(loss)
    report = nndx.probe(extractor, (image.detach().clone(), target), loss_fn, optimizer=optimizer, monitor=mon)
    findings = nndx.diagnose(report).findings
    alarms = {f.rule_id for f in findings if f.severity != "info"}
    if optimise == "image":
        assert alarms == set(), [(f.rule_id, f.symptom) for f in findings]
        assert report.probes.overfit_one_batch.status == "skipped" and "outside it" in report.probes.overfit_one_batch.message
        assert not report.errors, report.errors
    else:
        assert next(f for f in findings if f.rule_id == "NNDX305").severity == "error"


def test_a_frozen_extractor_left_in_train_mode_is_named_and_a_gan_player_frozen_in_turn_is_not():
    """The style-transfer tutorial's bug: the VGG extractor frozen but never put in eval mode,
    so its batch-norm normalises one image by its own statistics. A GAN's discriminator is
    also frozen in train mode, but only while the generator steps: it trains too."""
    extractor = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).requires_grad_(False)
    image = torch.rand(1, 3, 8, 8, requires_grad=True)
    optimizer = torch.optim.Adam([image], lr=0.05)
    wrapper = nn.ModuleDict({"features": extractor})  # the tutorial's loop calls the model inside what nndx watches
    for watched, run in ((extractor, extractor), (wrapper, wrapper["features"])):
        with Monitor(watched, optimizer, every=5) as mon:
            for _ in range(10):
                optimizer.zero_grad()
                loss = run(image).square().mean()
                loss.backward()
                optimizer.step()
                mon.log(loss)
        assert fired(mon.report(), "NNDX328")

    torch.manual_seed(0)
    D = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
    with Monitor(D, opt_d, every=5) as mon:
        for i in range(10):  # frozen first, as while the generator steps
            D.requires_grad_(i % 2 == 1)
            loss = D(torch.randn(16, 8)).square().mean()
            if i % 2 == 1:
                opt_d.zero_grad()
                loss.backward()
                opt_d.step()
                mon.log(loss)
    assert mon.report().loop.frozen_train_mode_forwards == 0 and not fired(mon.report(), "NNDX328")


class UncalledHead(nn.Module):
    """JEM's CCF: an energy head its forward never calls, beside the class head it trains."""

    def __init__(self, call_head: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.class_output, self.energy_output = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 1)
        self.call_head = call_head

    def forward(self, x):
        h = torch.relu(self.body(x))
        if self.call_head:
            self.energy_output(h.detach())  # runs, its output cut from the loss
        return self.class_output(h)


@pytest.mark.parametrize("call_head", [False, True])
def test_a_head_the_forward_never_calls_is_unused_and_one_it_cuts_is_not(call_head):
    model = UncalledHead(call_head)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with Monitor(model, optimizer, every=2) as mon:
        for _ in range(6):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            mon.log(loss)
    report = mon.report()
    (finding,) = fired(report, "NNDX304")
    assert report.loop.layers_never_run == ([] if call_head else ["energy_output"])
    assert finding.severity == ("warning" if call_head else "info")


def test_a_logged_loss_whose_graph_cannot_be_read_is_an_error_in_the_report_not_in_the_loop(monkeypatch):
    from nndx.collector.watch import loop as loop_watch

    def unreadable(*_args, **_kwargs):
        raise RuntimeError("graph walk failed")

    monkeypatch.setattr(loop_watch, "ops_before_loss", unreadable)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt) as mon:
        optimizer_loop(mon, model, opt)
    assert any("graph walk failed" in e.message for e in mon.report().errors)


def test_a_model_with_lazy_parameters_is_watched_once_its_first_forward_gives_them_values():
    """d2l's concise models are built of ``nn.LazyLinear``: no values until the first
    forward, which comes after the Monitor attaches. The Monitor attaches anyway, hooks the
    parameters once they have values, says it kept no initial state, and removes it all."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(1))
    x, y = torch.randn(64, 20), torch.randn(64, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nndx.Monitor(model, optimizer)
    for _ in range(20):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # no zero_grad: the gradients accumulate
        optimizer.step()
        mon.log(loss)
    report = mon.report()
    mon.close()
    assert report.loop.steps == 20 and report.errors == []
    assert any("initial state not kept" in line and "lazy" in line for line in report.loop.limitations)
    assert {p.name for p in report.parameters if p.grad_norm} >= {"0.weight", "2.weight"}
    assert "MISSING_ZERO_GRAD" in {f.code.value for f in nndx.diagnose(report).findings}
    assert all(not p._backward_hooks for p in model.parameters())


class PlainTensorSoftmax(nn.Module):
    """d2l's SoftmaxRegressionScratch: W and b are plain tensors with requires_grad, handed to
    the optimizer through an overridden ``parameters()``; the module registers none."""

    def __init__(self):
        super().__init__()
        self.W = torch.normal(0, 0.01, size=(16, 4), requires_grad=True)
        self.b = torch.zeros(4, requires_grad=True)

    def parameters(self, recurse: bool = True):
        return [self.W, self.b]

    def forward(self, x):
        return x @ self.W + self.b


def test_a_model_that_registers_no_parameter_is_not_cut_from_its_loss():
    """It registers no trainable parameter; the plain tensors it holds that require grad are
    watched in their place, and its logged loss reaches them (the run learns). NNDX304 stays quiet."""
    torch.manual_seed(0)
    model = PlainTensorSoftmax()
    x, y = torch.randn(128, 16), torch.randint(0, 4, (128,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = nndx.Monitor(model, optimizer)
    for _ in range(30):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        mon.log(loss)
    report = mon.report()
    mon.close()
    assert report.loop.logged_loss_reaches_params is True
    assert "NNDX304" not in {f.rule_id for f in nndx.diagnose(report).findings}


class LinearRegressionScratch(nn.Module):
    """d2l's from-scratch linear regression: its weights are plain tensors that require grad,
    no nn.Parameter, trained by a hand-written SGD over [w, b]."""

    def __init__(self, inputs: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.normal(0, 0.01, (inputs, 1), requires_grad=True)
        self.b = torch.zeros(1, requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w + self.b


@pytest.mark.parametrize("zero_grad", [True, False])
def test_plain_tensors_a_model_trains_are_watched_like_parameters(zero_grad):
    """The model registers no parameter: before, the Monitor saw no backward and no update, and
    d2l's fit without zero_grad read only as a loss that swings (LR_TOO_HIGH). The tensors the
    model holds that require grad are watched instead, and a note names them."""
    model = LinearRegressionScratch(2)
    opt = BasicOptim([model.w, model.b], 0.03)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(320, 2, generator=gen)
    y = x @ torch.tensor([[2.0], [-3.4]]) + 4.2 + 0.01 * torch.randn(320, 1, generator=gen)
    with Monitor(model, opt, every=3) as mon:
        for epoch in range(3):
            for i in range(0, 320, 32):
                loss = ((model(x[i : i + 32]) - y[i : i + 32]) ** 2 / 2).mean()
                loss.backward()
                mon.log(loss)
                opt.step()
                if zero_grad:
                    opt.zero_grad()
    report = mon.report()
    assert report.loop.steps == 30 and report.loop.backward_calls == 30
    assert any("w, b" in text for text in report.loop.limitations)
    assert {p.name for p in report.parameters} == {"w", "b"}
    codes = {f.code for f in nndx.diagnose(report).findings if f.severity != "info"}
    assert codes == ({"MISSING_ZERO_GRAD"} if not zero_grad else set())
    # the probes train a copy's plain tensors too (before: "the model has no trainable parameters")
    probed = nndx.probe(model, (x[:32], y[:32]), lambda out, t: ((out - t) ** 2 / 2).mean(), optimizer=opt,
                        probes=["hooks", "overfit_one_batch"])  # fmt: skip
    assert probed.errors == [] and probed.probes.overfit_one_batch.status in ("passed", "failed")  # it ran


def _clip_by_hand(model: nn.Module, theta: float) -> None:  # d2l's grad_clipping
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.sqrt(sum(torch.sum(p.grad**2) for p in params))
    if norm > theta:
        for p in params:
            p.grad[:] *= theta / norm


@pytest.mark.parametrize("where", ["before_step", "after_step", "by_hand_after_step", "zeroed_after_step",
                                   "another_backward_after_step"])
def test_a_clip_placed_after_the_step_is_seen_and_nothing_else_is(where):
    """d2l's grad_clipping moved below updater.step(): the clip shrinks gradients the step
    already used. Seen as every gradient scaled by one factor under 1 between the step and the
    loop's next event; a clip before the step, gradients zeroed by hand, or another backward
    adding to them (a GAN's generator pass through the discriminator) are not."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()
    with Monitor(model, opt, every=2) as mon:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if where == "before_step":
                nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            opt.step()
            if where == "after_step":
                nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            elif where == "by_hand_after_step":
                _clip_by_hand(model, 1e-3)
            elif where == "zeroed_after_step":
                for p in model.parameters():
                    p.grad.zero_()
            elif where == "another_backward_after_step":
                F.cross_entropy(model(x * 2), y).backward()
            mon.log(loss)
    points = mon.report().loop.clipped_after_step
    if where in ("after_step", "by_hand_after_step"):
        assert len(points) >= STEPS // 2 - 1 and all(0 < p.value < 0.1 for p in points), points
    else:
        assert points == [], points


def test_a_clip_that_flushes_negligible_gradients_to_zero_masks_nothing():
    """d2l's seq2seq under Adam at lr 1: saturated GRU gates leave gradients of ~1e-44 beside ones of
    ~1, and grad_clipping's ``param.grad[:] *= theta / norm`` (0.01) flushes the first to exactly 0.
    Those were never a gradient worth masking: FROZEN_PARAMETERS (NNDX330) ranked over the LR. A mask
    that zeroes gradients of ordinary size is still counted."""

    def run(after_backward) -> nndx.report.DiagnosticReport:
        torch.manual_seed(0)
        model = mlp()
        first = next(model.parameters())
        half = first.shape[0] // 2

        def saturated(grad: torch.Tensor) -> torch.Tensor:  # subnormal gradients beside ordinary ones
            return torch.cat([torch.full_like(grad[:half], 1e-44), grad[half:]])

        first.register_hook(saturated)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        x, y = data()
        with Monitor(model, opt, every=1) as mon:
            for _ in range(4):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                with torch.no_grad():
                    after_backward(first)
                opt.step()
        return mon.report()

    def clip(p):
        p.grad.mul_(0.01)

    def mask(p):
        p.grad[p.shape[0] // 2 :][p.detach()[p.shape[0] // 2 :] < 0] = 0.0

    clipped = run(clip)
    assert clipped.loop.grads_masked_by_hand == {}, clipped.loop.grads_masked_by_hand
    masked = run(mask)
    assert 0.1 < max(masked.loop.grads_masked_by_hand.values()) < 0.5, masked.loop.grads_masked_by_hand


@pytest.mark.parametrize("layout", ["time_major", "batch_first_into_time_major", "fixed_length_two_batch_sizes"])
def test_a_recurrent_layer_fed_its_axes_swapped_is_seen_over_the_run(layout):
    """bentrevett's seq2seq with pad_sequence(batch_first=True) into its time-major LSTM: its time axis
    holds the batch size while its batch axis takes every padded length. Fed time-major, the lengths vary
    the time axis; windows of one length (a validation batch of another size beside) say nothing."""
    torch.manual_seed(0)
    embed, lstm, head = nn.Embedding(20, 8), nn.LSTM(8, 16), nn.Linear(16, 20)
    model = nn.ModuleDict({"embed": embed, "lstm": lstm, "head": head})
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    with Monitor(model, opt) as mon:
        for i in range(12):
            batch = 16 if layout != "fixed_length_two_batch_sizes" or i % 4 else 64
            length = 12 if layout == "fixed_length_two_batch_sizes" else 4 + i
            tokens = torch.randint(0, 20, (batch, length))  # (batch, time), as pad_sequence(batch_first=True) gives
            if layout != "batch_first_into_time_major":
                tokens = tokens.T
            opt.zero_grad()
            out, _ = lstm(embed(tokens))
            loss = F.cross_entropy(head(out).reshape(-1, 20), tokens.reshape(-1))
            loss.backward()
            opt.step()
            mon.log(loss)
    report = mon.report()
    (seen,) = report.loop.recurrent_inputs
    assert seen.name == "lstm" and seen.forwards == 12 and seen.batch_first is False
    assert bool(fired(report, "NNDX624")) == (layout == "batch_first_into_time_major"), seen


@pytest.mark.parametrize("monitors", ["one", "two"])
@pytest.mark.parametrize("data", ["scaled", "left_in_0_1", "sigmoid_generator"])
def test_generated_values_fed_beside_data_of_another_range_are_named(monitors, data):
    """udacity's and persson's GANs with the real images left in [0, 1] beside a Tanh generator, and
    yunjey's with a Sigmoid generator beside images in [-1, 1]: the discriminator tells fakes by
    their range. Its fakes arrive detached in its own step (the same storage as the generator's
    output) and attached in the generator's; real data of the generator's range is healthy."""
    torch.manual_seed(0)
    out = nn.Sigmoid() if data == "sigmoid_generator" else nn.Tanh()
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), out)
    D = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), 1e-3), torch.optim.Adam(D.parameters(), 1e-3)
    images = torch.rand(512, 1, 4, 4, generator=torch.Generator().manual_seed(1))  # flat fakes beside (1, 4, 4) images
    images = images if data == "left_in_0_1" else images * 2 - 1
    bce = nn.BCEWithLogitsLoss()
    if monitors == "one":
        mon_g = mon_d = Monitor({"G": G, "D": D}, [opt_g, opt_d], every=5)
    else:
        mon_g, mon_d = Monitor(G, opt_g, every=5), Monitor(D, opt_d, every=5)
    for _ in range(30):
        fake = G(torch.randn(32, 8))
        real = images[torch.randint(0, 512, (32,))]
        loss_d = bce(D(real), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = bce(D(fake), torch.ones(32, 1))
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        mon_d.log(loss_d, split="D" if monitors == "one" else "train")
        mon_g.log(loss_g, split="G" if monitors == "one" else "train")
    mon_g.close(), mon_d.close()
    report = mon_d.report()
    (fed,) = report.loop.fed_inputs
    assert fed.model == ("D" if monitors == "one" else "") and fed.position == 0
    assert fed.fed_forwards >= 50 and fed.own_forwards >= 25  # both D(fake.detach()) and D(fake) count as fed
    named = {f.rule_id for f in nndx.diagnose(report).findings} & {"NNDX332", "NNDX333"}
    assert named == {"scaled": set(), "left_in_0_1": {"NNDX332"}, "sigmoid_generator": {"NNDX333"}}[data]
    if monitors == "two":
        assert mon_g.report().loop.fed_inputs == []  # the generator is fed noise only


def test_a_discriminator_fed_the_generators_output_concatenated_with_labels_is_trained_against_it():
    """Morvan's conditional GAN: D(torch.cat((G_paintings, labels), 1)), a new tensor, in the generator's step.
    Its loss at equilibrium need not fall (it read as LR_TOO_LOW, warning, on the healthy run)."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(9, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
    opt_g, opt_d = torch.optim.Adam(G.parameters(), 1e-4), torch.optim.Adam(D.parameters(), 1e-4)
    mon_g, mon_d = Monitor(G, opt_g, every=5), Monitor(D, opt_d, every=5)
    for _ in range(12):
        labels = torch.randint(0, 2, (16, 1)).float()
        real = torch.randn(16, 8) + labels
        paintings = G(torch.cat((torch.randn(16, 4), labels), 1))
        loss_g = torch.mean(torch.log(1.0 - D(torch.cat((paintings, labels), 1))))
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        prob_real = D(torch.cat((real, labels), 1))
        prob_fake = D(torch.cat((paintings.detach(), labels), 1))
        loss_d = -torch.mean(torch.log(prob_real) + torch.log(1.0 - prob_fake))
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        mon_g.log(loss_g)
        mon_d.log(loss_d)
    mon_g.close(), mon_d.close()
    assert mon_d.report().loop.logged_loss_through_other_models is True
