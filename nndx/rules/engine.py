"""The rule registry, ``diagnose`` and the ranking.

A rule is a small pure function over a :class:`~nndx.report.DiagnosticReport`
registered with its metadata (stable id, cause code, severity, title and linter-style
docs). It returns zero or more :class:`Hit` objects — the symptom it saw, the
evidence as numbers from the report, and how strong that evidence is — and the engine
turns each hit into a :class:`~nndx.report.Finding` carrying the rule's metadata.

Ranking — one bug, one root: a *symptom* rule (``symptom=True``: an effect many causes
produce, such as a loss that does not fall, a NaN, a failed overfit probe) names the
cause codes that would explain it (``explained_by``; cause rules may name them too —
dead units are explained by a bad init). When a finding of such a code is present, the
explained finding's ``explained_by`` points at the root finding (following chains to the
root), the root takes the highest severity among the findings it explains and lists
them in ``explains``, and every root ranks before every explained finding. Among the
roots, alarms (warning and error) come first; among alarms, a cause seen directly ranks
before a symptom whose code is only the likeliest guess, so a symptom never outranks a
cause with direct evidence. Then severity, score and rule id, so the order is total and
``diagnose`` is deterministic. A finding whose own evidence refutes its cause (``refuted``:
the LR range test trains well at the loop's LR) is context and explains nothing.

This module imports no torch: a server that only diagnoses POSTed JSON must stay light.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nndx.report import SEVERITY_ORDER, CauseCode, Diagnosis, DiagnosticReport, Finding, Severity
from nndx.rules._series import (
    clips_most_steps,
    gradient_cut_params,
    labels_carry_nothing,
    lr_varies,
    memoized,
    self_targeted,
)

Evidence = dict[str, Any]


@dataclass(frozen=True)
class Hit:
    """What one rule saw: a symptom and the numbers that show it."""

    symptom: str
    evidence: Evidence
    score: float = 1.0
    severity: Severity | None = None  # overrides the rule's default severity
    next_probe: str | None = None
    step: int | None = None
    fix: str | None = None  # overrides the rule's fix when the evidence narrows it
    code: CauseCode | None = None  # overrides the rule's code: only where evidence names the cause
    refuted: bool = False  # the rule's own evidence speaks against its cause: context that explains nothing


RuleFunc = Callable[[DiagnosticReport], "Hit | Iterable[Hit] | None"]


@dataclass(frozen=True)
class Rule:
    """A registered rule: metadata plus the pure function that checks it."""

    id: str
    code: CauseCode
    severity: Severity
    title: str
    detects: str
    why: str
    fix: str
    family: str
    check: RuleFunc
    explained_by: tuple[CauseCode, ...] = field(default_factory=tuple)
    symptom: bool = False

    def run(self, report: DiagnosticReport) -> list[Finding]:
        result = self.check(report)
        if result is None:
            return []
        hits = [result] if isinstance(result, Hit) else list(result)
        return [self._finding(hit) for hit in hits]

    def _finding(self, hit: Hit) -> Finding:
        return Finding(
            rule_id=self.id,
            code=hit.code or self.code,
            severity=hit.severity or self.severity,
            title=self.title,
            symptom=hit.symptom,
            evidence={key: _clean(value) for key, value in hit.evidence.items()},
            fix=hit.fix or self.fix,
            next_probe=hit.next_probe,
            score=_round(hit.score),
            step=hit.step,
            refuted=hit.refuted,
        )

    def docs(self) -> str:
        """The rule's documentation, like a linter rule page."""
        lines = [
            f"{self.id} · {self.code.value} · {self.severity}",
            self.title,
            "",
            "What it detects",
            f"  {self.detects}",
            "",
            "Why it matters",
            f"  {self.why}",
            "",
            "Fix",
            f"  {self.fix}",
        ]
        if self.explained_by:
            kind = "A symptom (its code is the likeliest cause)" if self.symptom else "Itself explained"
            lines += ["", f"{kind}; explained by: " + ", ".join(c.value for c in self.explained_by)]
        return "\n".join(lines)


REGISTRY: dict[str, Rule] = {}


