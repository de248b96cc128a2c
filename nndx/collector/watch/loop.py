"""What the loop did: forwards, backward passes, gradient resets, and which parameters
the optimizer and the gradients reached.

Counting conventions (what the rules read):

- ``backward_calls`` counts each backward pass (``loss.backward()`` or
  ``torch.autograd.grad`` reaching a watched parameter) once.
- ``zero_grad_calls`` counts gradient *resets*: ``optimizer.zero_grad()``,
  ``model.zero_grad()``, or gradients of the first trainable parameter cleared by hand
  (``p.grad = None`` / ``p.grad.zero_()``) — at most one between two backward passes, so
  calling both ``optimizer.zero_grad()`` and ``model.zero_grad()`` counts once. Hence
  ``backward_calls / zero_grad_calls`` is the accumulation factor: 1 for a plain loop,
  ``k`` for deliberate accumulation, and ``zero_grad_calls == 0`` with several steps
  means gradients were never reset.
- ``no_grad_forwards_in_train_mode`` counts forwards run with grad disabled
  (``torch.no_grad`` / ``inference_mode``) while ``model.training`` is True, only for
  models with dropout or batch-norm (where train mode changes the output);
  ``no_grad_train_forward_steps`` the distinct steps they ran at.
- ``train_mode_evaluations`` counts losses logged under an evaluation split (``"val"``,
  ``"test"``...) after forwards with grad enabled in train mode and no backward since, in
  those same models: a validation loop without ``torch.no_grad()`` and without
  ``model.eval()`` (dropout still on), which ``no_grad_forwards_in_train_mode`` cannot see.
- ``backward_after_eval_forward`` counts the mirror image: backward passes whose last
  forward of the model ran in eval mode (``model.eval()`` for validation, and no
  ``model.train()`` back), in those same models; ``first_eval_backward_step`` is the
  step of the first. A loop that calls ``model.forward(...)`` directly skips the model's
  hooks; its layers' forwards tell the mode then.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

import torch
from torch import nn

from nndx.collector._common import has_nonfinite, iter_tensors, orphaned_trainables
from nndx.collector.stats import (
    frozen_at_init, frozen_fingerprints, has_batchnorm, has_dropout, mode_modules, tracking_copies,
)
from nndx.collector.watch.base import StepContext, Watched, Watcher


LOSS_CHECKS = 3
EVALUATION_SPLITS = frozenset({"val", "valid", "validation", "test", "eval", "dev"})
MAX_LOSS_PATHS = 8
WALK_LIMIT = 10_000  # autograd nodes; a longer walk says nothing (counted as reaching)


# A model fed another watched model's output, or a loss whose graph runs through that output, is trained
# against or on top of that model even when no parameter of it is in the graph: GAN loops switch each
# player's requires_grad off while the other steps (StyleGAN2's). So every Monitor's models leave their id
# on their outputs: in the metadata of the output's grad_fn (it lives and dies with the graph), and for an
# output with no graph, in a weak reference to the last one, by model id (nothing is kept alive).
_MADE_BY = "nndx_model"
_LAST: dict[int, weakref.ref] = {}


def remember_output(output: Any, model_id: int) -> None:
    first = next(iter_tensors(output), None)
    if first is None:
        return
    _LAST[model_id] = weakref.ref(first)
    if first.grad_fn is not None:
        first.grad_fn.metadata[_MADE_BY] = model_id


def forget_outputs(model_ids: set[int]) -> None:
    for model_id in model_ids:
        _LAST.pop(model_id, None)


def _made_by_other(node: Any, models: set[int]) -> bool:
    maker = node.metadata.get(_MADE_BY) if hasattr(node, "metadata") else None
    return maker is not None and maker not in models


def watched_outputs() -> int:
    """How many watched models' last outputs are remembered."""
    return len(_LAST)


def other_models_output(t: torch.Tensor, besides: set[int]) -> bool:
    """Whether ``t`` is the last output of a watched model not in ``besides``, or a view or a
    ``.detach()`` of it (the same storage: a GAN's discriminator given ``fake.detach()``)."""
    for model_id, ref in list(_LAST.items()):
        last = ref() if model_id not in besides else None
        if last is not None and (last is t or _same_storage(last, t)):
            return True
    return False


