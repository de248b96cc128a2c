"""Hypothesis strategies for reports that validate but hold the extremes: ±1e308,
5e-324, NaN and ±inf anywhere a float goes, steps up to 10**400, empty series, one
point, names that are markup, many layers."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from nndx.report import (
    ActivationStats,
    DataStats,
    DiagnosticReport,
    GradientStats,
    GradNormPoint,
    InterventionResult,
    Interventions,
    LayerStats,
    LiveFinding,
    LoopStats,
    LossPoint,
    LRPoint,
    LRRangeResult,
    OverfitResult,
    ParameterStats,
    Probes,
    RunInfo,
    ScalarPoint,
    SplitStats,
)

EXTREMES = [0.0, -0.0, 5e-324, -5e-324, 1e-300, 1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308,
            math.inf, -math.inf, math.nan, 1.0, 1e-3]  # fmt: skip
EVIL = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "&amp;", "</script><!--", "a\x00b",
        "  ", "", "<b>bold</b>", "\u202eevil", "x" * 300, "0", "1e5"]  # fmt: skip

floats = st.one_of(st.sampled_from(EXTREMES), st.floats(allow_nan=True, allow_infinity=True))
positive_floats = st.one_of(st.sampled_from([5e-324, 1e-300, 1e308, 1.0]), st.floats(min_value=0.0, exclude_min=True))
fractions = st.one_of(st.sampled_from([0.0, 1.0, 5e-324]), st.floats(min_value=0.0, max_value=1.0))
steps = st.one_of(st.integers(0, 1000), st.sampled_from([0, 2**53 + 1, 2**63, 10**300, 10**400]))
counts = st.one_of(st.integers(0, 10), st.sampled_from([2**63, 10**400]))
names = st.one_of(st.sampled_from(EVIL), st.text(max_size=20))


def series(points: st.SearchStrategy, max_size: int = 8) -> st.SearchStrategy:
    return st.lists(points, max_size=max_size)


loss_points = st.builds(LossPoint, step=steps, value=floats, accuracy=st.one_of(st.none(), floats))
activation = st.builds(ActivationStats, mean=floats, std=floats, min=floats, max=floats, zero_fraction=fractions,
                       dead_unit_fraction=fractions, saturated_fraction=st.one_of(st.none(), fractions),
                       nonfinite_count=counts, unit_count=counts)  # fmt: skip
gradient = st.builds(GradientStats, abs_mean=floats, max=floats, norm=floats, nonfinite_count=counts)
layer_names = st.one_of(st.sampled_from(EVIL + [f"blocks.{i}.fc" for i in range(4)]), st.text(max_size=8))
layers = st.builds(LayerStats, name=layer_names, type=names, step=st.one_of(st.none(), steps),
                   activation=st.one_of(st.none(), activation), gradient=st.one_of(st.none(), gradient))  # fmt: skip
parameters = st.builds(ParameterStats, name=layer_names, step=st.one_of(st.none(), steps), weight_norm=floats,
                       grad_norm=st.one_of(st.none(), floats), update_ratio=st.one_of(st.none(), floats))  # fmt: skip
live = st.builds(LiveFinding, rule_id=names, code=names, severity=st.sampled_from(["info", "warning", "error"]),
                 title=names, step=steps)  # fmt: skip
loops = st.builds(
    LoopStats,
    steps=counts,
    lr_history=series(st.builds(LRPoint, step=steps, lrs=st.lists(floats, max_size=3))),
    grad_norm_history=series(st.builds(GradNormPoint, step=steps, before_clip=floats,
                                       after_clip=st.one_of(st.none(), floats))),  # fmt: skip
    input_norm_history=series(st.builds(ScalarPoint, step=steps, value=floats)),
    live_findings=series(live, 4),
)
lr_range = st.builds(
    LRRangeResult,
    status=st.sampled_from(["passed", "failed", "error", "skipped"]),
    lrs=series(floats, 20), losses=series(floats, 20), smoothed=series(floats, 20),
    suggested_lr=st.one_of(st.none(), floats), valley_lr=st.one_of(st.none(), floats),
    min_over_10_lr=st.one_of(st.none(), floats), diverged_at_lr=st.one_of(st.none(), floats),
)  # fmt: skip
overfit = st.builds(OverfitResult, status=st.sampled_from(["passed", "failed"]), losses=series(floats),
                    initial_loss=st.one_of(st.none(), floats), final_loss=st.one_of(st.none(), floats))  # fmt: skip
splits = st.builds(SplitStats, n_samples=counts, input_mean=st.one_of(st.none(), floats),
                   feature_stds=series(floats, 6), class_counts=st.dictionaries(names, counts, max_size=4),
                   imbalance_ratio=st.one_of(st.none(), floats))  # fmt: skip
data = st.builds(DataStats, train=st.one_of(st.none(), splits), test=st.one_of(st.none(), splits))

interventions = st.builds(
    Interventions, steps=counts, baseline_initial_loss=st.one_of(st.none(), floats),
    results=series(st.builds(InterventionResult, cause=names, remedy=names,
                             status=st.sampled_from(["confirmed", "not_confirmed", "inconclusive", "skipped", "error"]),
                             baseline_final_loss=st.one_of(st.none(), floats),
                             remedied_progress=st.one_of(st.none(), floats)), 3),
)  # fmt: skip

reports = st.builds(
    DiagnosticReport,
    run=st.one_of(st.none(), st.builds(RunInfo, name=st.one_of(st.none(), names), project=st.one_of(st.none(), names))),
    loss_history=st.dictionaries(names, series(loss_points), max_size=3),
    layers=series(layers),
    parameters=series(parameters),
    loop=st.one_of(st.none(), loops),
    probes=st.one_of(st.none(), st.builds(Probes, lr_range=st.one_of(st.none(), lr_range),
                                          overfit_one_batch=st.one_of(st.none(), overfit))),  # fmt: skip
    data=st.one_of(st.none(), data),
    interventions=st.one_of(st.none(), interventions),
)