def rule(
    id: str,
    code: CauseCode,
    severity: Severity,
    title: str,
    *,
    detects: str,
    why: str,
    fix: str,
    explained_by: Iterable[CauseCode] = (),
    symptom: bool = False,
) -> Callable[[RuleFunc], RuleFunc]:
    """Register ``func`` as rule ``id``. Ids are stable: never reuse or renumber one.
    ``symptom=True`` marks a rule that sees an effect, not its cause (see the ranking)."""

    def register(func: RuleFunc) -> RuleFunc:
        add_rule(
            Rule(
                id=id,
                code=code,
                severity=severity,
                title=title,
                detects=detects,
                why=why,
                fix=fix,
                family=func.__module__.rsplit(".", 1)[-1],
                check=func,
                explained_by=tuple(explained_by),
                symptom=symptom,
            )
        )
        return func

    return register


def add_rule(new: Rule) -> None:
    if new.id in REGISTRY:
        raise ValueError(f"rule id {new.id} registered twice")
    REGISTRY[new.id] = new


def rules() -> list[Rule]:
    """Every registered rule, by id."""
    return [REGISTRY[key] for key in sorted(REGISTRY)]


def get_rule(rule_id: str) -> Rule:
    try:
        return REGISTRY[rule_id.upper()]
    except KeyError:
        raise KeyError(f"no rule {rule_id!r}; `nndx rules` lists them") from None


def diagnose(report: DiagnosticReport) -> Diagnosis:
    """Run every rule over ``report`` and return the ranked findings.

    Pure and deterministic: the same report always gives a byte-identical diagnosis.
    A rule that raises is a bug in nndx, not in the user's training, so it propagates.
    """
    if not isinstance(report, DiagnosticReport):
        raise TypeError(f"diagnose() takes a DiagnosticReport, not {type(report).__name__}")
    all_rules = rules()
    findings: list[Finding] = []
    with memoized():
        for each in all_rules:
            findings.extend(each.run(report))
    return Diagnosis(findings=rank(confirm(findings, report)), rules_run=len(all_rules))


# the intervention rules (NNDX8xx) name a confirmed cause no other rule named
CONFIRMED_BY_INTERVENTION = "NNDX801"


def _from_intervention(finding: Finding) -> bool:
    return finding.rule_id.startswith("NNDX8")


# bugs of the user's loop that nndx's remedy loop (a copy from the initial state: zero_grad,
# backward and step on the probe's batch, nothing else) does not have: where one is seen, a
# remedy that helped there shows what helps a correct loop, not the user's
LOOP_ONLY = frozenset(c.value for c in (
    CauseCode.MISSING_ZERO_GRAD, CauseCode.GRAD_ACCUM_SCALING, CauseCode.OPTIMIZER_NOT_CONNECTED,
    CauseCode.GRAPH_RETAINED, CauseCode.LR_SCHEDULE_MISUSE,
))  # fmt: skip


def _loop_bug(findings: list[Finding]) -> Finding | None:
    """The first alarm, seen directly (no symptom rule), of a bug that only the user's loop has."""
    return next((f for f in findings if f.code.value in LOOP_ONLY and not _from_intervention(f)
                 and SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]
                 and not (f.rule_id in REGISTRY and REGISTRY[f.rule_id].symptom)), None)  # fmt: skip