FED_WALK = 16  # autograd nodes walked back from a forward's input for another watched model's output


def _made_from_other(t: torch.Tensor, models: set[int]) -> bool:
    """Whether ``t`` was computed, a few ops on, from the output of a watched model not in ``models``
    (a conditional GAN's discriminator given torch.cat((fake, labels), 1): a new tensor, not the fake)."""
    todo, seen = [t.grad_fn], 0
    while todo and seen < FED_WALK:
        node = todo.pop()
        if node is None:
            continue
        seen += 1
        if _made_by_other(node, models):
            return True
        todo.extend(child for child, _ in node.next_functions)
    return False


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.layout != torch.strided or b.layout != torch.strided or a.device != b.device:
        return False
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0
    except (RuntimeError, NotImplementedError):  # a tensor subclass or a meta tensor with no storage to read
        return False


def _reaches(root: Any, params: set[int], models: set[int] = frozenset()) -> tuple[bool, bool]:
    """Whether the autograd graph from ``root`` reaches one of ``params`` (by id), and
    whether it reaches a trainable parameter of another network (a GAN's generator loss
    runs through the discriminator), or the output of a model another Monitor watches (not
    one of ``models``). A walk cut short counts as reaching ``params``."""
    seen: set[Any] = set()
    stack = [root]
    own = other = False
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        if len(seen) >= WALK_LIMIT:
            return True, other
        seen.add(node)
        variable = getattr(node, "variable", None)
        if id(variable) in params:
            own = True
        elif isinstance(variable, nn.Parameter):
            other = True
        elif models and _made_by_other(node, models):
            other = True
        stack.extend(child for child, _ in node.next_functions)
    return own, other


def ops_before_loss(root: Any, models: set[int], limit: int = WALK_LIMIT) -> list[tuple[str, ...]]:
    """The autograd ops from the op that made an output of one of ``models`` to the loss at
    ``root`` (``("Addmm", "Softmax", "Index", "LogSoftmax", "NllLoss", "Mean")``), one path per
    output node reached: what the loop did to the outputs, whichever way it called the loss. An
    op the path enters through its second input or later carries the input's index
    (``"KlDiv#1"``: the target of ``kl_div``, not its input).
    The nodes' structure outlives their saved tensors, so a loss logged after its backward
    still shows it."""
    paths: list[tuple[str, ...]] = []
    seen: set[Any] = set()
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    while stack and len(seen) < limit:
        node, after = stack.pop()
        if node is None or node in seen or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(node)
        op = re.sub(r"Backward\d*$", "", type(node).__name__)
        if getattr(node, "metadata", {}).get(_MADE_BY) in models:
            paths.append((op, *after[::-1]))
            continue
        # entered through its second input or later: "KlDiv#1" (the target of kl_div(log_p, q))
        stack.extend((child, (*after, f"{op}#{slot}" if slot else op))
                     for slot, (child, _) in enumerate(node.next_functions))  # fmt: skip
    return paths


class _GradReset:
    """Whether one parameter's gradient was reset since it was last remembered: replaced,
    deleted, or changed in place to all zeros (``optimizer.zero_grad()`` with either
    ``set_to_none``, ``model.zero_grad()``, ``p.grad = None``, ``p.grad.zero_()``). Changed
    in place to anything else is no reset: backward accumulating, clipping and a
    GradScaler's ``unscale_`` do that (and a step the scaler skips on non-finite gradients
    is followed by no ``optimizer.step()`` that would say so). One parameter stands for its
    group: a reset touches all of an optimizer's gradients or none."""

    def __init__(self) -> None:
        self.param: torch.Tensor | None = None
        self._seen: tuple[int, int] | None = None

    def follow(self, params: Any) -> None:
        """Follow the first of ``params`` that has a gradient (after a backward pass)."""
        self.param = next((p for p in params if p.grad is not None), None)
        self.remember()

    def remember(self) -> None:
        grad = self.param.grad if self.param is not None else None
        self._seen = None if grad is None else (id(grad), grad._version)

    def happened(self) -> bool:
        if self._seen is None or self.param is None:
            return False
        grad = self.param.grad
        if grad is None or id(grad) != self._seen[0]:
            return True
        return grad._version != self._seen[1] and not bool(grad.detach().any())


