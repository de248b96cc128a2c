"""Enumerate the cases, run them (in worker processes), and score each diagnosis.

A *task* is one (operator or healthy variant, family, seed) with the integration
styles selected for it; it runs the harness's own plain runs first (the buggy run and
its fixed twin, per kind of loop — torch, hand-written, Lightning), and only the styles
whose twin check passed go on to nndx. One record per (task, style) comes back: the
case id ``item/family/style/sSEED``, what was expected, the twin measurements, the
ranked findings, and the scoring.

Determinism: every run re-seeds torch, numpy and ``random`` from the case seed and runs
on one thread, so a case gives the same record in any worker and any order.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import logging
import os
import random
import signal
import sys
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from . import lit, styles
from .families import FAMILIES, HELD_OUT, TUNED, base_spec
from .healthy import BY_NAME as VARIANTS_BY_NAME
from .healthy import VARIANTS
from .operators import BY_NAME as OPERATORS_BY_NAME
from .operators import OPERATORS
from .spec import Spec
from .training import Outcome, build, manual_loop, torch_loop
from .twins import differs, learned

SEEDS = (0, 1, 2)
CASE_TIMEOUT_S = 300  # one style run of one tiny case; past it nndx (or the harness) is stuck
WARNING, ERROR = 1, 2
SEVERITY = {"info": 0, "warning": WARNING, "error": ERROR}
QUICK_FAMILIES = ("mlp", "lstm", "rescnn", "binary")


@dataclass(frozen=True)
class Task:
    kind: str  # "broken", "healthy", "handwritten"
    item: str
    family: str
    seed: int
    styles: tuple[str, ...]


def case_id(item: str, family: str, style: str, seed: int) -> str:
    return f"{item}/{family}/{style}/s{seed}"


def _matches(cid: str, pattern: str | None) -> bool:
    if not pattern:
        return True
    return any(fnmatch.fnmatch(cid, p) if any(c in p for c in "*?[") else p in cid for p in pattern.split(","))


def quick_style(item: str, family: str, allowed: list[str]) -> str:
    """The one style a --quick case runs in: rotated over the (item, family) pairs."""
    return allowed[zlib.crc32(f"{family}/{item}".encode()) % len(allowed)]


def rotated_seed(item: str, family: str, style: str, seeds: tuple[int, ...]) -> int:
    """The one seed a case runs with unless every seed is asked for: the styles of one
    (item, family) take successive seeds from a per-pair offset, so every seed appears
    for every item, family and style across the suite."""
    offset = zlib.crc32(f"{item}/{family}".encode())
    return seeds[(offset + styles.STYLES.index(style)) % len(seeds)]


def tasks(pattern: str | None = None, quick: bool = False, seeds: tuple[int, ...] = SEEDS,
          every_seed: bool = False, handwritten: bool = True) -> list[Task]:  # fmt: skip
    """Every applicable case, grouped in tasks of one (item, family, seed); ``pattern``
    selects case ids. Each case runs with one rotated seed, or with each of ``seeds``
    when ``every_seed``. ``quick``: four families (two per half), one rotated style per
    (item, family)."""
    out: list[Task] = []
    items = [("broken", op.name, op.families, op.styles) for op in OPERATORS]
    items += [("healthy", v.name, v.families, v.styles) for v in VARIANTS]
    for family in (*TUNED, *HELD_OUT):
        for kind, name, applies, allowed in items:
            if not applies(FAMILIES[family]) or (quick and family not in QUICK_FAMILIES):
                continue
            chosen_styles = [s for s in styles.STYLES if s in allowed]
            if quick:
                chosen_styles = [quick_style(name, family, chosen_styles)]
            by_seed: dict[int, list[str]] = {}
            for style in chosen_styles:
                for seed in (seeds if every_seed else (rotated_seed(name, family, style, seeds),)):
                    if _matches(case_id(name, family, style, seed), pattern):
                        by_seed.setdefault(seed, []).append(style)
            out += [Task(kind, name, family, seed, tuple(chosen)) for seed, chosen in sorted(by_seed.items())]
    if handwritten and not quick:
        from .handwritten import CASES

        for name in CASES:
            if _matches(case_id(name, "handwritten", "wrapped", 0), pattern):
                out.append(Task("handwritten", name, "handwritten", 0, ("wrapped",)))
    return out


# --------------------------------------------------------------------------- running


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def worker_init() -> None:
    """One thread per worker (the cases are tiny; threads only add noise), quiet logs."""
    torch.set_num_threads(1)
    logging.getLogger("nndx").setLevel(logging.CRITICAL)
    # warnings the bugs trigger (a broadcast in a loss) would fill the terminal; nndx.probe
    # records them with its own catch_warnings, which this filter does not reach
    warnings.simplefilter("ignore")
    lit.quiet()


class CaseTimeout(Exception):
    """A case ran past CASE_TIMEOUT_S; raised inside whatever was running (recorded like its error)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"the case ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def plain_run(spec: Spec, loop: str, measure_start: bool = False) -> Outcome:
    """The user's training without nndx: the harness's measurement of the bug."""
    seed_everything(spec.seed)
    try:
        b = build(spec, optimizer=loop == "torch")
        if loop == "lightning":
            return lit.fit(b, [], measure_start=measure_start)
        train = torch_loop if loop == "torch" else manual_loop
        return train(b, b.loss_fn, measure_start=measure_start)
    except Exception as exc:  # noqa: BLE001 - the bug making the user's loop raise is a measurable difference
        return Outcome(crashed=_describe(exc))