def confirm(findings: list[Finding], report: DiagnosticReport) -> list[Finding]:
    """Weigh the findings by what applying their remedies showed (``report.interventions``).

    A finding whose cause a remedy confirmed becomes an error with direct evidence (it
    ranks as a cause even when its rule sees a symptom) — a warning when its rule had
    judged it context (info: the run learned) or when the remedy was tried with nndx's
    own Adam because no optimizer was known (context judged so stays info); one whose
    remedy did not help
    keeps at most a warning and half its score, and is context (info) when its own rule's evidence
    already refuted its cause (``refuted``: two measurements against it). NNDX8xx findings (a confirmed remedy)
    are kept only for causes no other rule named. Where a bug only the user's loop has is
    seen (``LOOP_ONLY``: nndx's remedy loop zeroes gradients, steps its optimizer, neither
    accumulates nor schedules), a confirmation is a lead: at most a warning. With labels that
    carry nothing the inputs predict, no remedy is read: fitting one batch of them is memorising."""
    results = report.interventions.results if report.interventions is not None else []
    if labels_carry_nothing(report):
        # a remedy is judged by whether a copy then fits the probe's batch; with labels the inputs do not
        # predict, fitting it is memorising it (a 1000x LR on 100 shuffled digits), which names no cause
        results = []
    if lr_varies(report) or self_targeted(report):
        # LR remedies were tried at the LR of one moment of a schedule, or on an objective that moves
        # with the model (any larger step lowers a self-training loss, a collapse included): no verdict
        results = [r for r in results if r.cause not in (CauseCode.LR_TOO_LOW.value, CauseCode.LR_TOO_HIGH.value)]
    if clips_most_steps(report):
        # the user's clip bounds every step at LR x max_norm; nndx's remedy loop does not clip, so
        # a lower LR helping there says nothing of the clipped loop's LR
        results = [r for r in results if r.cause != CauseCode.LR_TOO_HIGH.value]
    named = {f.code.value for f in findings if not _from_intervention(f)}
    if gradient_cut_params(report) or CauseCode.GRAD_CLIP_TOO_SMALL.value in named:
        # part of the model gets no gradient, or clipping shrinks every step: a 10x LR speeds
        # up the rest, or undoes the clip, whatever the LR
        results = [r for r in results if r.cause != CauseCode.LR_TOO_LOW.value]
        findings = [f for f in findings if not (_from_intervention(f) and f.code == CauseCode.LR_TOO_LOW)]
    outcome: dict[str, Any] = {}
    for result in results:
        if result.status == "confirmed" or (result.status == "not_confirmed" and result.cause not in outcome):
            outcome[result.cause] = result
    if not outcome:
        return [f for f in findings if not _from_intervention(f)]
    loop_bug = _loop_bug(findings)
    elsewhere = (f"; tried in nndx's loop, which lacks the {loop_bug.code.value} ({loop_bug.rule_id}) seen in yours"
                 if loop_bug else "")  # fmt: skip
    out = []
    for f in findings:
        result = outcome.get(f.code.value)
        if _from_intervention(f):
            if f.code.value not in named:
                demoted = loop_bug is not None and f.severity == "error"
                out.append(f.model_copy(update={"severity": "warning", "symptom": f.symptom + elsewhere})
                           if demoted else f)  # fmt: skip
            continue
        if result is None:
            out.append(f)
            continue
        evidence = dict(f.evidence) | {"intervention": f"{result.remedy}: {result.status.replace('_', ' ')}"}
        if result.status == "confirmed" and loop_bug is not None:
            # what helps nndx's correct loop is a lead for the user's broken one, not proof
            severity = "info" if f.severity == "info" else "warning"
            update = {"confirmation": "confirmed", "severity": severity, "score": _round(f.score + 1.0),
                      "evidence": evidence | {"intervention": evidence["intervention"] + elsewhere}}  # fmt: skip
            out.append(f.model_copy(update=update))
            continue
        if result.status == "confirmed" and f.severity == "info":
            # the rule judged the run healthy (the loss fell) or the harm unlikely: a remedy
            # that helps a probe from the initial state makes it worth a look, not an alarm —
            # and no more than context when the probe trained with nndx's own Adam, whose
            # fixed step any rescaling of the problem helps
            severity = "info" if report.interventions.optimizer == "default" else "warning"
            update = {"confirmation": "confirmed", "severity": severity, "score": _round(f.score + 1.0)}
        elif result.status == "confirmed" and report.interventions.optimizer == "default":
            # confirmed with nndx's own Adam at 1e-3, not the user's optimizer: a lead, not proof
            update = {"confirmation": "confirmed", "severity": "warning", "score": _round(f.score + 2.0)}
        elif result.status == "confirmed":
            update = {"confirmation": "confirmed", "severity": "error", "score": _round(f.score + 5.0)}
        else:
            # the rule's own evidence already spoke against its cause, and the remedy did not help: context
            severity = "info" if f.refuted else "warning" if f.severity == "error" else f.severity
            update = {"confirmation": "not_confirmed", "severity": severity, "score": _round(f.score / 2)}
        out.append(f.model_copy(update=update | {"evidence": evidence}))
    return out


