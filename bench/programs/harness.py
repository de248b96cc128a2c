"""What every ported program shares: its citation, its variants, the nndx integration the
program's author would write, and the scoring.

A program module (``bench/programs/mnist.py`` ...) exports ``SOURCE`` (where the original
lives), ``VARIANTS`` (the healthy program and its buggy twins, each bug one that was
reported for that kind of program) and ``train(variant, nx)``: the program's own training
code, shrunk to run on a CPU in seconds, which returns the numbers its variants are
measured by. nndx enters the program only through ``nx`` (:class:`Nndx`), at the places
an author would put it: a preflight ``nndx.probe`` before training, ``nndx.Monitor``
around the loop, and ``nndx.probe(..., monitor=mon)`` + ``nndx.diagnose`` after it.

Every variant runs twice: once with ``nx`` switched off (the *measure* run: the numbers
that show the bug is real, untouched by nndx) and once with nndx attached (the
*diagnosis* run). The two runs should train identically; when their numbers differ,
nndx changed the user's training, and the table says so.

What nndx cannot attach to is recorded, never worked around: when ``nndx.Monitor``
refuses a loop (no optimizer object, say), the author's script would stop there, so the
diagnosis is the preflight's alone and the refusal is listed among the errors.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nndx.report import SEVERITY_ORDER, CauseCode, Diagnosis, ErrorRecord, Finding
from nndx.rules.engine import precedence

# --------------------------------------------------------------------------- what a program declares


@dataclass(frozen=True)
class Source:
    """Where the ported program lives: the port cites it in its docstring and the table."""

    repo: str
    path: str
    commit: str
    licence: str

    def cite(self) -> str:
        return f"github.com/{self.repo}/blob/{self.commit[:12]}/{self.path} ({self.licence})"


@dataclass(frozen=True)
class Measure:
    """How a buggy run is shown to differ from the healthy one.

    ``metric`` names a number ``train`` returns; ``differs(healthy, buggy)`` says whether
    the buggy value is measurably different, and ``describe`` says what is compared."""

    metric: str
    describe: str
    differs: Callable[[float, float], bool]


@dataclass(frozen=True)
class Variant:
    """The healthy program (``expected`` empty) or one bug planted in it.

    ``expected``: the cause codes that name the bug (a hit is a top-ranked finding with
    any of them; the first is the one the bug is filed under). ``reported``: where the
    bug was reported for this kind of program. ``bug``: what was changed, in one line."""

    name: str
    bug: str
    expected: tuple[CauseCode, ...] = ()
    reported: tuple[str, ...] = ()
    measure: Measure | None = None

    @property
    def healthy(self) -> bool:
        return not self.expected


# --------------------------------------------------------------------------- the integration


class NullMonitor:
    """Stands in for a Monitor that was switched off or refused: the loop's calls to it do
    nothing and ``loss_fn`` is the user's loss, so the training itself is unchanged."""

    def __init__(self, loss_fn: Callable[..., Any] | None = None) -> None:
        self.loss_fn = loss_fn

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@dataclass
class Nndx:
    """nndx as a program's author would call it; switched off for the measure run.

    Each call records what went wrong instead of raising: a crash of nndx is a result
    of the benchmark (an error in the table), not a crash of the benchmark."""

    enabled: bool = True
    name: str = ""
    preflight_diagnoses: list[Diagnosis] = field(default_factory=list)
    final_diagnoses: list[Diagnosis] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    monitors_refused: int = 0
    seconds: float = 0.0

    def preflight(self, model: Any, batch: Any, loss_fn: Callable[..., Any], **options: Any) -> None:
        """``nndx.probe`` on the untrained model, before the first step; ``diagnose`` it."""
        if not self.enabled:
            return
        import nndx

        started = time.perf_counter()
        try:
            report = nndx.probe(model, batch, loss_fn, **options)
            self.preflight_diagnoses.append(nndx.diagnose(report))
            self._note_report_errors("preflight", report.errors)
        except Exception as exc:  # noqa: BLE001 - nndx raising into the user's script is a result
            self.errors.append(f"preflight probe raised {type(exc).__name__}: {_first_line(exc)}")
        finally:
            self.seconds += time.perf_counter() - started

    def monitor(self, model: Any, optimizer: Any, **options: Any) -> Any:
        """``nndx.Monitor(model, optimizer, ...)``; a :class:`NullMonitor` when switched off
        or when the Monitor refuses to attach (recorded)."""
        if not self.enabled:
            return NullMonitor(options.get("loss_fn"))
        import nndx

        started = time.perf_counter()
        try:
            return nndx.Monitor(model, optimizer, name=self.name, **options)
        except Exception as exc:  # noqa: BLE001
            self.monitors_refused += 1
            self.errors.append(f"Monitor refused: {type(exc).__name__}: {_first_line(exc)}")
            return NullMonitor(options.get("loss_fn"))
        finally:
            self.seconds += time.perf_counter() - started

    def finish(self, monitor: Any, model: Any = None, batch: Any = None, loss_fn: Callable[..., Any] | None = None,
               **options: Any) -> None:  # fmt: skip
        """After training: ``nndx.probe(model, batch, loss_fn, monitor=mon, ...)`` then
        ``nndx.diagnose`` (the README's order); with no batch, the Monitor's report alone.
        A refused Monitor means the author's script stopped at it: nothing to add."""
        if not self.enabled or isinstance(monitor, NullMonitor):
            return
        import nndx

        started = time.perf_counter()
        try:
            monitor.close()
            if batch is None:
                report = monitor.report()
            else:
                report = nndx.probe(model, batch, loss_fn, monitor=monitor, **options)
            self.final_diagnoses.append(nndx.diagnose(report))
            self._note_report_errors("final", report.errors)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"final probe raised {type(exc).__name__}: {_first_line(exc)}")
        finally:
            self.seconds += time.perf_counter() - started

    def timed(self, fn: Callable[[], Any]) -> Any:
        """Count an nndx call made inside the program (e.g. ``mon.log``) as nndx time."""
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds += time.perf_counter() - started

    def _note_report_errors(self, when: str, errors: Sequence[ErrorRecord]) -> None:
        for record in errors:
            first_line = record.message.splitlines()[0][:120] if record.message else ""
            self.errors.append(f"{when}: {record.source}: {record.type}: {first_line}")

    def diagnosis(self) -> list[Finding]:
        """The findings the author ends up reading: the final diagnoses when there are any
        (several models: merged, ranked by severity then score), else the preflight's."""
        chosen = self.final_diagnoses or self.preflight_diagnoses
        return merge_findings(chosen)


