"""A training script as data: what a bug operator or a healthy variant changes.

A :class:`Spec` names a model family, a seed and every knob a user's script has — how
the model is written, the loss, the optimizer, the loop and the data pipeline. The
default of each knob is the family's correct script. Bug operators and healthy variants
are functions ``Spec -> Spec`` (``dataclasses.replace``); the harness turns a spec into
a model, an optimizer and a loop (:mod:`.training`) that read the knobs the way a user's
code would be written, so nndx only ever sees an ordinary training run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch


@dataclass
class Data:
    """Train and validation tensors as the user's script holds them."""

    x: torch.Tensor
    y: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    num_classes: int | None = None
    y_val_true: torch.Tensor | None = None  # the validation labels before any label bug: what the twin check measures against


DataOp = Callable[[Data, torch.Generator, "Spec"], Data]


@dataclass(frozen=True)
class Spec:
    family: str
    seed: int
    # -- the model, as its code is written
    bugs: frozenset[str] = frozenset()  # switches the family's model code reads (see families.MODEL_SWITCHES)
    functional: bool | None = None  # hidden activations as F.relu (True) or nn.ReLU modules; None: the family's way
    act: str | None = None  # hidden activation kind for MLP-like families ("relu", "tanh", "sigmoid")
    width: int | None = None  # hidden width; None: the family's
    depth: int | None = None  # hidden layers of MLP-like families; None: the family's
    dropout: float | None = None
    init: str | None = None  # "zero", "large", "dead_bias"
    init_std: float = 1.0  # the std of init="large"
    dtype: str = "float32"
    logit_scale: float = 1.0  # a "temperature" the output is multiplied by
    token_inputs: bool = False  # sequence families: integer token ids through an embedding
    # -- the data pipeline
    data_ops: tuple[DataOp, ...] = ()
    zeroed_batch_fraction: float = 0.0  # batches the loader silently zeroes
    shuffle: bool = True
    batch_size: int | None = None
    steps: int | None = None
    # -- the loss
    loss: str = "default"  # see training.make_loss
    label_smoothing: float = 0.0
    class_weights: bool = False
    # -- optimisation and the loop
    optimizer: str | None = None  # "adam", "adamw", "sgd"; None: the family's
    lr: float | None = None
    lr_scale: float = 1.0
    weight_decay: float = 0.0
    schedule: str | None = None  # "step_per_batch", "onecycle", "warmup_cosine", "step_per_epoch", "cosine"
    clip: float | None = None
    accumulate: int = 1
    divide_accumulated: bool = True
    zero_grad: bool = True
    optimizer_step: bool = True
    stale_optimizer: bool = False  # the optimizer holds a model that was re-created afterwards
    eval_mode: bool = True  # validation under model.eval()
    train_after_eval: bool = True  # model.train() back after validation (False: once, before the loop)
    amp: bool = False  # bf16 autocast + GradScaler with unscale_ before clipping
    running_loss_tensor: bool = False  # total_loss += loss (the tensor, not loss.item())
    carry_state: str | None = None  # recurrent state carried across batches: "detach" or "retain"
    freeze: str | None = None  # "pretrained": backbone trained first then frozen; "random": frozen at init

    def with_(self, **changes: Any) -> Spec:
        return replace(self, **changes)

    def plus_bugs(self, *names: str) -> Spec:
        return replace(self, bugs=self.bugs | frozenset(names))

    def plus_data(self, *ops: DataOp) -> Spec:
        return replace(self, data_ops=self.data_ops + tuple(ops))
