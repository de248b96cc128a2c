"""Helpers every active probe shares: run on a copy, leave the user's state untouched,
call the model and the loss the same way, and tell classification from regression.

Why copies: a probe trains, perturbs or converts weights (overfit, LR sweep, float64
gradient check) and even a plain forward in train mode moves batch-norm running
statistics. So every probe works on ``working_copy(model)`` inside ``preserved_rng()``,
and the user's model, optimizer and global random state are exactly as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import math
import random
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader

from nndx import vocab
from nndx.errors import UsageError

# (inputs, targets); inputs a Tensor, a tuple of positional args or a dict of keyword
# arguments; or a dict batch (see split_batch)
Batch = Any
# loss_fn(output, targets) -> scalar; None when the model returns its own loss (.loss)
LossFn = Callable[..., torch.Tensor] | None

# --------------------------------------------------------------------------- state


@contextlib.contextmanager
def preserved_rng(*generators: torch.Generator) -> Iterator[None]:
    """Restore torch (CPU and initialised CUDA devices), Python and numpy random state on
    exit, so a probe's dropout masks and random directions never shift the user's stream;
    and the state of each of ``generators`` (a DataLoader's own, say)."""
    py_state = random.getstate()
    np_state = _numpy_state()
    own_states = [(g, g.get_state()) for g in generators]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for generator, state in own_states:
            generator.set_state(state)
        random.setstate(py_state)
        if np_state is not None:
            _numpy().random.set_state(np_state)


def seed_all(seed: int) -> None:
    """Seed torch, Python's ``random`` and numpy's global stream (inside
    :func:`preserved_rng`): two forwards that must draw the same randomness do, whichever
    generator the model draws from (dropout from torch's, GraphSAGE's neighbour sampling
    from ``random.sample``)."""
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = _numpy()
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def global_draws() -> tuple[Any, ...]:
    """Where Python's ``random`` and numpy's global stream stand: compare two of these to
    tell whether code in between drew from them (a forward that samples a graph's
    neighbours with ``random.sample``; network layers draw from torch's generator only)."""
    np_state = _numpy_state()
    return random.getstate(), None if np_state is None else (np_state[1].tobytes(), np_state[2])


def optimizer_step(optimizer: torch.optim.Optimizer, loss_again: Callable[[], torch.Tensor]) -> None:
    """``optimizer.step()`` on a probe's copy; an optimizer whose step needs a closure
    (L-BFGS re-evaluates the loss several times per step) gets one that recomputes the
    loss and its gradients with ``loss_again``; so does one that refuses to step without the
    closure it declares optional (davda54/sam's SAM asserts one: it evaluates the gradient at
    a perturbed point)."""
    if not _needs_closure(optimizer):
        try:
            optimizer.step()
            return
        except (AssertionError, RuntimeError, TypeError, ValueError) as exc:
            if "closure" not in str(exc).lower():
                raise

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_again()
        loss.backward()
        return loss

    optimizer.step(closure)


def loss_scaler(device: torch.device, precision: Any = None) -> torch.amp.GradScaler | None:
    """A GradScaler when a probe's forwards run under float16 autocast (``nndx.probe(...,
    amp=torch.float16)``, or ``precision`` from :func:`train_in_float32`); else None.
    float16 gradients under ~6e-8 are zero, so a probe that trained without loss scaling
    would stall where the user's scaled training does not, and blame the model."""
    setting = _FORWARD_AUTOCAST.get()
    half = (setting is not None and setting[1] == torch.float16) or (
        isinstance(precision, torch.autocast) and precision.fast_dtype == torch.float16)
    return torch.amp.GradScaler(device.type) if half else None


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, loss_again: Callable[[], torch.Tensor],
                      scaler: torch.amp.GradScaler | None = None) -> None:
    """One training step of a probe's copy: backward, then :func:`optimizer_step`, with
    the loss scaled as ``torch.amp.GradScaler`` does when ``scaler`` is given (not for an
    optimizer that needs a closure: the scaler cannot step those)."""
    if scaler is None or _needs_closure(optimizer):
        loss.backward()
        optimizer_step(optimizer, loss_again)
        return
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def _needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    try:
        closure_parameter = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # a builtin or odd wrapper: take the plain step
        return False
    return closure_parameter is not None and closure_parameter.default is inspect.Parameter.empty


def loader_generators(source: Any) -> list[Any]:
    """The generators a DataLoader or its sampler was given: its shuffle (and its workers'
    seeds) come from them, not from the global RNGs, so reading a sample must put them
    back too, or the user's next epoch would not be in the order it would have had."""
    found: dict[int, Any] = {}
    for holder in (source, getattr(source, "sampler", None), getattr(getattr(source, "batch_sampler", None), "sampler", None)):
        generator = getattr(holder, "generator", None)
        if generator is not None and hasattr(generator, "get_state"):
            found[id(generator)] = generator
    return list(found.values())


def _numpy() -> Any:
    """The numpy module, or None: numpy is a dependency, but a probe must not need it."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _numpy_state() -> Any:
    numpy = _numpy()
    return None if numpy is None else numpy.random.get_state()


def working_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` the probe may train and mutate freely."""
    try:
        model_copy = model_deepcopy(model, model)
    except Exception as exc:  # a model holding an open file, a lock, a generator...
        raise TypeError(f"cannot deep-copy the model to probe it safely ({type(exc).__name__}: {exc})") from exc
    return reset_state_each_forward(detach_watchers(model_copy))


def loss_on_copies(loss_fn: LossFn, model: nn.Module | None = None) -> LossFn:
    """``loss_fn`` with the stateful modules it holds replaced by working copies: a GAN
    generator's loss that runs the discriminator (SRGAN's ``criterion(discriminator(fake),
    valid)``, the discriminator in the function's closure) would run the user's own in
    every probe, moving its batch-norm statistics and counting in its Monitor. Modules held
    by a closure, a bound method's ``self``, a ``functools.partial``, or the loss itself.
    The probed ``model`` itself, held there, stands for the probe's copy that ran the last
    forward (:class:`LatestCopy`): a VAE's loss reads the mean and log-std the forward
    kept on the module, which only the copy that ran it has."""
    copied = functools.partial(_copied, model=model)
    if isinstance(loss_fn, nn.Module):
        return copied(loss_fn)
    if isinstance(loss_fn, types.MethodType) and model is not None and loss_fn.__self__ is model:
        return _on_latest_copy(loss_fn, LatestCopy(model))
    if isinstance(loss_fn, types.MethodType) and (owner := copied(loss_fn.__self__)) is not loss_fn.__self__:
        return types.MethodType(loss_fn.__func__, owner)
    if isinstance(loss_fn, functools.partial):
        return functools.partial(loss_on_copies(loss_fn.func, model), *map(copied, loss_fn.args),
                                 **{k: copied(v) for k, v in loss_fn.keywords.items()})  # fmt: skip
    if isinstance(loss_fn, types.FunctionType):
        return _function_on_copies(loss_fn, copied, {}, FUNCTION_DEPTH)
    return loss_fn


