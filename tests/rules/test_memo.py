"""The per-diagnose memo shares derived curves between rules, never between reports."""

from nndx.report import DiagnosticReport, LossPoint
from nndx.rules._series import loss_curve, memoized


def _report(start: float) -> DiagnosticReport:
    return DiagnosticReport(loss_history={"train": [LossPoint(step=s, value=start - 0.01 * s) for s in range(20)]})


def test_curve_is_shared_inside_one_diagnose_and_recomputed_outside() -> None:
    a, b = _report(2.0), _report(5.0)
    assert loss_curve(a) is not loss_curve(a)  # no memo outside diagnose
    with memoized():
        assert loss_curve(a) is loss_curve(a)
        assert loss_curve(b).start > 4.9 and loss_curve(a).start < 2.1  # per report
        assert loss_curve(a, "val").n == 0  # per split
    with memoized():  # a fresh memo per call
        first = loss_curve(a)
    with memoized():
        assert loss_curve(a) is not first