class LoopCounts(Watcher):
    """Counters of the loop's events and the parameter coverage facts."""

    name = "loop"

    def __init__(self, watched: Watched) -> None:
        self.watched = watched
        self.backward_calls = 0
        self.backward_calls_in_step = 0  # inside optimizer.step(): a closure (L-BFGS, Lightning)
        self.zero_grad_calls = 0
        self.forward_calls = 0
        self.no_grad_forwards_in_train_mode = 0
        self._no_grad_steps: set[int] = set()
        self.backward_after_eval_forward = 0
        self.first_eval_backward_step: int | None = None
        self.train_mode_evaluations = 0
        self._train_mode_forwards = 0  # with grad, in train mode, since the last backward
        self._last_forward_in_eval = False
        self._in_forward: set[int] = set()  # models inside their own forward (between its hooks)
        self._reset_since_backward = False
        self._backward_since_reset = 0
        self.backward_since_reset_at_steps = 0
        self._never_grad = dict(watched.params)
        self._frozen_before = frozen_fingerprints(watched.root)  # frozen weights a momentum update moves
        # per model: does train mode change its output (dropout, batch-norm)?
        self._has_dropout = any(has_dropout(m) for m in watched.models.values())
        self._has_batchnorm = any(has_batchnorm(m) for m in watched.models.values())
        self._mode_modules = {id(m): mode_modules(m) for m in watched.models.values()}
        self.logged_losses_checked = 0  # the first logged losses with a graph: do they reach the parameters?
        self.logged_losses_reaching = 0
        self.logged_losses_through_others = 0  # through another network's trainable parameters too
        self.ops_before_loss: list[tuple[str, ...]] = []  # from a model's output to those losses
        self._models = {id(m) for m in watched.models.values()}
        self.fed_by_other_model = False  # a model given another Monitor's model's output as input
        self._ever_trainable = False  # a model with a trainable parameter at some forward (a GAN player frozen in turn)
        self._frozen_train_mode_forwards = 0
        self._reference = _GradReset()  # one parameter whose .grad tells a reset by hand
        # per optimizer: a loop with several (encoder and decoder, a GAN's two) may reset one
        # optimizer's gradients and forget the other's, which the counts above cannot tell
        self._resets = {id(o): _GradReset() for o in watched.optimizers}
        self._reset_before_step = {id(o): False for o in watched.optimizers}
        self.optimizer_steps = {id(o): 0 for o in watched.optimizers}
        # whose zero_grad() resets which optimizers' gradients: its own, or those holding a model's parameters
        held = {id(o): {id(p) for g in o.param_groups for p in g["params"]} for o in watched.optimizers}
        self._resets_of = {id(o): [id(o)] for o in watched.optimizers} | {
            id(m): [k for k, ids in held.items() if any(id(p) in ids for p in nn.Module.parameters(m))]
            for m in watched.models.values()}  # fmt: skip
        self.steps_without_reset = {id(o): 0 for o in watched.optimizers}

    def on_forward(self, ctx: StepContext, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._in_forward.add(id(module))
        self.forward_calls += 1
        if not self.fed_by_other_model and len(_LAST) > 1:
            self.fed_by_other_model = any(other_models_output(t, self._models) or _made_from_other(t, self._models)
                                          for t in iter_tensors(args))  # fmt: skip
        if not torch.is_grad_enabled() and any(m.training for m in self._mode_modules.get(id(module), ())):
            self.no_grad_forwards_in_train_mode += 1
            self._no_grad_steps.add(ctx.step)
        if torch.is_grad_enabled():
            self._forward_with_grad(module)
            self._train_mode_forwards += any(m.training for m in self._mode_modules.get(id(module), ()))

    def on_forward_end(self, ctx: StepContext, module: nn.Module, args: tuple, output: Any) -> None:
        self._in_forward.discard(id(module))
        remember_output(output, id(module))

    def layer_forward(self, model: nn.Module) -> None:
        """A direct child of ``model`` ran outside ``model``'s own forward: the loop called
        ``model.forward(...)`` itself (barlowtwins' ``loss = model.forward(y1, y2)``), which
        skips the model's hooks. Its mode is still ``model.training``."""
        if id(model) not in self._in_forward and torch.is_grad_enabled():
            self._forward_with_grad(model)

    def _forward_with_grad(self, model: nn.Module) -> None:
        self._last_forward_in_eval = self._in_eval(model)
        if not self._ever_trainable:
            self._ever_trainable = any(p.requires_grad for p in nn.Module.parameters(model))
            training = any(m.training for m in self._mode_modules.get(id(model), ()))
            self._frozen_train_mode_forwards += not self._ever_trainable and training

    def _in_eval(self, model: nn.Module) -> bool:
        """In eval mode, and a model whose output the mode changes (dropout, batch-norm). The root's
        flag: a batch-norm frozen in eval inside a model that trains is a fine-tuning recipe."""
        return not model.training and bool(self._mode_modules.get(id(model)))

    def on_backward_start(self, ctx: StepContext) -> None:
        if not self._reset_since_backward and self._reference.happened():
            self.zero_grad_calls += 1
            self._backward_since_reset = 0
        for key, reset in self._resets.items():  # resets by hand: p.grad = None, p.grad.zero_()
            self._reset_before_step[key] = self._reset_before_step[key] or reset.happened()

    def on_backward_end(self, ctx: StepContext) -> None:
        self.backward_calls += 1
        self._train_mode_forwards = 0
        self.backward_calls_in_step += ctx.optimizer is not None
        self._backward_since_reset += 1
        if self._last_forward_in_eval:
            self.backward_after_eval_forward += 1
            if self.first_eval_backward_step is None:
                self.first_eval_backward_step = ctx.step
        self._reset_since_backward = False
        if self._never_grad:
            for name in [n for n, p in self._never_grad.items() if p.grad is not None]:
                del self._never_grad[name]
        self._reference.follow(p for _, p in self.watched.params)
        for optimizer in self.watched.optimizers:
            self._resets[id(optimizer)].follow(p for g in optimizer.param_groups for p in g["params"] if not p.is_complex())

    def on_zero_grad(self, ctx: StepContext, owner: object = None) -> None:
        if not self._reset_since_backward:
            self.zero_grad_calls += 1
            self._reset_since_backward = True
        self._backward_since_reset = 0
        # a reset through zero_grad() is known without reading a gradient (a host sync on a GPU)
        for key in self._resets_of.get(id(owner), []):
            self._reset_before_step[key] = True

    def on_step_begin(self, ctx: StepContext) -> None:
        key = id(ctx.optimizer)
        self.backward_since_reset_at_steps += self._backward_since_reset
        if key in self.optimizer_steps:
            self.steps_without_reset[key] += self.optimizer_steps[key] > 0 and not self._reset_before_step[key]
            self.optimizer_steps[key] += 1
            self._reset_before_step[key] = False

    def on_step_end(self, ctx: StepContext) -> None:
        if self.watched.manual and not self._reset_since_backward and self._reference.happened():
            # without an optimizer the step ends at the next forward, after a reset by hand
            # (p.grad = None, p.grad.zero_() as in the PyTorch tutorial) if there was one;
            # gradients clipped in place also changed version, but are not all zero
            self.on_zero_grad(ctx)
        self._reference.remember()
        for reset in self._resets.values():
            reset.remember()

    def close(self) -> None:
        forget_outputs(self._models)

    def note_logged_split(self, split: str) -> None:
        """A loss logged under ``split``: an evaluation split logged after train-mode forwards
        that no backward followed was computed with dropout on (batch-norm on batch statistics)."""
        if split.lower() in EVALUATION_SPLITS and self._train_mode_forwards:
            self.train_mode_evaluations += 1
            self._train_mode_forwards = 0

    def check_logged_loss(self, loss: Any) -> None:
        """Whether one of the first ``LOSS_CHECKS`` logged losses with a graph reaches a
        watched trainable parameter: a generator's loss computed from ``fake.detach()``
        reaches only the discriminator, whose backward gave the generator its gradients."""
        if self.logged_losses_checked >= LOSS_CHECKS or not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
            return
        self.logged_losses_checked += 1
        own, other = _reaches(loss.grad_fn, {id(p) for _, p in self.watched.params if p.requires_grad}, self._models)
        for path in ops_before_loss(loss.grad_fn, self._models):
            if path not in self.ops_before_loss and len(self.ops_before_loss) < MAX_LOSS_PATHS:
                self.ops_before_loss.append(path)
        self.logged_losses_reaching += own
        self.logged_losses_through_others += other

    def report(self, window: int | None) -> dict[str, Any]:
        named = self.watched.named_tensors()
        trainable = [(n, p) for n, p in named if p.requires_grad]
        # a pass over every frozen weight: not for the live rules' windowed report, which none of them reads it from
        at_init, checked = frozen_at_init(self.watched.root) if window is None else ([], 0)
        loop: dict[str, Any] = {
            "backward_calls": self.backward_calls,
            "backward_calls_in_step": self.backward_calls_in_step,
            "backward_since_reset_at_steps": None if self.watched.manual else self.backward_since_reset_at_steps,
            "zero_grad_calls": self.zero_grad_calls,
            "forward_calls": self.forward_calls,
            "no_grad_forwards_in_train_mode": self.no_grad_forwards_in_train_mode,
            "train_mode_evaluations": self.train_mode_evaluations,
            "no_grad_train_forward_steps": len(self._no_grad_steps),
            "backward_after_eval_forward": self.backward_after_eval_forward,
            "first_eval_backward_step": self.first_eval_backward_step,
            "frozen_train_mode_forwards": 0 if self._ever_trainable else self._frozen_train_mode_forwards,
            "trainable_param_count": sum(p.numel() for _, p in trainable),
            "params_grad_none": (
                [n for n, p in self._never_grad.items() if p.requires_grad] if self.backward_calls else []
            ),
            # one check per parameter, for the final report only
            "params_grad_nonfinite": [n for n, p in trainable if p.grad is not None and has_nonfinite(p.grad)]
            if window is None and self.backward_calls else [],
            # nothing trainable watched (no parameter, and no plain tensor that requires grad in its place, as d2l's
            # scratch models hold): nothing to reach
            "logged_loss_reaches_params": (
                self.logged_losses_reaching > 0 if self.logged_losses_checked and trainable else None
            ),
            "logged_loss_through_other_models": (
                True if self.fed_by_other_model else
                self.logged_losses_through_others > 0 if self.logged_losses_checked else None
            ),
            "ops_before_loss": [list(path) for path in self.ops_before_loss],
            "frozen_params": [n for n, p in named if not p.requires_grad],
            "frozen_at_init": at_init if checked else None,
            "frozen_checked": checked,
            "frozen_tracking": tracking_copies(self.watched.root, self._frozen_before) if window is None else [],
            "has_dropout": self._has_dropout,
            "has_batchnorm": self._has_batchnorm,
            "optimizers": [type(o).__name__ for o in self.watched.optimizers],
            "optimizer_steps": [self.optimizer_steps[id(o)] for o in self.watched.optimizers],
            "optimizer_steps_without_reset": [self.steps_without_reset[id(o)] for o in self.watched.optimizers],
        }
        if not self.watched.manual:  # without an optimizer there is nothing to be connected to
            in_optimizer = {id(p) for o in self.watched.optimizers for g in o.param_groups for p in g["params"]}
            in_model = {id(p) for _, p in named}
            loop["params_not_in_optimizer"] = [n for n, p in trainable if id(p) not in in_optimizer]
            loop["optimizer_params_not_in_model"] = len(in_optimizer - in_model)
            if window is None:  # a walk over every module's attributes: the final report only
                loop["unregistered_params"] = orphaned_trainables(self.watched.root, self.watched.optimizers)
        return {"loop": loop}