FUNCTION_DEPTH = 4  # functions calling functions, followed this deep for the modules they reach


def _function_on_copies(function: types.FunctionType, copied: Callable[[Any], Any], memo: dict[int, Any],
                        depth: int) -> types.FunctionType:  # fmt: skip
    """``function`` with the stateful modules it reaches replaced by copies: those in its closure
    cells and among the module globals its code names, and, ``depth`` deep, those the functions
    found there reach (relativistic GAN's ``g_loss_fn`` calls ``generator_loss``, whose closure
    holds the discriminator; a script's loss names a global ``discriminator``). One copy per
    module, however many functions reach it."""
    memo[id(function)] = function  # a function that reaches itself stays as it is

    def twin(value: Any) -> Any:
        if id(value) not in memo:
            memo[id(value)] = (_function_on_copies(value, copied, memo, depth - 1)
                               if isinstance(value, types.FunctionType) and depth > 0 else copied(value))  # fmt: skip
        return memo[id(value)]

    cells = tuple(types.CellType(new) if (new := twin(old := _contents(cell))) is not old else cell
                  for cell in function.__closure__ or ())  # fmt: skip
    names = {n for code in _codes(function.__code__) for n in code.co_names if n in function.__globals__}
    renamed = {n: new for n in sorted(names) if (new := twin(function.__globals__[n])) is not function.__globals__[n]}
    if all(a is b for a, b in zip(cells, function.__closure__ or ())) and not renamed:
        return function
    return _with_cells(function, cells or None, {**function.__globals__, **renamed} if renamed else None)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code of the functions and lambdas defined inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _on_latest_copy(method: types.MethodType, latest: LatestCopy) -> LossFn:
    """A loss that is a method of the probed model, called on the probe's copy that ran the
    last forward itself, not on a stand-in: the method may call ``super().loss(...)`` (d2l's
    ``WeightDecay``), which needs an instance of the model's class."""

    @functools.wraps(method)
    def loss(*args: Any, **kwargs: Any) -> Any:
        return method.__func__(latest._target(), *args, **kwargs)

    return loss


def _copied(value: Any, model: nn.Module | None = None) -> Any:
    """A working copy of a module with parameters or buffers (the probed model: its latest
    copy); anything else as it is."""
    if model is not None and value is model:
        return LatestCopy(model)
    stateful = isinstance(value, nn.Module) and (any(True for _ in nn.Module.parameters(value))
                                                 or any(True for _ in nn.Module.buffers(value)))  # fmt: skip
    return working_copy(value) if stateful else value


_LATEST: dict[int, weakref.ref] = {}  # id of a probed model -> its copy that ran the last forward


def follow_copies(model: nn.Module, model_copy: nn.Module) -> None:
    """Make every copy of ``model_copy`` (each probe's, made from it) say when it runs a
    forward, for :class:`LatestCopy`. The hook is kept on copies (``detach_watchers``)."""
    model_copy.__dict__["_nndx_origin"] = id(model)
    model_copy.register_forward_pre_hook(_ran_forward)


def _ran_forward(module: nn.Module, _args: Any) -> None:
    _LATEST[module.__dict__.get("_nndx_origin", id(module))] = weakref.ref(module)


_ran_forward.nndx_keep = True  # type: ignore[attr-defined]


class LatestCopy:
    """Stands for the probed model inside the user's loss: every attribute read and call
    goes to the probe's copy that ran the last forward (a working copy of the model until
    one has)."""

    def __init__(self, model: nn.Module) -> None:
        self._model, self._fallback = model, None

    def _target(self) -> nn.Module:
        ref = _LATEST.get(id(self._model))
        latest = ref() if ref is not None else None
        if latest is not None:
            return latest
        if self._fallback is None:
            self._fallback = working_copy(self._model)
        return self._fallback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)


def dense_gradients(model_copy: nn.Module) -> nn.Module:
    """A probe's own copy with its sparse embeddings (``nn.Embedding(sparse=True)``, as
    word2vec trains with SparseAdam) made dense: the same gradients, in the layout nndx's
    Adam and the gradient check take. Never on the user's model, nor where the user's
    optimizer (SparseAdam takes sparse gradients only) trains the copy."""
    for module in model_copy.modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            module.sparse = False
    return model_copy


