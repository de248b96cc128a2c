"""The twin check: a case counts only when its buggy run measurably differs from the
run with the bug fixed, measured by the harness (never by nndx).

Measures, by operator class:

- ``worse`` (most bugs): the buggy run raised or went non-finite, or its validation
  quality (accuracy; R² for regression) against the true labels is at least
  ``QUALITY_MARGIN`` lower, or its reference validation loss is higher than the twin's
  by at least ``LOSS_RATIO`` × + ``LOSS_ABS``, or by at least ``PROGRESS_SHARE`` of the
  progress the twin made from its initial loss (a loss with a large irreducible part,
  like a VAE's, moves little in ratio).
- ``either`` (axis mix-ups): ``worse``, or ``better`` — a mix-up can also let a
  model see what it should not (attention across the future).
- ``better`` (leakage): the validation numbers the user sees are inflated — quality at
  least ``GAIN_MARGIN`` higher, or the reference loss at most ``GAIN_RATIO`` × the twin's.
- ``nonfinite`` (numerics): the buggy run produced NaN/Inf (or raised), the twin did not.
- ``graph`` (a retained graph): the autograd graph behind the loss grew at least
  ``GRAPH_GROWTH`` × over the run, the twin's did not (or the buggy run raised, as
  backward through a kept graph does once the optimizer changed its weights in place).
"""

from __future__ import annotations

from .training import Outcome

QUALITY_MARGIN = 0.05
LOSS_RATIO, LOSS_ABS = 1.2, 0.02
PROGRESS_SHARE = 0.1
GAIN_MARGIN, GAIN_RATIO = 0.03, 0.85
GRAPH_GROWTH = 2.0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def differs(measure: str, buggy: Outcome, fixed: Outcome) -> tuple[bool, str]:
    """(counts, why) for a buggy run against its fixed twin."""
    if fixed.crashed or fixed.nonfinite:
        return False, f"the fixed twin failed itself ({fixed.crashed or 'non-finite'})"
    if buggy.crashed:
        return True, f"the buggy run raised {buggy.crashed[:80]}"
    if measure == "graph":
        ok = buggy.graph_growth >= GRAPH_GROWTH and fixed.graph_growth < GRAPH_GROWTH
        return ok, f"autograd graph grew {buggy.graph_growth:.1f}x (twin {fixed.graph_growth:.1f}x)"
    if buggy.nonfinite:
        return True, "the buggy run went non-finite"
    if measure == "nonfinite":
        return False, "no NaN/Inf in the buggy run"
    q_b, q_f, l_b, l_f = buggy.quality, fixed.quality, buggy.ref_loss, fixed.ref_loss
    numbers = f"quality {_fmt(q_f)} -> {_fmt(q_b)}, val loss {_fmt(l_f)} -> {_fmt(l_b)}"
    gain = (q_b is not None and q_f is not None and q_b - q_f >= GAIN_MARGIN) or (l_b <= l_f * GAIN_RATIO)
    progress = (fixed.initial_ref_loss - l_f) if fixed.initial_ref_loss is not None else 0.0
    worse = ((q_b is not None and q_f is not None and q_f - q_b >= QUALITY_MARGIN)
             or l_b >= l_f * LOSS_RATIO + LOSS_ABS
             or (progress > 0 and l_b - l_f >= max(PROGRESS_SHARE * progress, LOSS_ABS)))  # fmt: skip
    if measure == "better":
        return gain, numbers
    if measure == "either":
        return worse or gain, numbers
    return worse, numbers


def learned(outcome: Outcome) -> tuple[bool, str]:
    """A healthy run must train: finite, and a validation loss below its start."""
    if outcome.crashed or outcome.nonfinite:
        return False, outcome.crashed or "non-finite"
    start, end = outcome.initial_ref_loss, outcome.ref_loss
    return (start is None or end < start), f"val loss {_fmt(start)} -> {_fmt(end)}, quality {_fmt(outcome.quality)}"