@functools.lru_cache(maxsize=256)
def fixed_run(spec: Spec, loop: str) -> Outcome:
    """Fixed twins are shared by every operator whose fix is the family's script."""
    return plain_run(spec, loop, measure_start=True)


def run_task(task: Task) -> list[dict[str, Any]]:
    """All records of one task; a harness failure becomes one record with status 'harness_error'."""
    started = time.perf_counter()
    try:
        if task.kind == "handwritten":
            from .handwritten import run_case

            return [run_case(task.item)]
        return _run_generated(task)
    except Exception:  # noqa: BLE001 - reported loudly by the caller: a harness bug to fix
        return [{"id": case_id(task.item, task.family, s, task.seed), "kind": task.kind, "item": task.item,
                 "family": task.family, "style": s, "seed": task.seed, "status": "harness_error",
                 "error": traceback.format_exc()[-3000:], "seconds": round(time.perf_counter() - started, 2)}
                for s in task.styles]  # fmt: skip


def _run_generated(task: Task) -> list[dict[str, Any]]:
    base = base_spec(task.family, task.seed)
    family = FAMILIES[task.family]
    loops = sorted({styles.LOOP_KIND[s] for s in task.styles})
    cpu = time.process_time()
    if task.kind == "broken":
        op = OPERATORS_BY_NAME[task.item]
        spec, accepted = op.mutate(base), op.accepted
        fixed_spec = op.fix(base) if op.fix else base
        plain = {loop: plain_run(spec, loop) for loop in loops}
        twin = {loop: fixed_run(fixed_spec, loop) for loop in loops}
        verdict = {loop: differs(op.measure, plain[loop], twin[loop]) for loop in loops}
    else:
        variant = VARIANTS_BY_NAME[task.item]
        spec, accepted = variant.mutate(base), ()
        plain = {loop: plain_run(spec, loop, measure_start=True) for loop in loops}
        twin = {}
        verdict = {loop: learned(plain[loop]) for loop in loops}
    plain_cpu = round(time.process_time() - cpu, 2)
    records = []
    for style in task.styles:
        loop = styles.LOOP_KIND[style]
        counts, why = verdict[loop]
        record: dict[str, Any] = {
            "id": case_id(task.item, task.family, style, task.seed), "kind": task.kind, "item": task.item,
            "family": task.family, "half": family.half, "style": style, "seed": task.seed,
            "expected": accepted[0] if accepted else None, "accepted": list(accepted),
            "twin": {"counts": counts, "why": why, "buggy": plain[loop].summary(),
                     "fixed": twin[loop].summary() if loop in twin else None, "task_cpu_seconds": plain_cpu},
        }  # fmt: skip
        if not counts:
            record["status"] = "dropped" if task.kind == "broken" else "not_learning"
            records.append(record)
            continue
        started, cpu = time.perf_counter(), time.process_time()
        seed_everything(task.seed)
        with time_limit(CASE_TIMEOUT_S):
            result = styles.run(style, spec)
        record["seconds"] = round(time.perf_counter() - started, 2)
        record["cpu_seconds"] = round(time.process_time() - cpu, 2)
        score(record, result, accepted, plain[loop].crashed)
        records.append(record)
    return records


