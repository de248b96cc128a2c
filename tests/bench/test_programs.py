"""The ported-programs harness works: it runs a healthy and a buggy program end to end,
measures the bug, and reports what nndx said — whatever nndx said.

These tests check the harness, never nndx's score: the ports are a held-out evaluation
(bench/programs), so no test may pin which cause nndx names for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_harness(*args: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "bench.programs", *args, "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(out.read_text())


@pytest.mark.slow
def test_a_healthy_and_a_buggy_program_run_end_to_end(tmp_path: Path) -> None:
    # the VAE: the cheapest program, whose bug (a KL term with its sign flipped) is unmistakable
    done, result = _run_harness("-k", "vae/kl_sign_flipped", tmp_path=tmp_path)
    outcomes = {o["variant"]: o for o in result["outcomes"]}
    assert set(outcomes) == {"healthy", "kl_sign_flipped"}  # the healthy twin comes along to measure against
    healthy, buggy = outcomes["healthy"], outcomes["kl_sign_flipped"]

    # both trained, twice each (without and with nndx), and nothing crashed
    for o in (healthy, buggy):
        assert o["crash"] is None
        assert o["metrics"] and o["metrics_with_nndx"]
        assert o["expected"] == ([] if o is healthy else ["WRONG_LOSS"])
        assert o["source"].startswith("github.com/pytorch/examples/blob/")
    # the measure separates them: the flipped KL term drives the loss far below zero
    assert buggy["differs"] is True
    assert healthy["metrics"]["final_train_loss"] > 0 > buggy["metrics"]["final_train_loss"]
    # nndx produced a diagnosis for both runs (what it says is the benchmark's business; a
    # healthy run may rightly get no finding at all)
    assert buggy["codes"], buggy
    for o in (healthy, buggy):
        assert len(o["codes"]) == len(o["severities"]) == len(o["rules"])
        assert o["hit1"] == bool(o["codes"] and o["codes"][0] in o["expected"])
    # the table lists both rows and the summary counts the buggy one
    assert "vae" in done.stdout and "kl_sign_flipped" in done.stdout
    assert "top-1 (buggy)" in done.stdout and "/1" in done.stdout


def test_every_program_cites_its_source_and_declares_reported_bugs() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.programs", "--list"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    programs = json.loads(done.stdout)
    assert len(programs) >= 6
    for program in programs:
        source = program["source"]
        assert len(source["commit"]) == 40 and source["licence"] and source["repo"] and source["path"]
        assert program["docstring_cites_commit"], program["program"]
        variants = {v["name"]: v for v in program["variants"]}
        assert variants["healthy"]["expected"] == []
        buggy = [v for v in variants.values() if v["expected"]]
        assert buggy, program["program"]
        for variant in buggy:
            assert variant["measure"], (program["program"], variant["name"])
            assert variant["reported"] and all(url.startswith("https://") for url in variant["reported"])


def test_selector_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.programs", "-k", "no-such-program"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 2
    assert "no-such-program" in done.stderr


def test_findings_of_several_diagnoses_keep_nndx_ranking_roots_first() -> None:
    """A GAN's or a per-epoch Monitor's diagnoses, read together: a symptom folded under its
    root in one diagnosis never outranks a root of another, whatever its score; an alarm seen
    as a symptom (NNDX104) ranks after a cause seen directly (NNDX301)."""
    from bench.programs.harness import merge_findings
    from nndx.report import CauseCode, Diagnosis, Finding

    def finding(rule, code, severity, score, explained_by=None):
        return Finding(rule_id=rule, code=CauseCode(code), severity=severity, title="t", symptom="s", fix="f",
                       score=score, explained_by=explained_by)  # fmt: skip

    first = Diagnosis(findings=[finding("NNDX201", "DEAD_RELU", "warning", 1.0),
                                finding("NNDX601", "WRONG_LOSS", "warning", 6.0, explained_by="NNDX201")])
    second = Diagnosis(findings=[finding("NNDX104", "LR_TOO_HIGH", "warning", 5.0),
                                 finding("NNDX301", "MISSING_ZERO_GRAD", "warning", 2.0)])
    merged = [f.rule_id for f in merge_findings([first, second])]
    assert merged == ["NNDX301", "NNDX201", "NNDX104", "NNDX601"]
