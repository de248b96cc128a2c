"""No valid report crashes the rules: seeded random damage to realistic reports (edge
numbers, NaN/Inf everywhere a float may be, emptied lists), then diagnose twice."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from nndx.report import DiagnosticReport
from nndx.rules import diagnose

from . import lesson
from .broken import BROKEN
from .reports import healthy_reports

EDGE_FLOATS = [0.0, -0.0, -1.0, 1e-300, 1e300, math.nan, math.inf, -math.inf, 0.5]
EDGE_INTS = [0, 1, 2, 10**9]


def _damage(value, rng: random.Random, rate: float):
    if isinstance(value, dict):
        return {k: _damage(v, rng, rate) for k, v in value.items()}
    if isinstance(value, list):
        if value and rng.random() < rate:
            return [] if rng.random() < 0.5 else value[: rng.randrange(len(value))]
        return [_damage(v, rng, rate) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if rng.random() >= rate:
        return value
    return rng.choice(EDGE_INTS) if isinstance(value, int) else rng.choice(EDGE_FLOATS)


def _sources() -> list[DiagnosticReport]:
    reports = list(healthy_reports().values()) + [build() for build in BROKEN.values()]
    return reports + [lesson.lr_10(), lesson.dead_relu_bias(), lesson.missing_zero_grad()]


@pytest.mark.parametrize("seed", range(3))
def test_damaged_reports_never_crash_the_rules(seed):
    rng = random.Random(seed)
    checked = 0
    for source in _sources():
        for _ in range(4):
            data = _damage(source.model_dump(), rng, rate=0.05)
            try:
                report = DiagnosticReport.model_validate(data)
            except ValidationError:
                continue  # outside the schema (a fraction of 1e300): the API rejects it first
            first = diagnose(report).model_dump_json()
            assert diagnose(report).model_dump_json() == first
            checked += 1
    assert checked > 40
