"""Scores and markdown tables from the per-case records.

Definitions (over *counted* broken cases — those whose twin check passed; a case where
nndx raised counts as a miss):

- top-1 / top-3: the expected code (or an accepted alternate) is the code of the first
  / one of the first three *root* findings (``explained_by`` unset), in the ranked order
  of ``diagnosis.findings``;
- recall: the expected code is anywhere among the findings of severity warning or error;
- false alarms: healthy runs (that learned) with any finding of severity warning or
  error; "with error": any of severity error; nndx raising on a healthy run is counted
  apart ("crashed");
- time to detection: the step at which a live alert (``report.loop.live_findings``)
  with the expected code first fired — "live" is the share of counted cases (in the
  styles with a Monitor) where one fired, then the median step.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable

from .families import HELD_OUT, TUNED

HALVES = ("tuned", "held-out", "handwritten")
LIVE_STYLES = ("wrapped", "own_loss", "lightning", "manual")
Record = dict[str, Any]


def broken(records: Iterable[Record]) -> list[Record]:
    """Counted broken cases: scored, or nndx raised."""
    return [r for r in records if r["kind"] == "broken" and r["status"] in ("scored", "nndx_error")]


def healthy(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r["kind"] == "healthy" and r["status"] == "scored"]


def _share(items: list[Record], key: str) -> str:
    if not items:
        return "–"
    hits = sum(1 for r in items if r.get(key))
    return f"{hits / len(items):.2f} ({hits}/{len(items)})"


def _ttd(items: list[Record]) -> str:
    live = [r for r in items if r["style"] in LIVE_STYLES]
    steps = [r["ttd"] for r in live if r.get("ttd") is not None]
    if not live:
        return "–"
    median = f", median step {statistics.median(steps):g}" if steps else ""
    return f"{len(steps)}/{len(live)}{median}"


def row(label: str, records: list[Record]) -> list[str]:
    b, h = broken(records), healthy(records)
    crashed_b = sum(1 for r in b if r["status"] == "nndx_error")
    crashed_h = sum(1 for r in records if r["kind"] == "healthy" and r["status"] == "nndx_error")
    dropped = sum(1 for r in records if r["status"] == "dropped")
    return [label, str(len(b)), _share(b, "top1_ok"), _share(b, "top3_ok"), _share(b, "recall_ok"), str(crashed_b),
            _ttd(b), str(len(h)), _share(h, "alarm"), str(sum(1 for r in h if r.get("error_finding"))), str(crashed_h),
            str(dropped)]  # fmt: skip


HEADER = ["", "broken", "top-1", "top-3", "recall", "nndx raised", "live alert (TTD)", "healthy", "false alarms",
          "healthy w/ error", "healthy nndx raised", "dropped (twin)"]  # fmt: skip


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def grouped(records: list[Record], key: Callable[[Record], str], order: Iterable[str]) -> list[list[str]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)
    return [row(k, groups[k]) for k in order if k in groups]


def render(records: list[Record], seconds: float | None = None) -> str:
    out: list[str] = []
    generated = [r for r in records if r["family"] != "handwritten"]
    out.append("## Diagnosis benchmark\n")
    out.append(table(HEADER, grouped(records, lambda r: r["half"], HALVES)))
    out.append("\n### Per family\n")
    out.append(table(["family", *HEADER[1:]], grouped(generated, lambda r: f"{r['family']} ({r['half']})",
                                                      [f"{f} (tuned)" for f in TUNED] + [f"{f} (held-out)" for f in HELD_OUT])))  # fmt: skip
    for half in ("tuned", "held-out"):
        out.append(f"\n### Per integration style, {half} half\n")
        part = [r for r in generated if r["half"] == half]
        out.append(table(["style", *HEADER[1:]], grouped(part, lambda r: r["style"],
                                                         ("wrapped", "own_loss", "preflight", "lightning", "manual"))))  # fmt: skip
    out.append("\n### Per bug operator (all generated families)\n")
    out.append(operator_table(generated))
    out.append("\n### Healthy variants: false alarms\n")
    out.append(healthy_table(generated))
    hand = [r for r in records if r["family"] == "handwritten"]
    if hand:
        out.append("\n### Hand-written cases: nndx vs the lesson's NetworkDebugger\n")
        out.append(lesson_table(hand))
    out.append("\n### Failures by class\n")
    out.append(failures(records))
    harness = [r for r in records if r["status"] == "harness_error"]
    if harness:
        out.append(f"\n**{len(harness)} harness errors** (bugs in the benchmark, not results): "
                   + ", ".join(r["id"] for r in harness[:20]))  # fmt: skip
    if seconds is not None:
        out.append(f"\n{len(records)} records in {seconds:.0f} s")
    return "\n".join(out)


def operator_table(records: list[Record]) -> str:
    by_op: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r["kind"] == "broken":
            by_op[r["item"]].append(r)
    rows = []
    for op, items in sorted(by_op.items(), key=lambda kv: kv[1][0]["expected"] or ""):
        b = broken(items)
        got = Counter(r["top3"][0] if r.get("top3") else ("(raised)" if r["status"] == "nndx_error" else "(none)") for r in b)
        tuned, held = [r for r in b if r["half"] == "tuned"], [r for r in b if r["half"] == "held-out"]
        dropped = sum(1 for r in items if r["status"] == "dropped")
        rows.append([op, items[0]["expected"] or "", str(len(b)), _share(tuned, "top1_ok"), _share(held, "top1_ok"),
                     _share(b, "top3_ok"), _share(b, "recall_ok"), str(dropped),
                     ", ".join(f"{c} {n}" for c, n in got.most_common(3))])  # fmt: skip
    return table(["operator", "expected", "counted", "top-1 tuned", "top-1 held-out", "top-3", "recall", "dropped",
                  "top-1 given (most common)"], rows)  # fmt: skip


def healthy_table(records: list[Record]) -> str:
    by_variant: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r["kind"] == "healthy":
            by_variant[r["item"]].append(r)
    rows = []
    for name, items in sorted(by_variant.items()):
        h = healthy(items)
        codes = Counter(f["code"] for r in h for f in r.get("findings", []) if f["severity"] != "info")
        raised = sum(1 for r in items if r["status"] == "nndx_error")
        not_learning = sum(1 for r in items if r["status"] == "not_learning")
        rows.append([name, str(len(h)), _share(h, "alarm"), str(sum(1 for r in h if r.get("error_finding"))),
                     str(raised), str(not_learning), ", ".join(f"{c} {n}" for c, n in codes.most_common(4))])  # fmt: skip
    return table(["variant", "runs", "false alarms", "with error", "nndx raised", "did not learn (harness)",
                  "codes raised (warning+)"], rows)  # fmt: skip


def lesson_table(records: list[Record]) -> str:
    b, h = broken(records), healthy(records)
    lesson_top1 = sum(1 for r in b if r.get("lesson_top3")[:1] == [r["expected"]])
    lesson_top3 = sum(1 for r in b if r["expected"] in r.get("lesson_top3", []))
    lesson_alarm = sum(1 for r in h if r.get("lesson_top3"))
    return table(["metric", "nndx", "lesson NetworkDebugger"], [
        ["top-1 (broken)", _share(b, "top1_ok"), f"{lesson_top1}/{len(b)}"],
        ["top-3 (broken)", _share(b, "top3_ok"), f"{lesson_top3}/{len(b)}"],
        ["healthy runs with a warning", _share(h, "alarm"), f"{lesson_alarm}/{len(h)}"],
    ])  # fmt: skip


def failures(records: list[Record]) -> str:
    """Misses grouped by class: wrong top-1 code, no detection, false alarm, nndx raised."""
    lines = []
    b = broken(records)
    wrong = Counter((r["expected"], r["top3"][0]) for r in b if r["status"] == "scored" and r["top3"] and not r["top1_ok"])
    silent = Counter(r["expected"] for r in b if r["status"] == "scored" and not r["top3"])
    raised = Counter(_short(r["nndx_error"]) for r in records if r["status"] == "nndx_error")
    alarms = Counter(f["code"] for r in healthy(records) for f in r.get("findings", []) if f["severity"] != "info")
    lines.append(f"- **wrong top-1 code** ({sum(wrong.values())} cases), expected → given, most common: "
                 + "; ".join(f"{e} → {g} ×{n}" for (e, g), n in wrong.most_common(15)))  # fmt: skip
    lines.append(f"- **no finding at all** ({sum(silent.values())} cases): "
                 + "; ".join(f"{e} ×{n}" for e, n in silent.most_common(15)))  # fmt: skip
    lines.append("- **false alarms** (findings of warning+ on healthy runs, by code): "
                 + "; ".join(f"{c} ×{n}" for c, n in alarms.most_common(15)))  # fmt: skip
    lines.append(f"- **nndx raised** ({sum(raised.values())} runs): "
                 + "; ".join(f"`{m}` ×{n}" for m, n in raised.most_common(8)))  # fmt: skip
    dropped = Counter(r["item"] for r in records if r["status"] == "dropped")
    lines.append(f"- **dropped by the twin check** ({sum(dropped.values())} cases, no measurable difference "
                 "from the fixed twin): " + "; ".join(f"{o} ×{n}" for o, n in dropped.most_common(20)))  # fmt: skip
    not_learning = Counter(f"{r['item']}/{r['family']}/{r['style']}" for r in records if r["status"] == "not_learning")
    if not_learning:
        lines.append(f"- **healthy variants that did not learn** (excluded; a harness problem, {sum(not_learning.values())}): "
                     + "; ".join(f"{k} ×{n}" for k, n in not_learning.most_common(10)))  # fmt: skip
    return "\n".join(lines)


def _short(message: str | None) -> str:
    return (message or "")[:140].replace("|", "/").replace("\n", " ")
