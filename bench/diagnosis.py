"""How well does nndx name the cause of a silent training failure it was not tuned on?

A generated benchmark: bug operators (one per cause code, written the way people write
the bug) × model families × integration styles × seeds, plus healthy runs that look
suspicious. nndx is used only through its public API, exactly as a user would
(``nndx.Monitor``, ``nndx.probe``, ``nndx.diagnose``, the Lightning callback); the
benchmark knows nothing of the rules. A case counts only when its buggy run measurably
differs from its fixed twin (measured by the harness, not nndx). The rules may be tuned
on the tuned half of the families (mlp, cnn_bn, lstm, regression) only; the held-out
half (rescnn, char_lm, vae, binary) is reported separately. The 46 + 9 hand-written
cases of the previous benchmark are one more family, "handwritten".

    .venv/bin/python bench/diagnosis.py                  # everything (make bench)
    .venv/bin/python bench/diagnosis.py --quick          # a subset: four families, one style per bug
    .venv/bin/python bench/diagnosis.py -k 'relu_on_logits/*' -v   # select case ids (item/family/style/sSEED)
    .venv/bin/python bench/diagnosis.py --list -k lstm   # print the selected case ids

Prints markdown tables; writes every case's record (expected code, twin measurements,
ranked findings, live alerts, scoring) as JSON (``--json``) so two runs can be diffed.
Layout: bench/diagnosis/ — families.py and models.py (the correct scripts), operators.py
(bugs), healthy.py (healthy variants), training.py and lit.py (the user's loops),
styles.py (how nndx is attached), twins.py (the twin check), runner.py, report.py,
handwritten.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from diagnosis import report, runner  # noqa: E402  (the package bench/diagnosis/)

DEFAULT_JSON = BENCH / "diagnosis" / "results" / "latest.json"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default=None, help="case ids containing this (comma-separated; globs allowed)")
    parser.add_argument("--quick", action="store_true", help="a subset: families mlp, lstm, rescnn, binary, one style per bug")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2; 1 = in this process)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--every-seed", action="store_true",
                        help="run each case with every seed (default: one seed per case, rotated over the styles)")
    parser.add_argument("--no-handwritten", action="store_true", help="leave out the hand-written family")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"per-case records (default {DEFAULT_JSON})")
    parser.add_argument("--list", action="store_true", help="print the selected case ids and exit")
    parser.add_argument("-v", action="store_true", help="print each case's verdict as it finishes")
    args = parser.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else runner.SEEDS
    todo = runner.tasks(args.k, quick=args.quick, seeds=seeds, every_seed=args.every_seed,
                        handwritten=not args.no_handwritten)
    if args.list:
        for task in todo:
            for style in task.styles:
                print(runner.case_id(task.item, task.family, style, task.seed))
        return 0
    if not todo:
        print("no case matches", file=sys.stderr)
        return 2
    n_cases = sum(len(t.styles) for t in todo)
    print(f"{len(todo)} tasks, {n_cases} cases, {args.jobs} jobs", file=sys.stderr)
    started = time.perf_counter()
    records = []
    args.json.parent.mkdir(parents=True, exist_ok=True)
    partial = args.json.with_suffix(".partial.jsonl")  # records as they arrive, for a run cut short
    with partial.open("w") as stream:
        for record in runner.run_all(todo, args.jobs, progress=True):
            records.append(record)
            stream.write(json.dumps(record, default=str) + "\n")
            stream.flush()
            if args.v:
                print(_verdict(record), file=sys.stderr)
    seconds = time.perf_counter() - started
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    records.sort(key=lambda r: r["id"])
    meta = {"commit": _commit(), "argv": sys.argv[1:] if argv is None else argv, "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu, 1), "jobs": args.jobs, "seeds": list(seeds), "quick": args.quick}  # fmt: skip
    args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1, default=str))
    partial.unlink()
    print(report.render(records, seconds))
    print(f"\nCPU time {cpu:.0f} s (all processes): {cpu / 120:.1f} min on 2 fully available cores")
    print(f"per-case records: {args.json}")
    return 1 if any(r["status"] == "harness_error" for r in records) else 0


def _verdict(r: dict) -> str:
    if r["status"] != "scored":
        detail = r.get("nndx_error") or r.get("error") or (r.get("twin") or {}).get("why", "")
        return f"  {r['status']:12} {r['id']}: {str(detail)[:200]}"
    mark = "ok " if (r["top1_ok"] if r["kind"] == "broken" else not r["alarm"]) else "BAD"
    return f"  {mark} {r['id']}: expected {r['expected']}, top-3 {r['top3']}"


if __name__ == "__main__":
    sys.exit(main())
