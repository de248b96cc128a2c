"""Sub-commands of the rule engine; see nndx/cli.py.

    nndx rules                    list every rule (id, cause code, severity, title)
    nndx rules NNDX301            one rule's documentation
    nndx rules --markdown         the rule reference as a Markdown table
    nndx diagnose REPORT.json     ranked findings with their evidence (--json for the Diagnosis)
    nndx check REPORT.json --fail-on warning    exit 1 when a finding at/above that severity exists

Exit status of diagnose/check: 0 fine, 1 findings at/above --fail-on (check only),
2 unreadable or invalid report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nndx.errors import ReportError
from nndx.report import SEVERITY_ORDER, Diagnosis, DiagnosticReport, Finding


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rules``, ``diagnose`` and ``check`` to the ``nndx`` parser."""
    rules = subparsers.add_parser("rules", help="list the diagnosis rules, or show one rule's docs")
    rules.add_argument("rule_id", nargs="?", help="a rule id such as NNDX301")
    rules.add_argument("--markdown", action="store_true", help="print the rule reference as a Markdown table")
    rules.set_defaults(handler=_rules)

    diagnose = subparsers.add_parser("diagnose", help="diagnose a report.json: ranked findings with evidence")
    diagnose.add_argument("report", help="path to a DiagnosticReport JSON file ('-' for stdin)")
    diagnose.add_argument("--json", action="store_true", help="print the Diagnosis as JSON")
    diagnose.set_defaults(handler=_diagnose)

    check = subparsers.add_parser(
        "check", help="exit 1 when a report has a finding at or above a severity (for CI)"
    )
    check.add_argument("report", help="path to a DiagnosticReport JSON file ('-' for stdin)")
    check.add_argument(
        "--fail-on", choices=["warning", "error"], default="warning", help="lowest severity that fails (default: warning)"
    )
    check.set_defaults(handler=_check)


def _rules(args: argparse.Namespace) -> int:
    from nndx.rules import get_rule, rules

    if args.rule_id:
        try:
            print(get_rule(args.rule_id).docs())
        except KeyError as error:
            print(f"nndx rules: {error.args[0]}", file=sys.stderr)
            return 2
        return 0
    if args.markdown:
        print("| id | cause | severity | title | detects |\n|---|---|---|---|---|")
        for each in rules():
            detects = each.detects.replace("|", "\\|")
            print(f"| {each.id} | {each.code.value} | {each.severity} | {each.title} | {detects} |")
        return 0
    for each in rules():
        print(f"{each.id}  {each.code.value:<24} {each.severity:<8} {each.title}")
    return 0


def load_report(path: str) -> DiagnosticReport:
    """Read and validate a report file; raise ReportError with a message naming the problem."""
    from pydantic import ValidationError

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ReportError(f"cannot read {path}: {error}") from None
    try:
        return DiagnosticReport.model_validate_json(text)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()[:10]
        )
        raise ReportError(f"{path} is not a valid DiagnosticReport: {problems}") from None


def format_finding(rank: int, finding: Finding) -> str:
    lines = [f"{rank}. [{finding.severity}] {finding.rule_id} {finding.code.value}: {finding.title}"]
    lines.append(f"   symptom: {finding.symptom}")
    if finding.explained_by:
        lines.append(f"   explained by: {finding.explained_by}")
    for key, value in finding.evidence.items():
        if value is not None:
            lines.append(f"   {key} = {_show(value)}")
    lines.append(f"   fix: {finding.fix}")
    if finding.next_probe:
        lines.append(f"   next probe: {finding.next_probe}")
    return "\n".join(lines)


def format_diagnosis(diagnosis: Diagnosis) -> str:
    if not diagnosis.findings:
        return f"no findings ({diagnosis.rules_run} rules run)"
    body = "\n\n".join(format_finding(i, f) for i, f in enumerate(diagnosis.findings, 1))
    verdict = "healthy (info only)" if diagnosis.healthy else "problems found"
    return f"{body}\n\n{len(diagnosis.findings)} findings, {diagnosis.rules_run} rules run: {verdict}"


def _show(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _load_and_diagnose(path: str) -> Diagnosis | None:
    from nndx.rules import diagnose

    try:
        report = load_report(path)
    except ReportError as error:
        print(f"nndx: {error}", file=sys.stderr)
        return None
    return diagnose(report)


def _diagnose(args: argparse.Namespace) -> int:
    diagnosis = _load_and_diagnose(args.report)
    if diagnosis is None:
        return 2
    if args.json:
        print(json.dumps(json.loads(diagnosis.model_dump_json()), indent=2))
    else:
        print(format_diagnosis(diagnosis))
    return 0


def _check(args: argparse.Namespace) -> int:
    diagnosis = _load_and_diagnose(args.report)
    if diagnosis is None:
        return 2
    threshold = SEVERITY_ORDER[args.fail_on]
    failing = [f for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= threshold]
    for i, finding in enumerate(failing, 1):
        print(format_finding(i, finding))
    if failing:
        print(f"\n{len(failing)} findings at or above {args.fail_on}")
        return 1
    print(f"ok: no finding at or above {args.fail_on} ({len(diagnosis.findings)} below)")
    return 0
