"""Hook-statistics probe: one recorded forward + backward and one optimizer step, on a copy.

How to use::

    stats = hook_statistics(model, (x, y), loss_fn, optimizer=optimizer)
    stats.layers, stats.parameters, stats.model   # -> report.layers / .parameters / .model

The statistics themselves come from :mod:`nndx.collector.stats` (``LayerRecorder``,
``parameter_stats``), the same code the Monitor uses, so a probe and a training run
report comparable numbers. The update/weight ratio needs a real optimizer step: it is
taken on a copy with a copy of the user's optimizer when it holds the model's
parameters (so the ratio reflects the user's learning rate), else with a fresh
optimizer (see ``copy_with_optimizer``). The user's model and optimizer are never stepped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
from torch import nn

from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    copy_with_optimizer,
    forward,
    map_tensors,
    optimizer_step,
    preserved_rng,
    seed_all,
    split_batch,
    train_in_float32,
)
from nndx.collector.loss_call import InnerLossCalls
from nndx.collector.probes._observe import ForwardObserver, observed_summary
from nndx.collector.stats import (
    LayerRecorder,
    parameter_stats,
    snapshot_parameters,
    summarize_model,
)
from nndx.collector.probes import ProbeSpec
from nndx.report import DiagnosticReport, LayerStats, ModelSummary, ParameterStats


class HookStatistics(NamedTuple):
    layers: list[LayerStats]
    parameters: list[ParameterStats]
    model: ModelSummary
    optimizer: str  # which optimizer took the step, in words


def hook_statistics(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    step: int = 0,
) -> HookStatistics:
    """Per-layer activation/gradient statistics and per-parameter weight norm, grad norm
    and update/weight ratio over one batch. ``lr`` is for nndx's own Adam, used only when
    no usable ``optimizer`` is given."""
    inputs, targets = split_batch(batch)
    with preserved_rng():
        model_copy, opt, note = copy_with_optimizer(model, optimizer, lambda p: torch.optim.Adam(p, lr=lr))
        opt.zero_grad(set_to_none=True)  # the copy may carry the user's stale .grad
        # nndx's own Adam on float16 weights is NaN in one step (its eps is 0 in float16):
        # then the step is taken as mixed precision takes it; the user's optimizer as it is
        precision = train_in_float32(model_copy, opt) if note.startswith("nndx's own") else contextlib.nullcontext()
        with LayerRecorder(model_copy) as recorder, ForwardObserver(model_copy, layer_stats=True) as seen, precision:
            recorder.start_step(step)
            output = forward(model_copy, inputs)
            with InnerLossCalls() as inner:
                loss = compute_loss(loss_fn, output, targets)
        # a model with nothing to train (style transfer's frozen extractor, whose optimizer trains the image):
        # its activations are measured, and there is no gradient or step to take. A model that has trainable
        # parameters takes its backward: a loss cut from them raises, and that is evidence (NNDX707)
        trains = any(p.requires_grad for p in nn.Module.parameters(model_copy))
        if trains:
            loss.backward()
        layers = _in_forward_order(recorder.finish_step() + seen.layer_records(step), seen.timeline)
        try:
            unused = _unused_modules(model_copy, inputs, targets, loss_fn, seen.params_read) if trains else []
        except Exception:  # noqa: BLE001 - an extra forward the model cannot take: no claim, the statistics stand
            unused = []
        before = snapshot_parameters(model_copy)
        if trains:
            optimizer_step(opt, lambda: compute_loss(loss_fn, forward(model_copy, inputs), targets))
        parameters = parameter_stats(model_copy, before, step)
    # the summary wants every leaf (dropout, flatten...) in the order it ran
    summary = observed_summary(summarize_model(model, [n for n in seen.timeline if n in dict(model.named_modules())]),
                               seen, output, inner.last[1] if inner.last is not None else None)  # fmt: skip
    summary.unused_modules = unused
    return HookStatistics(layers, parameters, summary, note)


def _unused_modules(model: nn.Module, inputs: object, targets: object, loss_fn: LossFn, params_read: set[int],
                    limit: int = 8) -> list[str]:  # fmt: skip
    """Modules whose trainable parameters got no gradient in the backward just taken and
    that cannot move the loss: they never ran, or their output, perturbed, leaves the loss
    as it was (computed and thrown away: a backbone's classifier under a feature hook, a
    pooler no head reads). A graph cut by ``.detach()`` is told apart by the same forward:
    the detached value still reaches the loss, so perturbing it moves the loss. Parameters
    no torch call of the forward read (``params_read``), in a module that otherwise learns,
    are named on their own (GIN's ``eps`` with learn_eps off): no forward reads them."""
    unread = [name for name, p in nn.Module.named_parameters(model)
              if p.requires_grad and p.grad is None and id(p) not in params_read]  # fmt: skip
    silent = [name for name, module in nn.Module.named_modules(model)  # not an override: MAML's learner has one
              if (own := [p for p in nn.Module.parameters(module, recurse=False) if p.requires_grad])
              and all(p.grad is None for p in own)]  # fmt: skip
    if not silent:
        return unread
    modules = dict(nn.Module.named_modules(model))
    ran: set[str] = set()
    reference = _loss_with(model, inputs, targets, loss_fn, {n: modules[n] for n in silent}, ran, perturb=False)
    unused = [n for n in silent if n not in ran]

    def moves(names: list[str]) -> bool:
        chosen = {n: modules[n] for n in names}
        changed = _loss_with(model, inputs, targets, loss_fn, chosen, set(), perturb=True)
        if not torch.isclose(changed, reference, rtol=1e-4, atol=1e-6).item():
            return True
        # an output that only indexes (a top-k pool's node ids beside gate scores nothing multiplies in) is
        # perturbed as floats to no effect; the module's own parameters still pick the indices
        with _parameters_perturbed(chosen.values()):
            changed = _loss_with(model, inputs, targets, loss_fn, {}, set(), perturb=False)
        return not torch.isclose(changed, reference, rtol=1e-4, atol=1e-6).item()

    ran_silent = [n for n in silent if n in ran]
    if ran_silent and not moves(ran_silent):
        unused += ran_silent
    elif 1 < len(ran_silent) <= limit:
        unused += [n for n in ran_silent if not moves([n])]
    unused = sorted(unused, key=silent.index)
    return unused + [name for name in unread if name.rpartition(".")[0] not in unused]


def _loss_with(model: nn.Module, inputs: object, targets: object, loss_fn: LossFn, modules: dict[str, nn.Module],
               ran: set[str], *, perturb: bool) -> torch.Tensor:
    """The loss of one no-grad forward with the randomness seeded (dropout, augmentations
    drawn alike each time); ``perturb`` adds noise of their own scale to ``modules``'
    outputs, from a generator of its own so that nothing downstream draws differently."""
    generator: dict[torch.device, torch.Generator] = {}

    def hook(name: str):  # noqa: ANN202
        def record(_module: nn.Module, _args: object, output: object) -> object:
            ran.add(name)
            if not perturb:
                return None
            return _perturbed(output, generator)
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in modules.items()]
    try:
        seed_all(0)
        with torch.no_grad():
            return compute_loss(loss_fn, forward(model, inputs), targets).detach().double()
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _parameters_perturbed(modules: Iterable[nn.Module]) -> Iterator[None]:
    """The modules' own trainable parameters with noise of their scale added, restored after."""
    params = [p for m in modules for p in nn.Module.parameters(m, recurse=False) if p.requires_grad]
    kept = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(1234)  # not 0: a model seeded 0 draws that very noise as weights
    with torch.no_grad():
        for p in params:
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device)
            p.add_(noise * (p.abs().mean() + 1))
    try:
        yield
    finally:
        with torch.no_grad():
            for p, value in zip(params, kept):
                p.copy_(value)


def _perturbed(output: object, generators: dict[torch.device, torch.Generator]) -> object:
    def noisy(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or t.numel() == 0:
            return t
        g = generators.setdefault(t.device, torch.Generator(device=t.device).manual_seed(0))
        return t + torch.randn(t.shape, generator=g, device=t.device, dtype=t.dtype) * (t.detach().abs().mean() + 1)

    return map_tensors(output, noisy)


def _in_forward_order(layers: list[LayerStats], timeline: list[str]) -> list[LayerStats]:
    rank = {name: i for i, name in enumerate(timeline)}
    return sorted(layers, key=lambda layer: rank.get(layer.name, len(rank)))


def _record(report: DiagnosticReport, stats: HookStatistics) -> str:
    report.layers, report.parameters, report.model = stats.layers, stats.parameters, stats.model
    return "done"


# named "hooks" in reports, options and the CLI since before this module had its name
SPEC = ProbeSpec(name="hooks", title="layer statistics", function=hook_statistics, order=10, train_mode=True,
                 record=_record)
