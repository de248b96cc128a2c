"""Run every ported program x variant through nndx and print the table.

    python -m bench.programs                    # all of them (< 5 minutes on 2 cores with --jobs 2)
    python -m bench.programs -k dcgan --jobs 2  # names containing "dcgan" (program/variant)
    python -m bench.programs --json out.json -v # also write every outcome; print top findings

Each variant is trained twice (without nndx: the numbers that show the bug is real; with
nndx: the diagnosis) — see :mod:`bench.programs.harness`. A held-out evaluation: never
tune rules on it. Not a test: numbers, not assertions (tests/bench/test_programs.py
checks that the harness works).

Columns: ``top-1``/``top-3`` the codes of the highest-ranked findings; ``hit`` 1 when
top-1 is an expected code, 3 when one is in the top 3, ``-`` otherwise; ``alarm`` the
findings of severity warning or above on a healthy run (a false alarm); ``preflight
top-1`` what the probe before training ranked first (the scored diagnosis is the one
after training, which includes the Monitor's report); ``differs``
whether the bug measurably changed the run (the variant's measure, see ``-v``);
``same`` whether training with nndx attached gave the same numbers as without;
``errors`` what nndx recorded or raised (a refused Monitor, a probe that errored).
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench.programs` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.programs import PROGRAMS  # noqa: E402
from bench.programs.harness import Outcome, Variant, differs, run_variant, same_training  # noqa: E402


def load(program: str) -> Any:
    return importlib.import_module(f"bench.programs.{program}")


def cases(selector: str = "") -> list[tuple[str, str]]:
    """(program, variant) pairs that ``selector`` picks, plus the healthy variant of each
    program selected (the buggy runs are measured against it). Without a "/", it picks the
    pairs whose "program/variant" contains it; "program/variant" picks that program (named
    whole: "vae/" is not gumbel_vae) and its variants containing "variant"."""
    chosen: list[tuple[str, str]] = []
    named, slash, variant = selector.partition("/")
    for program in PROGRAMS:
        if slash and named and program != named:
            continue
        names = [v for v in load(program).VARIANTS if (variant in v if slash else selector in f"{program}/{v}")]
        if names and "healthy" not in names:
            names.insert(0, "healthy")
        chosen.extend((program, v) for v in names)
    return chosen


def catalogue() -> list[dict[str, Any]]:
    """Every program: its source and its variants (bug, expected codes, reports, measure)."""
    entries = []
    for program in PROGRAMS:
        module = load(program)
        entries.append({
            "program": program,
            "source": vars(module.SOURCE),
            "docstring_cites_commit": module.SOURCE.commit in (module.__doc__ or ""),
            "variants": [
                {"name": v.name, "bug": v.bug, "expected": [c.value for c in v.expected], "reported": list(v.reported),
                 "measure": v.measure.describe if v.measure else None}
                for v in module.VARIANTS.values()
            ],
        })  # fmt: skip
    return entries


def run_case(program: str, variant: str, seed: int, measure: bool) -> Outcome:
    module = load(program)
    return run_variant(module, module.VARIANTS[variant], seed=seed, measure=measure)


def run_all(selected: list[tuple[str, str]], jobs: int, seed: int, measure: bool, progress: bool = True) -> list[Outcome]:
    """Run the cases, ``jobs`` processes at a time (1: in this process), in table order."""
    def say(i: int, outcome: Outcome) -> None:
        if progress:
            print(f"[{i}/{len(selected)}] {outcome.program}/{outcome.variant} "
                  f"{outcome.seconds_plain + outcome.seconds_nndx:.1f}s", file=sys.stderr, flush=True)  # fmt: skip

    if jobs <= 1:
        outcomes = []
        for i, (program, variant) in enumerate(selected, 1):
            outcomes.append(run_case(program, variant, seed, measure))
            say(i, outcomes[-1])
        return outcomes
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_case, program, variant, seed, measure) for program, variant in selected]
        outcomes = []
        for i, future in enumerate(futures, 1):
            outcomes.append(future.result())
            say(i, outcomes[-1])
        return outcomes


def judge(outcomes: list[Outcome]) -> dict[tuple[str, str], bool | None]:
    """For each buggy outcome: does its measure differ from its program's healthy run?"""
    healthy = {o.program: o for o in outcomes if o.healthy}
    verdicts: dict[tuple[str, str], bool | None] = {}
    for o in outcomes:
        if not o.healthy:
            variant: Variant = load(o.program).VARIANTS[o.variant]
            verdicts[(o.program, o.variant)] = differs(variant, healthy.get(o.program), o)
    return verdicts


def _mark(value: bool | None) -> str:
    return "?" if value is None else "yes" if value else "NO"


