"""How numbers print, one way everywhere: prompts, checklists, pages, plot hover text.

``num`` prints 4 significant digits with a short exponent (``1e-5``), ``NaN``, ``inf``
and ``-inf`` for non-finite values (what torch and numpy print, so a reader recognises
them), ``—`` for a missing value. It never raises, whatever a report that validates
holds: integers too large for a float (a step of ``10**400``) print in the same
exponent form.
"""

from __future__ import annotations

import math

MISSING = "—"
#: Integers print exactly below this; above it, as ``1.235e20`` (like floats).
EXACT_INT_LIMIT = 10**16


def num(value: float | int | bool | None, digits: int = 4) -> str:
    """A number for people: ``num(0.000012345) == "1.234e-5"``, ``num(float("nan")) == "NaN"``,
    ``num(-math.inf) == "-inf"``, ``num(None) == "—"``, ``num(True) == "yes"``."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value) if abs(value) < EXACT_INT_LIMIT else _big_int(value, digits)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"  # also for -0.0
    text = f"{value:.{digits}g}"
    mantissa, sep, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if sep else text


def _big_int(value: int, digits: int) -> str:
    """``num`` of an integer beyond float range or str()'s digit limit, without either."""
    magnitude = abs(value)
    exponent = int(math.log10(magnitude))
    # math.log10 of a huge int can be one off at exact powers of ten: correct it exactly
    if 10**exponent > magnitude:
        exponent -= 1
    elif 10 ** (exponent + 1) <= magnitude:
        exponent += 1
    scale = 10 ** (exponent - digits + 1)
    leading, rest = divmod(magnitude, scale)  # the first `digits` digits, rounded half up
    leading += 2 * rest >= scale
    if leading >= 10**digits:  # rounding carried into a new digit
        leading //= 10
        exponent += 1
    return f"{'-' if value < 0 else ''}{leading / 10 ** (digits - 1):.{digits}g}e{exponent}"


def value_text(value: object, max_items: int = 8) -> str:
    """Any evidence value as plain (unescaped) text; numbers through ``num``, long lists
    shortened to ``max_items`` and a count."""
    if isinstance(value, (list, tuple)):
        shown = [value_text(v) for v in value[:max_items]]
        if len(value) > max_items:
            shown.append(f"… ({len(value)} values)")
        return "[" + ", ".join(shown) + "]"
    if value is None or isinstance(value, (bool, int, float)):
        return num(value)
    return str(value)
