"""Sub-commands of the rule engine; see nndx/cli.py.

    nndx rules                    list every rule (id, cause code, severity, title)
    nndx rules NNDX301            one rule's documentation
    nndx rules DEAD_RELU          the rules that point to one cause code
    nndx rules --markdown         the rule reference (docs/rules.md is this output)
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

from nndx.errors import ReportError, UsageError
from nndx.report import SEVERITY_ORDER, CauseCode, Diagnosis, DiagnosticReport, Finding

RULE_DOCS = "docs/rules.md"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rules``, ``diagnose`` and ``check`` to the ``nndx`` parser."""
    rules = subparsers.add_parser(
        "rules", help="list the diagnosis rules, or show one rule's docs",
        description="List every rule (id, cause code, severity, title); with a rule id, print that rule's "
        "documentation; with a cause code (DEAD_RELU), list the rules that point to it.",
    )  # fmt: skip
    rules.add_argument("rule_id", nargs="?", metavar="ID_OR_CODE", help="a rule id (NNDX301) or a cause code (DEAD_RELU)")
    rules.add_argument("--markdown", action="store_true", help=f"print the rule reference as Markdown ({RULE_DOCS})")
    rules.set_defaults(handler=_rules)

    diagnose = subparsers.add_parser(
        "diagnose", help="diagnose a report.json: ranked findings with evidence",
        description="Run every rule over a DiagnosticReport and print the findings, ranked: root causes "
        "first, each with its evidence and fix; the symptoms a root explains cite it.",
    )  # fmt: skip
    diagnose.add_argument("report", help="path to a DiagnosticReport JSON file ('-' for stdin)")
    diagnose.add_argument("--json", action="store_true", help="print the Diagnosis as JSON")
    diagnose.set_defaults(handler=_diagnose)

    check = subparsers.add_parser(
        "check", help="exit 1 when a report has a finding at or above a severity (for CI)",
        description="Diagnose a report and exit 1 when a finding at or above --fail-on exists (a CI gate); "
        "print those findings. Exit 0 when none, 2 when the report cannot be read.",
    )  # fmt: skip
    check.add_argument("report", help="path to a DiagnosticReport JSON file ('-' for stdin)")
    check.add_argument("--fail-on", choices=list(SEVERITY_ORDER), default="warning",
                       help="lowest severity that fails (default: warning)")  # fmt: skip
    check.set_defaults(handler=_check)


def _rules(args: argparse.Namespace) -> int:
    from nndx.rules import REGISTRY, rules

    if args.rule_id:
        wanted = args.rule_id.strip().upper()
        if wanted in REGISTRY:
            print(REGISTRY[wanted].docs())
            return 0
        if wanted not in CauseCode.__members__:
            raise UsageError(f"no rule or cause code {args.rule_id!r}; `nndx rules` lists the rules and their codes")
        of_code = [each for each in rules() if each.code.value == wanted]
        if not of_code:
            print(f"no rule points to {wanted} yet")
            return 0
        for each in of_code:
            print(_listing_line(each))
        return 0
    if args.markdown:
        print(reference_markdown(rules()), end="")
        return 0
    for each in rules():
        print(_listing_line(each))
    return 0


def _listing_line(rule: object) -> str:
    return f"{rule.id}  {rule.code.value:<24} {rule.severity:<8} {rule.title}"


def reference_markdown(all_rules: list) -> str:
    """docs/rules.md: an index table, then one section per rule (anchor = the rule id in
    lower case, e.g. ``docs/rules.md#nndx201``), all from the rules' own metadata."""
    lines = [
        "# Rule reference",
        "",
        ("Generated from the rule registry by `nndx rules --markdown > docs/rules.md`; a test keeps it "
         "current. `nndx rules ID` prints one rule in a terminal, `nndx rules CAUSE_CODE` the rules of one cause."),
        "",
        "| id | cause | severity | title |",
        "|---|---|---|---|",
    ]
    lines += [f"| [{r.id}](#{r.id.lower()}) | {r.code.value} | {r.severity} | {_cell(r.title)} |" for r in all_rules]
    for r in all_rules:
        lines += ["", f"## {r.id}", "", f"**{r.title}** · cause `{r.code.value}` · severity `{r.severity}`", "",
                  f"**What it detects.** {r.detects}", "", f"**Why it matters.** {r.why}", "", f"**Fix.** {r.fix}"]  # fmt: skip
        if r.explained_by:
            causes = " or ".join(f"`{c.value}`" for c in r.explained_by)
            lines += ["", f"Often a symptom: a finding of cause {causes}, when present, explains it and ranks first."]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def load_report(path: str) -> DiagnosticReport:
    """Read and validate a report file; raise ReportError with a message naming the problem."""
    from pydantic import ValidationError

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ReportError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ReportError(f"cannot read {path}: not UTF-8 text ({error.reason})") from None
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
    lines.append(f"   docs: nndx rules {finding.rule_id}")
    return "\n".join(lines)


def plural(count: int, noun: str) -> str:
    """``0 findings``, ``1 finding``, ``2 findings`` — the one wording every command uses."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_diagnosis(diagnosis: Diagnosis) -> str:
    if not diagnosis.findings:
        return f"no findings ({plural(diagnosis.rules_run, 'rule')} run)"
    body = "\n\n".join(format_finding(i, f) for i, f in enumerate(diagnosis.findings, 1))
    verdict = "healthy (info only)" if diagnosis.healthy else "problems found"
    return f"{body}\n\n{plural(len(diagnosis.findings), 'finding')}, {plural(diagnosis.rules_run, 'rule')} run: {verdict}"


def _show(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _diagnose_file(path: str) -> Diagnosis:
    from nndx.rules import diagnose

    return diagnose(load_report(path))


def _diagnose(args: argparse.Namespace) -> int:
    diagnosis = _diagnose_file(args.report)
    if args.json:
        print(json.dumps(json.loads(diagnosis.model_dump_json()), indent=2))
    else:
        print(format_diagnosis(diagnosis))
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 1 when any finding reaches ``--fail-on``: the exit status follows the findings
    alone (a report where nothing was measured fails through the rule that says so)."""
    diagnosis = _diagnose_file(args.report)
    threshold = SEVERITY_ORDER[args.fail_on]
    failing = [f for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= threshold]
    for i, finding in enumerate(failing, 1):
        print(format_finding(i, finding))
    if failing:
        print(f"\n{plural(len(failing), 'finding')} at or above {args.fail_on}")
        return 1
    below = len(diagnosis.findings)
    print(f"ok: no findings at or above {args.fail_on}" + (f" ({plural(below, 'finding')} below)" if below else ""))
    return 0