def merge_findings(diagnoses: Sequence[Diagnosis]) -> list[Finding]:
    """One ranked list from several diagnoses (a GAN's two models), in the order nndx
    ranks within one (roots before the symptoms they explain, then alarms, causes seen
    directly, severity, score); ties keep the order the models were given."""
    tagged = [(i, j, f) for i, d in enumerate(diagnoses) for j, f in enumerate(d.findings)]
    tagged.sort(key=lambda t: precedence(t[2]) + (t[0], t[1]))
    return [f for _, _, f in tagged] if len(diagnoses) > 1 else list(diagnoses[0].findings) if diagnoses else []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else ""


# --------------------------------------------------------------------------- one run, scored


@dataclass
class Outcome:
    """One (program, variant): the diagnosis run's findings and both runs' numbers."""

    program: str
    variant: str
    expected: list[str]
    reported: list[str]
    source: str
    codes: list[str] = field(default_factory=list)
    severities: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # the top 5, with their evidence
    preflight_top: str | None = None
    errors: list[str] = field(default_factory=list)
    crash: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # measure run (no nndx)
    metrics_with_nndx: dict[str, float] = field(default_factory=dict)
    monitor_refused: bool = False
    seconds_plain: float = 0.0  # wall clock
    seconds_nndx: float = 0.0
    seconds_in_nndx: float = 0.0
    cpu_plain: float = 0.0  # process CPU time: steadier than the wall clock on a shared machine
    cpu_nndx: float = 0.0

    @property
    def healthy(self) -> bool:
        return not self.expected

    @property
    def top1(self) -> str | None:
        return self.codes[0] if self.codes else None

    @property
    def hit1(self) -> bool:
        return bool(self.codes) and self.codes[0] in self.expected

    @property
    def hit3(self) -> bool:
        return any(code in self.expected for code in self.codes[:3])

    @property
    def detected(self) -> bool:
        """An expected code among the findings of severity warning or above."""
        return any(c in self.expected and SEVERITY_ORDER[s] >= 1 for c, s in zip(self.codes, self.severities))

    @property
    def alarms(self) -> list[str]:
        """Findings of severity warning or above (on a healthy run: false alarms)."""
        return [f"{c}({s})" for c, s in zip(self.codes, self.severities) if SEVERITY_ORDER[s] >= 1]

    @property
    def healthy_error(self) -> bool:
        return any(s == "error" for s in self.severities)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in vars(self).items()}
        data.update(top1=self.top1, hit1=self.hit1, hit3=self.hit3, detected=self.detected, alarms=self.alarms)
        return data