def _standing(finding: Finding) -> tuple:
    """Alarms first; among them a cause seen directly before a symptom whose code is only
    the likeliest guess; then severity and score."""
    alarm = SEVERITY_ORDER[finding.severity] >= SEVERITY_ORDER["warning"]
    symptom = finding.rule_id in REGISTRY and REGISTRY[finding.rule_id].symptom and finding.confirmation != "confirmed"
    score = finding.score if math.isfinite(finding.score) else 0.0
    return (not alarm, alarm and symptom, -SEVERITY_ORDER[finding.severity], -score)


def precedence(finding: Finding) -> tuple:
    """How a linked finding ranks, its names aside: roots before the symptoms they explain,
    then :func:`_standing`. Several diagnoses read together (a GAN's two models) merge on
    this, keeping their own order on a tie."""
    return (finding.explained_by is not None,) + _standing(finding)


def ranking_key(finding: Finding) -> tuple:
    """The order ``diagnose`` lists findings in: :func:`precedence`, then rule id and
    symptom, so the order is total."""
    return precedence(finding) + (finding.rule_id, finding.symptom)


def can_explain(cause_rule: str, symptom_rule: str) -> bool:
    """Whether a finding of ``cause_rule`` explains one of ``symptom_rule``.

    The symptom rule names the cause codes that explain it. Two symptoms that cite each
    other's code (NaN after k steps and oscillation, both pointing at LR_TOO_HIGH)
    explain nothing about each other: only a rule the symptom cannot explain back may
    be its cause, which keeps the links acyclic (tested over the whole registry).
    """
    if cause_rule == symptom_rule or cause_rule not in REGISTRY or symptom_rule not in REGISTRY:
        return False
    cause, symptom = REGISTRY[cause_rule], REGISTRY[symptom_rule]
    return cause.code in symptom.explained_by and symptom.code not in cause.explained_by


def _may_explain(cause: Finding, symptom: Finding) -> bool:
    """Interventions overrule the links: a cause whose remedy did not help explains
    nothing, and a finding a remedy confirmed is explained only by a confirmed one. A cause
    its own rule's evidence refutes (``refuted``) explains nothing unless a remedy confirmed it."""
    if cause.confirmation == "not_confirmed" or (cause.refuted and cause.confirmation != "confirmed"):
        return False
    return symptom.confirmation != "confirmed" or cause.confirmation == "confirmed"


def rank(findings: list[Finding]) -> list[Finding]:
    """Link symptoms to their root causes and order: roots first (see the module docs)."""
    ordered = sorted(findings, key=lambda f: _standing(f) + (f.rule_id, f.symptom))
    direct: dict[int, int] = {}
    for i, symptom in enumerate(ordered):
        for j, candidate in enumerate(ordered):  # best-ranked explainer wins
            if j != i and can_explain(candidate.rule_id, symptom.rule_id) and _may_explain(candidate, symptom):
                direct[i] = j
                break

    def root_of(i: int) -> int:
        seen = {i}
        while i in direct and direct[i] not in seen:
            i = direct[i]
            seen.add(i)
        return i

    roots = {i: root_of(i) for i in direct}
    severity = {i: f.severity for i, f in enumerate(ordered)}
    explains: dict[int, list[str]] = {}
    for i, root in roots.items():
        if root == i:
            continue
        explains.setdefault(root, []).append(ordered[i].rule_id)
        if SEVERITY_ORDER[ordered[i].severity] > SEVERITY_ORDER[severity[root]]:
            severity[root] = ordered[i].severity
    linked = []
    for i, f in enumerate(ordered):
        root = roots.get(i)
        update: dict[str, Any] = {"severity": severity[i], "explains": sorted(set(explains.get(i, [])))}
        if root is not None and root != i:
            update["explained_by"] = ordered[root].rule_id
        linked.append(f.model_copy(update=update))
    return sorted(linked, key=ranking_key)


def _round(value: float) -> float:
    """Round scores and evidence so that tiny float noise never reorders findings."""
    if not math.isfinite(value):
        return value
    return float(f"{value:.6g}")


def _clean(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return _round(value)
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return str(value)
