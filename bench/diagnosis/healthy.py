"""Healthy variants: correct training that looks suspicious to a naive checker.

Each is a change of the family's correct script that a careful user makes on purpose.
A diagnosis of any of them with a finding of severity warning or error is a false
alarm. The harness checks each one actually learns (its validation loss falls well
below the start); one that does not is reported as a harness problem, not scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .families import Family
from .operators import ALL_STYLES, LOOP, classifier, every, micro_batches, mild_imbalance, small_train, sort_by_label
from .spec import Spec

NO_MANUAL = ALL_STYLES - {"manual"}


@dataclass(frozen=True)
class Variant:
    name: str
    mutate: Callable[[Spec], Spec]
    families: Callable[[Family], bool]
    styles: frozenset[str] = ALL_STYLES
    doc: str = ""


VARIANTS: tuple[Variant, ...] = (
    Variant("as_written", lambda s: s, every, doc="the family's script unchanged"),
    Variant("one_cycle_per_batch", lambda s: s.with_(schedule="onecycle"), every, NO_MANUAL,
            doc="OneCycleLR stepped every batch, as documented"),
    Variant("warmup_cosine_per_batch", lambda s: s.with_(schedule="warmup_cosine"), every, NO_MANUAL),
    Variant("bf16_autocast_scaler_clip", lambda s: s.with_(amp=True, clip=1.0), every, NO_MANUAL,
            doc="CPU autocast(bfloat16) + GradScaler('cpu'), unscale_ then clip_grad_norm_(1.0)"),
    Variant("accumulation_scaled", micro_batches, every, LOOP | {"lightning"},
            doc="4 micro-batches, each loss divided by 4 (Lightning: accumulate_grad_batches=4)"),
    Variant("frozen_pretrained_backbone", lambda s: s.with_(freeze="pretrained"), every,
            doc="backbone trained first, then frozen; a new head trains on it"),
    Variant("label_smoothing", lambda s: s.with_(label_smoothing=0.1), lambda f: f.task in ("multiclass", "lm")),
    Variant("heavy_dropout", lambda s: s.with_(dropout=0.5), lambda f: f.task != "lm"),
    Variant("tiny_dataset", lambda s: s.plus_data(small_train).with_(steps=80, batch_size=16), every,
            doc="64 training samples"),
    Variant("functional_activations", lambda s: s.with_(functional=True), lambda f: not f.functional),
    Variant("module_activations", lambda s: s.with_(functional=False), lambda f: f.functional),
    Variant("float64", lambda s: s.with_(dtype="float64"), every),
    Variant("manual_sgd_clipped", lambda s: s.with_(clip=1.0), every, frozenset({"manual"}),
            doc="hand-written SGD with clip_grad_norm_(1.0)"),
    Variant("token_ids", lambda s: s.with_(token_inputs=True), lambda f: f.name == "lstm",
            doc="integer token ids through an embedding"),
    Variant("class_weighted_loss", lambda s: s.plus_data(mild_imbalance).with_(class_weights=True), classifier,
            doc="4:1 imbalance, weighted loss"),
    Variant("truncated_bptt_detach", lambda s: s.with_(carry_state="detach"), lambda f: f.name == "lstm", LOOP,
            doc="state carried across batches and detached"),
    Variant("sgd_momentum_steplr", lambda s: s.with_(optimizer="sgd", schedule="step_per_epoch"), every,
            doc="SGD(momentum=0.9) with StepLR stepped per epoch"),
    Variant("adamw_weight_decay", lambda s: s.with_(optimizer="adamw", weight_decay=0.05), every, NO_MANUAL),
    Variant("stored_by_class", lambda s: s.plus_data(sort_by_label),
            lambda f: f.task in ("multiclass", "binary", "regression"),
            doc="training data stored sorted by label (an ImageFolder's order); the loader shuffles"),
    Variant("full_batch", lambda s: s.with_(batch_size=10_000, steps=100), lambda f: f.inputs != "tokens",
            doc="the whole training set in every batch"),
)  # fmt: skip

BY_NAME = {v.name: v for v in VARIANTS}
assert len(BY_NAME) == len(VARIANTS)