def _defined_in(fn: object) -> str:
    """The module that defined a hook: of the function, of a bound method's owner, of a
    callable object's class, of a ``functools.partial``'s function."""
    fn = getattr(fn, "func", fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        return getattr(type(owner), "__module__", "") or ""
    module = getattr(fn, "__module__", None)
    return module if isinstance(module, str) else getattr(type(fn), "__module__", "") or ""


def _is_nndx(fn: object) -> bool:
    return _defined_in(fn).startswith("nndx.")


def is_torch_code(fn: object) -> bool:
    """Whether ``fn`` (a function, bound method, partial or callable) is defined in torch."""
    module = _defined_in(fn)
    return module == "torch" or module.startswith("torch.")


# the hooks that run during a forward or backward: on a probe's copy only torch's own stay
_CALL_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")  # fmt: skip


def detach_watchers(obj: nn.Module | torch.optim.Optimizer) -> nn.Module | torch.optim.Optimizer:
    """Cut a deep copy loose from whatever watched the original.

    ``deepcopy`` copies a module's hook dicts and an object's instance attributes, but
    a function is copied by reference: a Monitor's hooks on the copy would count the
    probe's forwards as the user's, a user's hook would log the probe's activations into
    the user's own lists, and a method patched onto the instance (the Monitor's
    ``zero_grad``) still calls the *original* object — a probe calling ``zero_grad()`` on
    its copy would clear the user's gradients. So on a copy: every forward/backward and
    optimizer-step hook that torch did not register itself is removed (torch's own, such
    as weight-norm and pruning pre-hooks, are part of the model and stay, as does a hook
    that is a method of one of the model's own modules: BYOL's wrapper reads its backbone's
    hidden layer through one, so it is part of the forward — deepcopy binds the copy's hook
    to the copied module), nndx's hooks of any kind are removed (but :func:`follow_copies`'
    own, which copies of copies keep), and instance attributes that shadow a method of the
    class with a plain function are dropped (the class method is the copy's own)."""
    owners = list(obj.modules()) if isinstance(obj, nn.Module) else [obj]
    own = {id(m) for m in owners}
    for owner in owners:
        for attr, value in list(vars(owner).items()):
            if attr.endswith("hooks") and isinstance(value, dict):
                foreign = [k for k, fn in value.items() if not getattr(fn, "nndx_keep", False) and (_is_nndx(fn) or (
                    attr in _CALL_HOOKS and not is_torch_code(fn) and id(getattr(fn, "__self__", None)) not in own))]
                for key in foreign:
                    del value[key]
                    for flags in ("_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                                  "_forward_hooks_always_called"):  # fmt: skip
                        getattr(owner, flags, {}).pop(key, None)
            elif callable(value) and not hasattr(value, "__self__") and callable(getattr(type(owner), attr, None)):
                del vars(owner)[attr]
    return obj


def recurrent_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's recurrent layers and cells (nn.RNN, LSTM, GRU and their cells), by name: they
    read their current step by design and, built time-major, take (time, batch) inputs."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.RNNBase, nn.RNNCellBase))]


def set_mode(model: nn.Module, training: bool) -> nn.Module:
    """``model.train(training)``; for a model whose class gives ``train`` another meaning
    (the forward-forward example's ``Layer.train(x_pos, x_neg)`` runs its training), the
    flag set on every module instead, so a probe's mode switch never calls user code
    that expects other arguments."""
    try:
        model.train(training)
    except TypeError:
        for module in model.modules():
            module.training = training
    return model


def trainable_names(model: nn.Module) -> list[str]:
    return [n for n, p in nn.Module.named_parameters(model) if p.requires_grad]


def torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer that ``optimizer`` is or wraps and steps (apex's LARC holds it as
    ``.optim``; a warm-up ``ScheduledOptim``, Lightning's ``LightningOptimizer``, others as
    ``.optimizer``); None stays None. Anything else is a TypeError that says what is accepted."""
    if optimizer is None:
        return None
    inner = optimizer
    for _ in range(4):
        if isinstance(inner, torch.optim.Optimizer):
            return inner
        held = getattr(inner, "optim", None)
        inner = held if held is not None else getattr(inner, "optimizer", None)
    raise TypeError(f"optimizer must be a torch.optim.Optimizer (or a list of them, or None), or a wrapper "
                    f"holding one as .optim or .optimizer, got {type(optimizer).__name__}")  # fmt: skip


def own_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is one of the user's own classes (fastai's ``BasicOptim``: ``step()``
    and ``zero_grad()`` over a parameter list, no torch optimizer inside). nndx cannot copy
    it, so the Monitor watches its updates and the probes train as for a loop that updates
    the parameters by hand; anything without a ``step()`` stays a TypeError."""
    if optimizer is None or not callable(getattr(optimizer, "step", None)):
        return False
    try:
        torch_optimizer(optimizer)
    except TypeError:
        return True
    return False


def optimizer_coverage(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[str], int]:
    """(trainable model parameters the optimizer does not hold, optimizer parameters that
    are not the model's). Both non-empty is the classic 'optimizer built over another
    model' bug; it is measured, never fixed and never stepped."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    model_ids = {id(p) for p in nn.Module.parameters(model)}
    missing = [n for n, p in nn.Module.named_parameters(model) if p.requires_grad and id(p) not in held]
    foreign = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in model_ids)
    return missing, foreign


_MODULE_DICTS = frozenset({"_parameters", "_buffers", "_modules"})


def kept_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(qualified name, tensor) of every tensor a module keeps beside its parameters: its buffers
    and its plain tensor attributes (d2l's scratch batch norm keeps its moving statistics so)."""
    for prefix, module in model.named_modules():
        for name, value in [*module._buffers.items(), *vars(module).items()]:
            if name not in _MODULE_DICTS and isinstance(value, (torch.Tensor, tuple, list)):
                for tensor in iter_tensors(value):
                    yield f"{prefix}.{name}" if prefix else name, tensor


def plain_trainables(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(qualified name, tensor) of each floating-point leaf tensor that requires grad and that a
    module keeps as a plain attribute, not as a parameter: a model written from scratch
    (``self.w = torch.normal(0, 0.01, (n, 1), requires_grad=True)``) trains those."""
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for name, tensor in kept_tensors(model):
        if (tensor.is_leaf and tensor.requires_grad and tensor.is_floating_point()
                and not isinstance(tensor, nn.Parameter)):  # fmt: skip
            found.setdefault(id(tensor), (name, tensor))
    return list(found.values())


def trainable_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What the model trains, by name: its parameters that require grad or, when it registers none,
    the plain tensors it holds that require grad (:func:`plain_trainables`). Probes, copies and the
    Monitor all ask this one question."""
    return [(n, p) for n, p in nn.Module.named_parameters(model) if p.requires_grad] or plain_trainables(model)


_NOTHING = object()


def _holds_tensor(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, tuple, list)) and any(True for _ in iter_tensors(value))


def _state_attributes(model: nn.Module) -> Iterator[tuple[nn.Module, str, Any]]:
    """(module, name, value) of each tensor a module keeps as a plain attribute, neither
    parameter nor buffer (or in a tuple/list there): a recurrent state carried on ``self``
    from one forward to the next, as the PyTorch LSTM tagger tutorial's ``self.hidden``."""
    for module in model.modules():
        for name, value in vars(module).items():
            if name not in _MODULE_DICTS and _holds_tensor(value):
                yield module, name, value


def orphaned_trainables(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> list[str]:
    """Tensors that a module of ``model`` holds outside its parameters, that received a
    gradient and that no optimizer holds: nothing ever steps them. How they arise: a layer
    kept in a Python list instead of ``nn.ModuleList``; ``self.w = nn.Parameter(t).to(device)``
    or ``.clone()``, whose attribute is a copy with the Parameter behind it (pytorch#17484);
    ``torch.tensor(..., requires_grad=True)`` set as an attribute. The gradient is the evidence
    that the loss runs through them (a hidden EMA copy in a list, used without a graph, gets none).
    Names are ``module.attribute`` (``experts[1].fc.weight`` for one in a list)."""
    registered = {id(p) for p in nn.Module.parameters(model)}
    held = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
    found: dict[int, str] = {}

    def note(name: str, tensor: torch.Tensor) -> None:
        for leaf in graph_leaves(tensor):
            if (leaf.requires_grad and leaf.grad is not None and id(leaf) not in registered
                    and id(leaf) not in held):  # fmt: skip
                found.setdefault(id(leaf), name)

    for module_name, module in nn.Module.named_modules(model):
        prefix = f"{module_name}." if module_name else ""
        for name, value in vars(module).items():
            if name in _MODULE_DICTS:
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(
                value, (list, tuple)) else [(None, value)]  # fmt: skip
            for key, item in items:
                label = prefix + name + ("" if key is None else f"[{key}]")
                if isinstance(item, torch.Tensor):
                    note(label, item)
                elif isinstance(item, nn.Module) and key is not None:
                    for param_name, param in nn.Module.named_parameters(item):
                        note(f"{label}.{param_name}", param)
    return list(found.values())


def graph_leaves(tensor: torch.Tensor, limit: int = 64) -> list[torch.Tensor]:
    """The tensor itself when it is a leaf; else the leaves its autograd graph reaches
    (searched up to ``limit`` nodes: a copy of a Parameter is one node away)."""
    if tensor.grad_fn is None:
        return [tensor]
    leaves, seen, todo = [], set(), [tensor.grad_fn]
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return leaves


def model_deepcopy(obj: Any, model: nn.Module, memo: dict[int, Any] | None = None,
                   shared: list[str] | None = None) -> Any:
    """``copy.deepcopy(obj)`` (the model, or a tuple holding it), where each tensor the
    model keeps as a plain attribute with an autograd graph behind it is copied detached:
    such a tensor has no deepcopy (only graph leaves do), and a copy that trained through
    the user's last graph would be no copy.

    A plain attribute that cannot be copied at all (an open log file, a lock, a client
    object) is shared with the copy instead of failing the whole copy, and its
    ``module.name`` appended to ``shared``: the probes train parameters and buffers, which
    are always copied, and a model whose forward writes to such an object would write
    there anyway. Raises what ``deepcopy`` raises when the copy fails for another reason."""
    memo = {} if memo is None else memo
    for _, _, value in _state_attributes(model):
        for tensor in iter_tensors(value):
            if tensor.grad_fn is not None:
                memo[id(tensor)] = tensor.detach().clone()
    for inverse in _inverse_transforms(model):
        # Transform.__getstate__ drops ``_inv``, which for an inverse is the transform it
        # inverts: copied plainly, a flow's SigmoidTransform().inv raises when used
        memo[id(inverse)] = copy.deepcopy(inverse._inv, memo).inv
    seeds = dict(memo)
    try:
        return _rebound(copy.deepcopy(obj, memo), model, memo)
    except Exception:
        found = _uncopyable_attributes(model)
        if not found:
            raise
    memo.clear()  # it holds the half-built copies of the failed attempt
    memo.update(seeds)
    for name, value in found:
        memo[id(value)] = value
        if shared is not None:
            shared.append(name)
    return _rebound(copy.deepcopy(obj, memo), model, memo)


def _rebound(copied: Any, model: nn.Module, memo: dict[int, Any]) -> Any:
    """``copied`` with each function a module keeps as an attribute rebuilt over the copies
    of what it closes over. minGPT's ``self.mlpf = lambda x: m.dropout(m.c_proj(...))``
    closes over the original ``m``; deepcopy shares functions, so the copy's forward ran
    the user's own modules: the copy's eval() left their dropout on, and a probe's
    backward wrote into the user's gradients."""
    twin = memo.get(id(model))
    for module in nn.Module.modules(twin) if isinstance(twin, nn.Module) else ():  # not a model's override
        for name, value in list(vars(module).items()):
            if name not in _MODULE_DICTS and isinstance(value, types.FunctionType) and value.__closure__:
                cells = tuple(_cell_copy(cell, memo) for cell in value.__closure__)
                if any(new is not old for new, old in zip(cells, value.__closure__)):
                    vars(module)[name] = _with_cells(value, cells)
    return copied


def _with_cells(function: types.FunctionType, cells: tuple[types.CellType, ...] | None,
                globals_: dict[str, Any] | None = None) -> types.FunctionType:  # fmt: skip
    """``function`` closing over ``cells`` (and reading ``globals_``) instead of its own."""
    rebuilt = types.FunctionType(function.__code__, function.__globals__ if globals_ is None else globals_,
                                 function.__name__, function.__defaults__, cells)  # fmt: skip
    rebuilt.__kwdefaults__, rebuilt.__qualname__ = function.__kwdefaults__, function.__qualname__
    rebuilt.__dict__.update(function.__dict__)
    return rebuilt


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _cell_copy(cell: types.CellType, memo: dict[int, Any]) -> types.CellType:
    contents = _contents(cell)
    twin = memo.get(id(contents)) if contents is not None else None
    return types.CellType(twin) if twin is not None and twin is not contents else cell


def _inverse_transforms(model: nn.Module, depth: int = 4) -> list[Any]:
    """torch.distributions' inverse transforms (``SigmoidTransform().inv``) among the
    modules' plain attributes, in distributions and containers ``depth`` levels deep."""
    from torch.distributions import Distribution
    from torch.distributions.transforms import Transform, _InverseTransform

    found: dict[int, Any] = {}
    level = [v for m in model.modules() for n, v in vars(m).items() if n not in _MODULE_DICTS and "hook" not in n]
    for _ in range(depth):
        children = []
        for value in level:
            if isinstance(value, _InverseTransform) and value._inv is not None:
                found[id(value)] = value
            if isinstance(value, (Distribution, Transform)):
                children.extend(vars(value).values())
            elif isinstance(value, (list, tuple)):
                children.extend(value)
            elif isinstance(value, dict):
                children.extend(value.values())
        level = children
    return list(found.values())


def _uncopyable_attributes(model: nn.Module) -> list[tuple[str, Any]]:
    """(``module.name``, value) of each plain attribute of the model's modules (not a
    parameter, buffer, submodule or tensor) that ``deepcopy`` refuses on its own."""
    found = []
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if name in _MODULE_DICTS or "hook" in name or isinstance(value, (torch.Tensor, nn.Module)):
                continue  # hooks are removed from the copy: a shared hook dict would lose the user's
            try:
                copy.deepcopy(value)
            except Exception:
                found.append((f"{prefix}.{name}" if prefix else name, value))
    return found


class _StateReset:
    """A forward pre-hook that puts the state a model keeps on ``self`` back to its value
    when the copy was made, before every forward of the copy. A probe calls the model many
    times (300 overfit steps, a gradient check comparing forwards); the user's loop resets
    such state where nndx cannot see (``model.hidden = model.init_hidden()`` before each
    sentence). Carried over, it would tie every probe forward to the last one's graph
    ("backward through the graph a second time") and change the function a gradient check
    differentiates.

    The same for what a forward writes in place into the model's own tensors that no
    optimizer trains: MoCo's forward moves its key encoder (a momentum update of frozen
    parameters) and enqueues into a buffer, so two forwards of one batch differ and a
    probe's loss climbs at any LR as the queue fills. Those tensors (buffers outside
    BatchNorm, parameters with ``requires_grad=False``) are put back when they were
    written; kept only while they hold at most twice the trainable parameters, or 2^20
    elements (a frozen pretrained backbone is not doubled in memory: no forward writes it)."""

    def __init__(self, model: nn.Module) -> None:
        # every plain attribute, tensor or not: a state may start as ``self.h = 0`` and become a
        # tensor at the first forward (fastbook's stateful LMModel3)
        self.kept = [(m, {n: v for n, v in vars(m).items() if n not in _MODULE_DICTS}) for m in model.modules()]
        self.written = _untrained_tensors(model)
        self.marks = [_mark(w.tensor) for w in self.written]
        self.rewrote: list[str] = []  # the tensors a forward wrote, which were put back

    def __call__(self, module: nn.Module, args: Any) -> None:
        for owner, kept in self.kept:
            attributes = vars(owner)
            for name in [n for n, v in attributes.items() if n not in _MODULE_DICTS and kept.get(n, _NOTHING) is not v
                         and _holds_tensor(v)]:  # fmt: skip
                if name in kept:
                    attributes[name] = kept[name]
                else:
                    del attributes[name]
        for i, w in enumerate(self.written):
            current = getattr(w.owner, w.where).get(w.name)
            if current is None:
                continue
            if current is not w.tensor:  # a buffer replaced (a probe's .double(), .to(device)): its value from now
                self.written[i] = w._replace(tensor=current, saved=current.detach().clone())
                self.marks[i] = _mark(current)
                continue
            if w.saved.dtype != current.dtype or w.saved.device != current.device:
                # converted in place (``param.data = ...`` by .double() or .to(device)): no forward wrote it
                self.written[i] = w._replace(saved=w.saved.to(current.device, current.dtype))
                self.marks[i] = _mark(current)
                continue
            if _mark(current) != self.marks[i]:  # written in place, or ``param.data = ...`` (MoCo's update)
                with torch.no_grad():
                    current.copy_(w.saved)
                self.marks[i] = _mark(current)
                if w.qualified not in self.rewrote:
                    self.rewrote.append(w.qualified)


class _Written(NamedTuple):
    qualified: str  # as named_parameters / named_buffers name it
    owner: nn.Module
    name: str
    tensor: torch.Tensor
    saved: torch.Tensor  # its value when the copy was made
    where: str  # "_buffers" or "_parameters"


def forward_writes(model_copy: nn.Module) -> list[str]:
    """The untrained tensors (buffers, frozen parameters) the forwards of a probe's copy
    wrote so far, each put back before the next forward (see :class:`_StateReset`)."""
    return next((list(h.rewrote) for h in model_copy._forward_pre_hooks.values() if isinstance(h, _StateReset)), [])


def _mark(t: torch.Tensor) -> tuple[int, int]:
    """What changes when a tensor is written: its version counter (in place) or its storage
    (``t.data = ...``, which leaves the version as it was)."""
    try:
        return t._version, t.data_ptr()
    except RuntimeError:  # a sparse or meta tensor has no data pointer: its version alone
        return t._version, 0


UNTRAINED_STATE_ELEMENTS = 1 << 20  # what _StateReset always keeps a copy of (4 MiB of float32)


def _untrained_tensors(model: nn.Module) -> list[_Written]:
    """The tensors no optimizer trains that a forward may write: see :class:`_StateReset`."""
    found = []
    for prefix, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase):
            continue  # running statistics: BatchNorm's own business, used in eval mode
        for where, tensors in (("_buffers", module._buffers), ("_parameters", module._parameters)):
            found += [(f"{prefix}.{n}" if prefix else n, module, n, t, where) for n, t in tensors.items()
                      if t is not None and (where == "_buffers" or not t.requires_grad)]  # fmt: skip
    trainable = sum(p.numel() for p in nn.Module.parameters(model) if p.requires_grad)
    if not found or sum(t.numel() for *_, t, _ in found) > max(2 * trainable, UNTRAINED_STATE_ELEMENTS):
        return []
    return [_Written(q, module, n, t, t.detach().clone(), where) for q, module, n, t, where in found]


def reset_state_each_forward(model_copy: nn.Module) -> nn.Module:
    """Install :class:`_StateReset` on a probe's copy that keeps state on ``self``."""
    reset = _StateReset(model_copy)
    if reset.kept or reset.written:
        model_copy.register_forward_pre_hook(reset)
    return model_copy


def copy_together(model: nn.Module, optimizer: torch.optim.Optimizer,
                  shared: list[str] | None = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Deep copies of a model and its optimizer through one memo, so the copy's optimizer
    steps the copy's parameters. An optimizer pickles only its defaults, state and groups:
    what it keeps beside them (L-BFGS's ``_params``) is copied through the same memo."""
    memo: dict[int, Any] = {}
    with _class_step_kept(type(optimizer)):
        model_copy, optimizer_copy = model_deepcopy((model, optimizer), model, memo, shared)
        for key, value in vars(optimizer).items():
            if key not in vars(optimizer_copy):
                setattr(optimizer_copy, key, copy.deepcopy(value, memo))
    return model_copy, optimizer_copy


@contextlib.contextmanager
def _class_step_kept(cls: type) -> Iterator[None]:
    """Undo what unpickling an optimizer does to its class. ``Optimizer.__setstate__`` wraps
    ``cls.step`` for the whole class when it is not wrapped yet: it is, for an optimizer that
    ran ``Optimizer.__init__``; for one that did not (Opacus's ``DPOptimizer`` wraps another),
    the user's own ``step`` then looked for hooks it never had and raised."""
    had, step = "step" in vars(cls), vars(cls).get("step")
    try:
        yield
    finally:
        if had:
            setattr(cls, "step", step)
        elif "step" in vars(cls):
            delattr(cls, "step")


def copy_with_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    default: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> tuple[nn.Module, torch.optim.Optimizer, str]:
    """A copy of the model and an optimizer over the copy's parameters, plus a note on
    which optimizer it is.

    When the user's optimizer holds every trainable parameter, model and optimizer are
    deep-copied together (one memo), so the copy keeps the user's optimizer type, groups,
    hyper-parameters and state. Otherwise the user's optimizer could not train the copy,
    so a fresh one of the same type and defaults is built over it; failing that, ``default``.
    """
    if optimizer is not None:
        missing, _ = optimizer_coverage(model, optimizer)
        if not missing:
            try:
                model_copy, optimizer_copy = copy_together(model, optimizer)
                reset_state_each_forward(detach_watchers(model_copy))
                detach_watchers(optimizer_copy)
                return model_copy, optimizer_copy, f"a copy of the user's {type(optimizer).__name__}"
            except Exception:  # noqa: BLE001 - fall through to a fresh optimizer
                pass
    model_copy = working_copy(model)
    params = [p for _, p in trainable_tensors(model_copy)]
    if not params:
        raise ValueError("the model has no trainable parameters (all requires_grad=False)")
    if optimizer is not None:
        try:
            return model_copy, type(optimizer)(params, **optimizer.defaults), (
                f"a fresh {type(optimizer).__name__} with the user's defaults "
                "(the user's optimizer does not hold all the model's parameters)"
            )
        except Exception:  # noqa: BLE001 - exotic optimizer constructors
            pass
    opt = default(params)
    return dense_gradients(model_copy), opt, f"nndx's own {type(opt).__name__}"


def copy_pair(model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device | str | None,
              shared: list[str] | None = None) -> tuple[nn.Module, torch.optim.Optimizer | None]:  # fmt: skip
    """Deep copies of the model and of an optimizer that holds its parameters (one memo,
    so the copy's optimizer steps the copy), watchers and user hooks removed, on ``device``.
    An optimizer that does not copy (None in its place) leaves the probes to their own.
    ``nndx.probe`` and ``nndx.lr_find`` prepare their copies with it."""
    holds = optimizer is not None and not optimizer_coverage(model, optimizer)[0]
    model_copy = optimizer_copy = None
    if holds:
        try:
            model_copy, optimizer_copy = copy_together(model, optimizer, shared)
            detach_watchers(optimizer_copy)
        except Exception:  # noqa: BLE001 - an optimizer that does not copy: the probes use their own
            if shared is not None:
                shared.clear()  # named by the failed copy; the model's own copy names them again
    try:
        if model_copy is None:
            model_copy = model_deepcopy(model, model, shared=shared)
    except Exception as exc:  # a model holding an open file, a lock, a generator...
        raise UsageError(f"cannot deep-copy the model to probe it safely ({type(exc).__name__}: {exc})") from exc
    reset_state_each_forward(detach_watchers(model_copy))
    if device is not None:
        model_copy.to(device)  # parameters keep their identity: the optimizer copy still holds them
        if optimizer_copy is not None:
            for state in optimizer_copy.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = value.to(device)
    # an optimizer over another model is the user's (it is only checked, never copied)
    return model_copy, optimizer_copy if holds else optimizer


def train_in_float32(model_copy: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> contextlib.AbstractContextManager:
    """Make a float16 copy trainable as mixed-precision training trains it: float32
    weights (and optimizer state), forwards under float16 autocast. Adam's eps (1e-8) is 0
    in float16, so pure float16 weights turn to NaN in one step whatever the model; a
    trainability probe that failed for that would blame the model. Returns the autocast
    context to run the forwards in (a no-op for other dtypes)."""
    first = next(nn.Module.parameters(model_copy), None)
    if first is None or first.dtype != torch.float16:
        return contextlib.nullcontext()
    model_copy.float()  # in place: the optimizer still holds the same parameters
    if optimizer is not None:
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dtype == torch.float16:
                    state[key] = value.float()
    return torch.autocast(device_type=first.device.type, dtype=torch.float16)


# --------------------------------------------------------------------------- calling the model


# keys of a dict batch, in the order they are looked for
INPUT_KEYS = ("inputs", "input", "x", "data", "features", "images", "image")
TARGET_KEYS = ("targets", "target", "y", "labels", "label")


def split_batch(batch: Batch) -> tuple[Any, Any]:
    """``(inputs, targets)`` from a batch, with a clear error for anything else.

    A batch is ``(inputs, targets)``, or a dict: with an input key (``inputs``, ``x``...)
    and a target key (``targets``, ``y``, ``labels``...) those two; otherwise (a Hugging
    Face batch: ``input_ids``, ``attention_mask``, ``labels``) the dict less its target
    key are the model's keyword arguments and the target is that key's value. A
    DataLoader is not a batch: ``nndx.probe`` takes its first batch, a probe function
    needs one."""
    if isinstance(batch, Mapping):
        target_key = next((k for k in TARGET_KEYS if k in batch), None)
        target = batch[target_key] if target_key is not None else None
        input_key = next((k for k in INPUT_KEYS if k in batch), None)
        if input_key is not None:
            return batch[input_key], target
        kwargs = {k: v for k, v in batch.items() if k != target_key}
        if not kwargs:
            raise UsageError(f"a dict batch needs the model's inputs; it has only {list(batch)}")
        return kwargs, target
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, DataLoader):
        raise UsageError("a DataLoader is not a batch: pass next(iter(loader)), or give the loader to nndx.probe")
    raise UsageError(
        "batch must be (inputs, targets) — a 2-tuple, or a dict such as {'x': ..., 'y': ...} or a Hugging "
        f"Face batch with 'labels' — got {type(batch).__name__}"
        + (f" of length {len(batch)}: put several inputs in a tuple, ((x1, x2), y)"
           if isinstance(batch, (tuple, list)) else "")  # fmt: skip
    )


# (device type, dtype) every probe forward runs under autocast with, set by the runner
# for the probes it runs (nndx.probe(..., amp=...)); None: no autocast
_FORWARD_AUTOCAST: contextvars.ContextVar[tuple[str, torch.dtype] | None] = contextvars.ContextVar(
    "nndx_forward_autocast", default=None
)


@contextlib.contextmanager
def forwards_under_autocast(setting: tuple[str, torch.dtype] | None) -> Iterator[None]:
    """Run every :func:`forward` inside the block under ``torch.autocast(*setting)`` (or
    none, with None). Each forward enters autocast itself, as mixed-precision training
    code does: a backward or an optimizer step inside autocast would reuse its cache of
    half-precision weights, stale after the step."""
    token = _FORWARD_AUTOCAST.set(setting)
    try:
        yield
    finally:
        _FORWARD_AUTOCAST.reset(token)


# what autograd says when a forward differentiates by its input under no_grad
_NO_GRAPH = "does not require grad and does not have a grad_fn"


def forward(model: nn.Module, inputs: Any) -> Any:
    """Call the model: a tensor as one argument, a tuple/list as positional arguments, a
    dict as keyword arguments (under autocast when the runner asks for it).

    A forward that differentiates by its input (a Hamiltonian network's time derivative, a
    PINN's differential operator, a score model's gradient of an energy) cannot run under a
    probe's ``no_grad``: it runs again with grad enabled, and its tensors come back detached,
    as the probe asked for no graph."""
    try:
        return _call(model, inputs)
    except RuntimeError as exc:
        if torch.is_grad_enabled() or _NO_GRAPH not in str(exc):
            raise
    with torch.enable_grad():
        return map_tensors(_call(model, inputs), torch.Tensor.detach)


def _call(model: nn.Module, inputs: Any) -> Any:
    setting = _FORWARD_AUTOCAST.get()
    with torch.autocast(device_type=setting[0], dtype=setting[1]) if setting else contextlib.nullcontext():
        if isinstance(inputs, Mapping):
            return model(**inputs)
        if isinstance(inputs, (tuple, list)):
            return model(*inputs)
        return model(inputs)


def _field(output: Any, name: str) -> Any:
    """``output.name`` or ``output[name]`` (a Hugging Face ``ModelOutput`` is both)."""
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None) if not isinstance(output, (torch.Tensor, tuple, list)) else None


def prediction(output: Any) -> Any:
    """What a loss function reads off the model's output: ``.logits`` of a Hugging Face
    output (or a dict's ``logits``); the first element of a tuple or list that starts
    with a tensor (a recurrent model's ``(output, hidden)``, a model's ``(logits, aux)``);
    the first parameter of a ``torch.distributions`` output (a neural process's
    ``Normal(mu, sigma)``: mu; a policy's ``Categorical(logits=...)``: the logits);
    else the output itself."""
    if isinstance(output, torch.distributions.Distribution):
        given = [vars(output).get(name) for name in output.arg_constraints]
        return next((t for t in given if isinstance(t, torch.Tensor)), output)
    logits = _field(output, "logits")
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return output


def compute_loss(loss_fn: LossFn, output: Any, targets: Any) -> torch.Tensor:
    """The scalar loss: ``loss_fn(output, targets)`` (``prediction(output)`` for torch's
    own losses), or, with ``loss_fn`` None, the loss the model returned (``output.loss``)."""
    if loss_fn is None:
        loss = _field(output, "loss")
        if not isinstance(loss, torch.Tensor):
            raise UsageError("loss_fn is None but the model's output has no .loss: pass a loss function, or the "
                             "labels the model needs to compute its loss")  # fmt: skip
    else:
        # torch's own losses take tensors: they get the logits of a Hugging Face output;
        # a function of the user's own gets what the model returned, as in the user's loop
        loss = loss_fn(prediction(output) if vocab.loss_kind(loss_name(loss_fn)) else output, targets)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor; got {shape} (use reduction='mean')")
    return loss.reshape(())


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested tuple/list/dict (model outputs, inputs)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)


def relates_samples(inputs: Any, size: int) -> bool:
    """Whether an input beside the first holds a matrix over the batch: two of its axes of
    the batch's ``size``, in a shape the first input does not have (a graph's dense adjacency
    beside node features). Such samples are meant to depend on each other, and no half of
    the batch is a batch. The first input itself never counts, nor a tensor shaped like it:
    a (64, 64) batch of 64 features, or token ids and their attention mask with as many
    positions as samples, are per-sample; nor one that differs from it only in its second
    axis (3 or more axes): sets of another size per sample, a neural process's 8 target points
    of each of 8 functions beside its 4 context points. Unless the first input is a square
    matrix over the samples beside an input of more axes (a spatio-temporal graph net's
    adjacency, given before its (batch, nodes, time, features) readings)."""
    tensors = list(iter_tensors(inputs))
    first = tuple(tensors[0].shape) if tensors else ()

    def per_sample(shape: tuple[int, ...]) -> bool:
        return shape == first or (len(shape) == len(first) >= 3 and shape[2:] == first[2:] and shape[0] == first[0])

    # the first input counts when it is a square matrix over the samples beside an input of more axes
    # that holds them: STGCN's forward(A_hat, X) takes the road graph's adjacency first
    adjacency_first = first == (size, size) and any(t.dim() > 2 and size in t.shape for t in tensors[1:])
    return adjacency_first or any(
        not per_sample(tuple(t.shape)) and sum(1 for n in t.shape if n == size) >= 2 for t in tensors[1:])


def trailing_runs(rows: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    """The id most rows of a 2-d id tensor end with (padding, or an end-of-sequence id; ties to
    the smallest, negative ids such as an ignore index left out), and the length of the run of
    it that each row ends in (0 where the row ends otherwise). None when no row ends in an id
    of 0 or more. The padding probes read a sequence batch's layout from it."""
    last = rows[:, -1]
    ids, counts = torch.unique(last[last >= 0], return_counts=True)
    if ids.numel() == 0:
        return None
    pad = ids[counts.argmax()]
    # positions counted from 1; the last one that is not the id ends the row's text
    not_pad = (rows != pad).float() * torch.arange(1, rows.shape[1] + 1, device=rows.device)
    return int(pad), rows.shape[1] - not_pad.amax(dim=1).long()


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        mapped = [map_tensors(o, fn) for o in obj]
        return type(obj)(*mapped) if hasattr(obj, "_fields") else tuple(mapped)  # a namedtuple keeps its type
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """The elements a tensor stores: itself when dense; a sparse tensor's values (a graph's
    adjacency, say), whose implicit zeros change no norm and hold no NaN. Elementwise ops
    such as isfinite or a comparison do not run on sparse layouts."""
    if t.layout == torch.strided:
        return t
    if t.layout == torch.sparse_coo:
        return (t if t.is_coalesced() else t.coalesce()).values()
    return t.values()


def has_nonfinite(obj: Any) -> bool:
    """Whether a floating tensor in ``obj`` holds a NaN/Inf (stops at the first such tensor)."""
    return any(t.is_floating_point() and not bool(torch.isfinite(stored_values(t)).all()) for t in iter_tensors(obj))


def nonfinite_count(obj: Any) -> int:
    """Non-finite elements over every floating tensor in ``obj``."""
    return sum(int((~torch.isfinite(stored_values(t))).sum()) for t in iter_tensors(obj)
               if t.is_floating_point() or t.is_complex())  # fmt: skip


def first_output(output: Any) -> torch.Tensor | None:
    """The tensor that stands for the model's prediction: ``.logits`` of a Hugging Face
    output, else the first tensor found."""
    return next(iter_tensors(prediction(output)), None)


def roundoff_tolerance(model: nn.Module, outputs: list[torch.Tensor], dtype: torch.dtype | None = None) -> float:
    """How far two evaluations of the same outputs may differ by rounding alone: the
    dtype's eps, times the output's magnitude, times √(the largest reduction a layer
    makes) — rounding errors of a sum of n terms grow like √n —, times the number of
    weighted layers they pass through, with a safety factor of 8. Two forwards that
    reduce in a different order (a half batch, another kernel) differ by about this
    much, never by exactly zero; a real difference (dropout, batch statistics) is
    orders of magnitude larger."""
    floats = [t for t in outputs if t.is_floating_point() and t.numel()]
    dtype = dtype or min((t.dtype for t in floats), key=lambda d: -torch.finfo(d).eps, default=torch.float32)
    fan_ins = [p[0].numel() for p in nn.Module.parameters(model) if p.dim() >= 2]
    magnitude = max([1.0, *(float(t.detach().abs().float().nan_to_num(0.0, 0.0, 0.0).max()) for t in floats)])
    return 8.0 * torch.finfo(dtype).eps * math.sqrt(max(fan_ins, default=1)) * max(1, len(fan_ins)) * magnitude


# --------------------------------------------------------------------------- task


def loss_name(loss_fn: LossFn) -> str:
    """The name reports use for a loss: ``CrossEntropyLoss`` for the module, for
    ``F.cross_entropy`` and for a ``functools.partial`` of either (see :mod:`nndx.vocab`);
    ``model`` when the model computes its own loss."""
    if loss_fn is None:
        return "model"
    fn = getattr(loss_fn, "func", loss_fn)  # functools.partial
    if isinstance(fn, nn.Module):
        return type(fn).__name__
    return vocab.loss_name(getattr(fn, "__name__", type(fn).__name__))


def infer_task(loss_fn: LossFn, targets: Any) -> str | None:
    """'classification' for a classification loss or integer targets, 'regression' for
    floating targets under any other loss, None when there is no telling — as for targets
    of both kinds (a PPO batch's actions, old log-probabilities and returns), which a loss
    of several terms reads each its own way."""
    if vocab.loss_task(loss_name(loss_fn)) == "classification":
        return "classification"
    target = first_output(targets)
    if target is None:
        return None
    if len({t.is_floating_point() for t in iter_tensors(targets)}) > 1:
        return None
    if not target.is_floating_point() and not target.is_complex():
        return "classification"
    return "regression"


def num_classes(loss_fn: LossFn, output: Any) -> int | None:
    """Classes the output can express: its class axis for (log-)softmax losses, 2 for a
    single-logit binary loss."""
    out = first_output(output)
    if out is None or out.dim() == 0:
        return None
    kind = vocab.loss_kind(loss_name(loss_fn))
    if kind is None:
        return None
    if kind.class_axis:
        return int(out.shape[1]) if out.dim() >= 2 else int(out.shape[0])
    if kind.binary:
        return 2 if out.dim() == 1 or out.shape[-1] == 1 else None
    return None


def accuracy(loss_fn: LossFn, output: Any, targets: Any, loss_type: str | None = None) -> float | None:
    """Share of correct predictions on the batch, or None when the loss does not say how
    to read predictions off the output. ``loss_type`` names the loss when ``loss_fn`` is
    a function of the user's own (what :class:`~nndx.collector.loss_call.InnerLossCalls`
    saw it call, with the output and target that call got)."""
    out, target = first_output(output), first_output(targets)
    if out is None or target is None:
        return None
    out = out.detach()
    target = target.detach()
    kind = vocab.loss_kind(loss_type or loss_name(loss_fn))
    if kind is None and loss_fn is None and not target.is_floating_point():
        kind = vocab.loss_kind("CrossEntropyLoss")  # a model's own loss over class indices: logits, read by argmax
    if kind is None:
        return None
    if kind.class_axis and out.dim() >= 2:
        predicted = out.argmax(dim=1)
        if target.is_floating_point() and target.shape == out.shape:  # class probabilities as targets
            target = target.argmax(dim=1)
        if predicted.shape != target.shape and out.shape[:-1] == target.shape:
            predicted = out.argmax(dim=-1)  # (batch, time, classes) that the loss flattens: a language model
        if predicted.shape != target.shape:
            return None
        return float((predicted == target).float().mean())
    if kind.binary:
        threshold = 0.5 if kind.expects == "probabilities" else 0.0
        if out.numel() != target.numel():
            return None
        predicted = (out > threshold).reshape(-1)
        return float((predicted == (target.reshape(-1) > 0.5)).float().mean())
    return None