def score(record: dict[str, Any], result: styles.StyleResult, accepted: tuple[str, ...], plain_crash: str | None) -> None:
    """Fill ``record`` with the diagnosis and how it scores."""
    record["training_error"] = result.training_error
    if result.training_error and not plain_crash:
        result.nndx_error = result.nndx_error or f"the user's loop raised only under nndx: {result.training_error}"
    record["nndx_error"] = result.nndx_error
    findings = result.diagnosis.findings if result.diagnosis is not None else []
    record["findings"] = [{"rule_id": f.rule_id, "code": f.code.value, "severity": f.severity, "title": f.title,
                           "explained_by": f.explained_by, "score": round(float(f.score), 4)} for f in findings]  # fmt: skip
    roots = [f for f in findings if f.explained_by is None]
    record["top3"] = [f.code.value for f in roots[:3]]
    record["top1_ok"] = bool(roots) and roots[0].code.value in accepted
    record["top3_ok"] = any(code in accepted for code in record["top3"])
    record["recall_ok"] = any(f.code.value in accepted and SEVERITY[f.severity] >= WARNING for f in findings)
    record["alarm"] = any(SEVERITY[f.severity] >= WARNING for f in findings)
    record["error_finding"] = any(SEVERITY[f.severity] >= ERROR for f in findings)
    loop = getattr(result.report, "loop", None) if result.report is not None else None
    live = list(loop.live_findings) if loop is not None else []
    record["live"] = [{"code": lf.code, "severity": lf.severity, "step": lf.step} for lf in live]
    hits = [lf.step for lf in live if lf.code in accepted]
    record["ttd"] = min(hits) if hits else None
    errors = getattr(result.report, "errors", None) or []
    record["report_errors"] = [f"{e.source}: {e.type}: {e.message[:160]}" for e in errors[:10]]
    record["status"] = "nndx_error" if result.nndx_error else "scored"


# --------------------------------------------------------------------------- the pool


def run_all(todo: list[Task], jobs: int, progress: bool) -> Iterator[dict[str, Any]]:
    """Records as tasks finish (any order). ``jobs`` worker processes (spawned, so each
    imports torch once and starts clean); 1 runs in this process."""
    bar = _progress(len(todo), progress)
    if jobs <= 1:
        worker_init()
        for task in todo:
            for record in run_task(task):
                yield record
            bar(task)
        return
    import multiprocessing as mp

    # the longest tasks first, so the pool does not end on one slow straggler
    order = sorted(todo, key=lambda t: (-len(t.styles), t.family, t.seed, t.item))
    ctx = mp.get_context("spawn")
    with ctx.Pool(jobs, initializer=worker_init, maxtasksperchild=500) as pool:
        for records in pool.imap_unordered(run_task, order, chunksize=1):
            for record in records:
                yield record
            bar(None)


def _progress(total: int, enabled: bool):
    if enabled and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="task", file=sys.stderr, smoothing=0.05)
            return lambda _task: bar.update(1)
        except ImportError:
            pass
    done = [0]
    started = time.perf_counter()
    step = max(1, total // 20)

    def line(_task: Any) -> None:
        done[0] += 1
        if enabled and (done[0] % step == 0 or done[0] == total):
            print(f"  {done[0]}/{total} tasks, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    return line


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