def run_variant(module: Any, variant: Variant, seed: int = 0, measure: bool = True) -> Outcome:
    """Train ``variant`` of ``module`` without nndx (unless ``measure`` is False), then with
    nndx attached, and score the diagnosis."""
    import torch

    torch.set_num_threads(1)
    outcome = Outcome(
        program=module.NAME, variant=variant.name, expected=[c.value for c in variant.expected],
        reported=list(variant.reported), source=module.SOURCE.cite(),
    )  # fmt: skip
    if measure:
        started, cpu = time.perf_counter(), time.process_time()
        try:
            outcome.metrics = _finite(module.train(variant.name, Nndx(enabled=False), seed=seed))
        except Exception as exc:  # noqa: BLE001 - a bug may crash the program itself
            outcome.crash = f"program crashed without nndx: {type(exc).__name__}: {_first_line(exc)}"
        outcome.seconds_plain, outcome.cpu_plain = time.perf_counter() - started, time.process_time() - cpu
    nx = Nndx(enabled=True, name=f"{module.NAME}/{variant.name}")
    started, cpu = time.perf_counter(), time.process_time()
    try:
        outcome.metrics_with_nndx = _finite(module.train(variant.name, nx, seed=seed))
    except Exception as exc:  # noqa: BLE001
        outcome.crash = f"training crashed with nndx: {type(exc).__name__}: {_first_line(exc)}"
        outcome.errors.append(traceback.format_exc(limit=3).splitlines()[-1])
    outcome.seconds_nndx, outcome.cpu_nndx = time.perf_counter() - started, time.process_time() - cpu
    outcome.seconds_in_nndx = nx.seconds
    findings = nx.diagnosis()
    outcome.codes = [f.code.value for f in findings]
    outcome.severities = [f.severity for f in findings]
    outcome.rules = [f.rule_id for f in findings]
    outcome.findings = [
        f.model_dump(mode="json", include={"rule_id", "code", "severity", "title", "evidence", "explained_by"})
        for f in findings[:5]
    ]
    outcome.preflight_top = (
        nx.preflight_diagnoses[0].findings[0].code.value
        if nx.preflight_diagnoses and nx.preflight_diagnoses[0].findings else None
    )  # fmt: skip
    outcome.errors = list(dict.fromkeys(nx.errors + outcome.errors))
    outcome.monitor_refused = nx.monitors_refused > 0
    return outcome


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics as plain floats (NaN and inf kept: a diverged run is a measurement)."""
    return {k: float(v) for k, v in metrics.items()}


def differs(variant: Variant, healthy: Outcome | None, buggy: Outcome) -> bool | None:
    """Whether the buggy measure run differs from the healthy one as the variant says;
    None when it cannot be judged (a run crashed, the metric is missing)."""
    if variant.measure is None or healthy is None:
        return None
    metric = variant.measure.metric
    if metric not in healthy.metrics or metric not in buggy.metrics:
        return None
    return bool(variant.measure.differs(healthy.metrics[metric], buggy.metrics[metric]))


def same_training(outcome: Outcome, rel: float = 1e-5) -> bool | None:
    """Whether the run with nndx attached produced the same numbers as the run without it
    (nndx promises to leave the training untouched). None when either run is missing."""
    if not outcome.metrics or not outcome.metrics_with_nndx:
        return None
    for key, plain in outcome.metrics.items():
        watched = outcome.metrics_with_nndx.get(key)
        if watched is None:
            return False
        if math.isnan(plain) and math.isnan(watched):
            continue
        if not math.isclose(plain, watched, rel_tol=rel, abs_tol=1e-9):
            return False
    return True