def table(outcomes: list[Outcome], verdicts: dict[tuple[str, str], bool | None]) -> str:
    rows = [("program", "variant", "expected", "top-1", "top-3", "hit", "alarm (healthy)", "preflight top-1", "differs",
             "same", "errors")]  # fmt: skip
    for o in outcomes:
        hit = "" if o.healthy else "1" if o.hit1 else "3" if o.hit3 else "-"
        alarm = (", ".join(o.alarms) or "no") if o.healthy else ""
        errors = "; ".join(([o.crash] if o.crash else []) + o.errors)
        rows.append((
            o.program, o.variant, ",".join(o.expected) or "(healthy)", o.top1 or "(none)",
            ",".join(o.codes[1:3]), hit, alarm, o.preflight_top or "(none)",
            "" if o.healthy else _mark(verdicts.get((o.program, o.variant))),
            _mark(same_training(o)), errors[:160],
        ))  # fmt: skip
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)] + [0]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def summary(outcomes: list[Outcome], verdicts: dict[tuple[str, str], bool | None]) -> str:
    broken = [o for o in outcomes if not o.healthy]
    healthy = [o for o in outcomes if o.healthy]

    def share(items: list[Outcome], predicate) -> str:
        n = sum(1 for o in items if predicate(o))
        return f"{n}/{len(items)}"

    lines = [
        f"top-1 (buggy)                      {share(broken, lambda o: o.hit1)}",
        f"top-3 (buggy)                      {share(broken, lambda o: o.hit3)}",
        f"detected, warning or above (buggy) {share(broken, lambda o: o.detected)}",
        f"buggy runs that measurably differ  {share(broken, lambda o: verdicts.get((o.program, o.variant)) is True)}",
        f"healthy runs with a warning/error  {share(healthy, lambda o: bool(o.alarms))}",
        f"healthy runs with an error         {share(healthy, lambda o: o.healthy_error)}",
        f"Monitor refused to attach          {share(outcomes, lambda o: o.monitor_refused)}",
        f"training changed by nndx           {share(outcomes, lambda o: same_training(o) is False)}",
        f"crashed                            {share(outcomes, lambda o: o.crash is not None)}",
    ]
    return "\n".join(lines)


def details(outcomes: list[Outcome], verdicts: dict[tuple[str, str], bool | None]) -> str:
    lines = []
    for o in outcomes:
        variant = load(o.program).VARIANTS[o.variant]
        lines.append(f"{o.program}/{o.variant}: {variant.bug}")
        if variant.measure is not None:
            metric = variant.measure.metric
            lines.append(f"    measure: {variant.measure.describe}: {metric}={o.metrics.get(metric)!r}"
                         f" -> differs={_mark(verdicts.get((o.program, o.variant)))}")  # fmt: skip
        lines.append(f"    preflight top-1: {o.preflight_top}; findings: "
                     + ", ".join(f"{r} {c}({s})" for r, c, s in zip(o.rules[:5], o.codes[:5], o.severities[:5])))  # fmt: skip
        lines.append(f"    seconds: {o.seconds_plain:.1f} without nndx, {o.seconds_nndx:.1f} with "
                     f"({o.seconds_in_nndx:.1f} in nndx calls); CPU {o.cpu_plain:.1f} / {o.cpu_nndx:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help='only "program/variant" names containing this, or "program/variant" for that program '
                        '(named whole) and its variants containing "variant" (plus their healthy runs)')
    parser.add_argument("--jobs", type=int, default=1, help="processes in parallel (default 1)")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    parser.add_argument("--seed", type=int, default=0, help="offset added to each program's own seed (default 0)")
    parser.add_argument("--no-measure", action="store_true", help="skip the runs without nndx (no 'differs'/'same')")
    parser.add_argument("-v", action="store_true", help="print each variant's bug, measure and top findings")
    parser.add_argument("--list", action="store_true", help="print the programs, their sources and variants as JSON; run nothing")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps(catalogue(), indent=1))
        return 0
    selected = cases(args.k)
    if not selected:
        print(f"no program/variant contains {args.k!r}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    outcomes = run_all(selected, args.jobs, args.seed, not args.no_measure)
    verdicts = judge(outcomes)
    print(table(outcomes, verdicts))
    print()
    print(summary(outcomes, verdicts))
    if args.v:
        print()
        print(details(outcomes, verdicts))
    elapsed = time.perf_counter() - started
    print(f"\n{len(outcomes)} runs ({sum(not o.healthy for o in outcomes)} buggy), seed offset {args.seed}, "
          f"{args.jobs} job(s), {elapsed:.0f} s")  # fmt: skip
    if args.json is not None:
        records = []
        for o in outcomes:
            record = o.to_json()
            record["differs"] = verdicts.get((o.program, o.variant))
            record["same_training"] = same_training(o)
            records.append(record)
        args.json.write_text(json.dumps({"seed": args.seed, "seconds": elapsed, "outcomes": records}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
