"""Live alerts: the rules a running loop can already answer, evaluated while it runs.

Every ``alert_every`` steps a Monitor's :class:`LiveAlerts` observer asks the Monitor
for a windowed report (``monitor.local_report(window=LIVE_WINDOW)``: the newest points
of each history, the first and newest recorded steps), runs :data:`LIVE_RULES` on it and
reports each *new* finding once: a log record on the ``"nndx"`` logger (warning or
error), ``on_finding(finding)``, and — with ``stop_on="error"`` (or ``"warning"``) — a
:class:`TrainingFailure` raised out of ``optimizer.step()`` (that step is already
applied). ``finding.step`` is the step it first fired at; the report's
``loop.live_findings`` keeps them all (time to detection).

This module imports no torch and no collector: it talks to the Monitor through the
small :class:`WindowedSource` protocol, and ``nndx.Monitor``
(:mod:`nndx.integrations.monitor`) wires it in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nndx.errors import NndxError
from nndx.report import SEVERITY_ORDER, DiagnosticReport, Finding, LiveFinding
from nndx.rules._series import memoized
from nndx.rules.engine import REGISTRY, Rule

__all__ = ["LIVE_RULES", "LIVE_WINDOW", "LiveAlerts", "TrainingFailure"]

logger = logging.getLogger("nndx")

# The rules that need only what a running loop has shown so far, and cannot be fooled
# by a run that is merely young — NaN/Inf loss (NNDX101/102), dead units (NNDX201/208),
# exploding gradients (NNDX204), missing zero_grad (NNDX301), optimizer not connected
# (NNDX303), LR collapsed by the schedule (NNDX307), an autograd graph growing across
# steps (NNDX320), no optimizer step (NNDX321). None of them reads input norms or the
# unchanged parameters, which a live window leaves out.
LIVE_RULES = ("NNDX101", "NNDX102", "NNDX201", "NNDX204", "NNDX208", "NNDX301", "NNDX303", "NNDX307", "NNDX320", "NNDX321")
LIVE_WINDOW = 256  # newest points of each history the live rules read
_LOG_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class TrainingFailure(NndxError):
    """Raised by a Monitor created with ``stop_on=...`` when a live finding of that
    severity (or worse) fires, so a doomed run stops early. ``findings`` holds them."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        summary = "; ".join(f"{f.code.value} at step {f.step}: {f.title}" for f in self.findings)
        super().__init__(f"nndx stopped training: {summary}")

    @property
    def finding(self) -> Finding | None:
        return self.findings[0] if self.findings else None


class WindowedSource(Protocol):
    """What live alerts need from a Monitor."""

    def local_report(self, window: int | None = None) -> DiagnosticReport: ...

    def record_error(self, source: str, exc: BaseException) -> None: ...


class LiveAlerts:
    """A Monitor observer: every ``alert_every`` completed steps (0: never), evaluate the
    live rules and report each new finding once (see the module docstring). A check
    waits for the Monitor's next recorded step, whose values are fetched from the device
    anyway, unless ``alert_every`` is shorter than the Monitor's ``every``."""

    def __init__(
        self,
        alert_every: int,
        on_finding: Callable[[Finding], None] | None = None,
        stop_on: str | None = None,
        rule_ids: Sequence[str] = LIVE_RULES,
    ) -> None:
        if stop_on not in (None, "warning", "error"):
            raise ValueError(f"stop_on must be None, 'warning' or 'error', got {stop_on!r}")
        self.alert_every = int(alert_every)
        self.on_finding = on_finding
        self.stop_on = stop_on
        self.rules: list[Rule] = [REGISTRY[rule_id] for rule_id in rule_ids if rule_id in REGISTRY]
        self.findings: dict[str, Finding] = {}  # rule id -> its first finding
        self._live: list[LiveFinding] = []
        self._due = 0  # completed steps before the next check (0: alert_every)

    def on_step(self, monitor: WindowedSource, step: int, recorded: bool) -> None:
        if not self.alert_every or step + 1 < (self._due or self.alert_every):
            return
        if not recorded and self.alert_every >= getattr(monitor, "every", 1):
            return  # wait for the next recorded step: its values are fetched anyway (one sync, not two)
        self._due = step + 1 + self.alert_every
        stopping = []
        for finding in self.check(monitor, step):
            logger.log(_LOG_LEVEL[finding.severity], "nndx: %s %s at step %d: %s (%s)",
                       finding.severity, finding.code.value, finding.step, finding.title, finding.symptom)  # fmt: skip
            if self.on_finding is not None:
                try:
                    self.on_finding(finding)
                except TrainingFailure:
                    raise
                except Exception as exc:  # noqa: BLE001 - the user's callback must not kill training
                    monitor.record_error("on_finding", exc)
            if self.stop_on is not None and SEVERITY_ORDER[finding.severity] >= SEVERITY_ORDER[self.stop_on]:
                stopping.append(finding)
        if stopping:
            raise TrainingFailure(stopping)

    def check(self, monitor: WindowedSource, step: int) -> list[Finding]:
        """Evaluate the live rules on ``monitor``'s live window; returns the findings new
        since the last evaluation, each stamped with ``step`` (the step it first fired)."""
        if not self.rules:
            return []
        try:
            partial = monitor.local_report(window=LIVE_WINDOW)
        except Exception as exc:  # noqa: BLE001
            monitor.record_error("live_report", exc)
            return []
        new = []
        with memoized():  # the rules share the curves they derive, as in diagnose()
            for rule in self.rules:
                try:
                    findings = rule.run(partial)
                except Exception as exc:  # noqa: BLE001 - a broken rule must not stop training
                    monitor.record_error(f"rule {rule.id}", exc)
                    continue
                for finding in findings:
                    if finding.rule_id in self.findings:
                        continue
                    finding = finding.model_copy(update={"step": step})
                    self.findings[finding.rule_id] = finding
                    self._live.append(LiveFinding(rule_id=finding.rule_id, code=finding.code.value,
                                                  severity=finding.severity, title=finding.title, step=step))
                    new.append(finding)
        return new

    def report(self, window: int | None) -> dict[str, Any]:
        return {"loop": {"live_findings": list(self._live)}}
