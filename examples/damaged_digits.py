"""Six silent data bugs planted in scikit-learn's digits, each found by nndx.

The clean copy is standardised with train statistics, shuffled and split, with the
always-blank border pixels dropped. Each damaged copy plants one bug that crashes
nothing — a model still trains on every one of them:

- NaNs in a few pixels                        -> NAN_IN_DATA
- 15% of the training rows repeated           -> DUPLICATE_SAMPLES
- test rows copied from the training split    -> DATA_LEAKAGE
- labels shuffled separately from the images  -> LABELS_MISALIGNED (label-alignment probe)
- raw 0-16 pixel values, not standardised     -> UNNORMALIZED_INPUTS
- class 3 dropped from the training split     -> LABEL_NOISE (a class the model never sees)

For each copy the script runs ``check_data`` and the label-alignment probe, diagnoses
the report with the rules, and prints what was found. It exits 1 if a damage is missed
or the clean copy raises any warning.

Run: ``.venv/bin/python examples/damaged_digits.py``
"""

from __future__ import annotations

import sys

import numpy as np
from sklearn.datasets import load_digits

import nndx
from nndx.collector.probes.label_alignment import label_alignment
from nndx.report import SEVERITY_ORDER, DiagnosticReport, Probes

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def clean_split(seed: int = 0) -> tuple[Split, np.ndarray]:
    """(x_train, y_train, x_test, y_test) standardised, plus the raw pixels in the same order."""
    bunch = load_digits()
    order = np.random.default_rng(seed).permutation(len(bunch.data))
    x, y = bunch.data[order], bunch.target[order]
    n_train = 1350
    keep = x[:n_train].std(axis=0) > 0
    mean, std = x[:n_train, keep].mean(axis=0), x[:n_train, keep].std(axis=0)
    standardised = ((x[:, keep] - mean) / std).astype(np.float32)
    raw = x[:, keep].astype(np.float32)
    return (standardised[:n_train], y[:n_train], standardised[n_train:], y[n_train:]), raw[:n_train]


def damaged_copies() -> dict[str, tuple[Split, str | None]]:
    (x_train, y_train, x_test, y_test), raw_train = clean_split()
    rng = np.random.default_rng(1)
    copies: dict[str, tuple[Split, str | None]] = {"clean": ((x_train, y_train, x_test, y_test), None)}

    nans = x_train.copy()
    nans[rng.choice(len(nans), 5, replace=False), 10] = np.nan
    copies["NaN pixels"] = ((nans, y_train, x_test, y_test), "NAN_IN_DATA")

    repeated = rng.choice(len(x_train), 240, replace=False)
    copies["repeated rows"] = (
        (np.concatenate([x_train, x_train[repeated]]), np.concatenate([y_train, y_train[repeated]]), x_test, y_test),
        "DUPLICATE_SAMPLES",
    )

    leaked_x, leaked_y = x_test.copy(), y_test.copy()
    leaked_x[:40], leaked_y[:40] = x_train[:40], y_train[:40]
    copies["leaked test rows"] = ((x_train, y_train, leaked_x, leaked_y), "DATA_LEAKAGE")

    copies["shuffled labels"] = ((x_train, rng.permutation(y_train), x_test, y_test), "LABELS_MISALIGNED")
    copies["raw 0-16 scale"] = ((raw_train, y_train, x_test, y_test), "UNNORMALIZED_INPUTS")

    keep = y_train != 3
    copies["class 3 removed"] = ((x_train[keep], y_train[keep], x_test, y_test), "LABEL_NOISE")
    return copies


def diagnose_copy(split: Split) -> list[str]:
    """Cause codes of the warning-or-worse findings for one copy of the data."""
    x_train, y_train, x_test, y_test = split
    report = DiagnosticReport(
        task="classification",
        num_classes=10,
        data=nndx.check_data(x_train, y_train, x_test=x_test, y_test=y_test, num_classes=10),
        probes=Probes(label_alignment=label_alignment(x_train, y_train, steps=100)),
    )
    diagnosis = nndx.diagnose(report)
    return [f.code.value for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]]


def main() -> int:
    failures = 0
    print(f"{'copy':<18} {'expected':<20} {'found (warning or worse)':<50} ok")
    for name, (split, expected) in damaged_copies().items():
        found = diagnose_copy(split)
        ok = (expected in found) if expected else not found
        failures += not ok
        print(f"{name:<18} {expected or '-':<20} {', '.join(found) or '-':<50} {'yes' if ok else 'NO'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
