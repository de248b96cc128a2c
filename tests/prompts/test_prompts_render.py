"""What the prompt and the checklist say, generic and from a report."""

from __future__ import annotations

import math

import pytest

from nndx.prompts import OUTPUT_FILES, render, render_explanation
from nndx.prompts.checklist import COVERED_CODES, ITEMS, build_checklist
from nndx.report import CauseCode, Diagnosis, DiagnosticReport, Finding, LossPoint, OverfitResult, Probes

PROMPT, CHECKLIST = OUTPUT_FILES


def items_by_key(report, diagnosis):
    return {item.key: item for item in build_checklist(report, diagnosis)}


def test_generic_versions_have_every_section_and_every_item_not_run():
    files = render()
    assert set(files) == {"prompt-nn-debugger.md", "skill-debug-checklist.md"}
    prompt = files[PROMPT]
    for heading in ("## Role", "## Task", "## The run", "## Measured evidence", "## Rule findings",
                    "## Decision tree", "## Answer format", "## What not to claim"):  # fmt: skip
        assert heading in prompt
    assert "generic version" in prompt
    checklist = files[CHECKLIST]
    assert checklist.count(": not run") == len(ITEMS)
    assert "[x]" not in checklist and "FAILED" not in checklist


def test_prompt_carries_the_measured_evidence(broken_report, broken_diagnosis):
    prompt = render(broken_report, broken_diagnosis)[PROMPT]
    # loss curve summary: first, min, last, NaN count with the first bad step
    assert "| train | 8 | 0–140 | 2.3 | 2.3 @ 0 | NaN | 2 (first @ 120) |" in prompt
    # latest layer stats: the dead-unit fraction of act1 at step 140
    assert "| act1 | ReLU | 140 |" in prompt and "| 0.875 |" in prompt
    # probes and the caught error, the message in a fence
    assert "| overfit one batch | failed | loss 2.303 → NaN in 200 steps, lr 1 |" in prompt
    assert "```text\none of the variables needed" in prompt
    # ranked findings, in the diagnosis' order, with evidence
    first, second = prompt.index("LR_TOO_HIGH · Loss diverged"), prompt.index("MISSING_ZERO_GRAD · Gradients")
    assert first < second
    assert "| losses | [2.3, 2.32, inf, NaN] |" in prompt
    assert "a symptom explained by NNDX-E010" in prompt


def test_prompt_names_missing_evidence_as_missing(broken_report, broken_diagnosis):
    prompt = render(broken_report, broken_diagnosis)[PROMPT]
    missing = prompt[prompt.index("### Not measured in this run"):]
    for name in ("validation loss", "data checks", "probe: LR range test", "probe: gradient check (error)"):
        assert f"- {name}" in missing
    assert "_Not recorded: the data was not checked._" in prompt


def test_healthy_prompt_says_the_rules_see_no_problem(healthy_report, healthy_diagnosis):
    prompt = render(healthy_report, healthy_diagnosis)[PROMPT]
    assert "No finding is of severity warning or above" in prompt
    assert "Not measured in this run" in prompt and "- probe: NaN origin" in prompt


def test_healthy_checklist_passes_what_was_measured_and_fails_nothing(healthy_report, healthy_diagnosis):
    items = items_by_key(healthy_report, healthy_diagnosis)
    assert {key for key, item in items.items() if item.status == "failed"} == set()
    assert items["labels"].status == "not run"  # no label-alignment probe in this report
    assert items["overfit"].status == "passed"
    assert items["overfit"].detail.startswith("loss 2.31 → 0.00412 in 200 steps")
    checklist = render(healthy_report, healthy_diagnosis)[CHECKLIST]
    assert "- [x] **Overfit one batch: the loss on a single batch goes to ~0**: passed, loss 2.31 → 0.00412 in 200 steps" in checklist
    # every item is passed but those of the probes this report does not hold (label alignment...)
    from nndx.report import Probes

    not_run = {key for key, item in items.items() if item.status == "not run"}
    absent = {t.checklist.key for name, t in Probes.result_types().items() if getattr(healthy_report.probes, name) is None}
    assert "labels" in not_run and not_run <= absent
    assert items["interventions"].status == "passed"  # the baseline learned: no remedy needed
    assert f"13 passed, 0 failed, {len(not_run)} not run" in checklist


def test_broken_checklist_fails_items_from_findings_probes_and_numbers(broken_report, broken_diagnosis):
    items = items_by_key(broken_report, broken_diagnosis)
    assert items["zero_grad"].status == "failed"  # from the MISSING_ZERO_GRAD finding
    assert items["zero_grad"].findings == ("NNDX-E020 (MISSING_ZERO_GRAD)",)
    assert items["overfit"].status == "failed"  # from the probe itself
    assert items["nonfinite"].status == "failed"  # a NaN loss fails "no NaN/Inf" by definition
    assert items["grad_check"].status == "not run"  # the probe errored: never a pass
    assert "probe error: RuntimeError" in items["grad_check"].detail
    assert items["data"].status == "not run"


def test_info_findings_never_fail_an_item(healthy_report):
    info = Finding(rule_id="X", code=CauseCode.MISSING_ZERO_GRAD, severity="info", title="t", symptom="s", fix="f")
    assert items_by_key(healthy_report, Diagnosis(findings=[info]))["zero_grad"].status == "passed"
    warning = info.model_copy(update={"severity": "warning"})
    assert items_by_key(healthy_report, Diagnosis(findings=[warning]))["zero_grad"].status == "failed"


def test_a_skipped_probe_is_not_run_not_passed():
    report = DiagnosticReport(probes=Probes(overfit_one_batch=OverfitResult(status="skipped", message="no optimizer")))
    item = items_by_key(report, Diagnosis())["overfit"]
    assert item.status == "not run" and item.detail == "probe skipped: no optimizer"


def test_init_uses_the_first_training_loss_and_fails_a_non_finite_one():
    probed = DiagnosticReport(probes=Probes(overfit_one_batch=OverfitResult(status="passed", initial_loss=0.001)))
    assert items_by_key(probed, Diagnosis())["init"].detail == "loss before the overfit probe 0.001"
    trained = probed.model_copy(update={"loss_history": {"train": [LossPoint(step=0, value=math.nan)]}})
    item = items_by_key(trained, Diagnosis())["init"]
    assert item.status == "failed" and item.detail == "first training loss (step 0) NaN"


def test_uncovered_findings_are_listed_in_the_checklist(broken_report, broken_diagnosis):
    checklist = render(broken_report, broken_diagnosis)[CHECKLIST]
    other = checklist[checklist.index("## Other findings"):checklist.index("## Decision tree")]
    assert "DDP_DESYNC" in other and "MISSING_ZERO_GRAD" not in other


def test_each_cause_code_belongs_to_at_most_one_item_and_the_tree_names_every_code():
    seen: list[CauseCode] = [code for spec in ITEMS for code in spec.codes]
    assert len(seen) == len(set(seen)) == len(COVERED_CODES)
    tree = render()[PROMPT]
    tree = tree[tree.index("## Decision tree"):tree.index("## Answer format")]
    assert [code.value for code in CauseCode if f"`{code.value}`" not in tree] == []


def test_non_finite_and_missing_values_are_spelled_out():
    report = DiagnosticReport(loss_history={"train": [LossPoint(step=0, value=math.nan), LossPoint(step=1, value=-math.inf)]})
    prompt = render(report, Diagnosis())[PROMPT]
    assert "| train | 2 | 0–1 | NaN | — | -inf | 2 (first @ 0) | — |" in prompt


def test_same_report_renders_byte_identical_files(broken_report, broken_diagnosis):
    again = DiagnosticReport.model_validate_json(broken_report.model_dump_json())
    assert render(broken_report, broken_diagnosis) == render(again, broken_diagnosis.model_copy(deep=True))


def test_rule_only_explanation_follows_the_answer_format(broken_diagnosis):
    text = render_explanation(broken_diagnosis, "offline mode was requested")
    assert "The LLM was not used: offline mode was requested." in text
    sections = [text.index(h) for h in ("## Root cause", "## Evidence", "## Fix", "## Next experiment")]
    assert sections == sorted(sections)
    assert "LR_TOO_HIGH (error)" in text and "- DEAD_RELU · Dead ReLU units" in text  # explained symptom


def test_rule_only_explanation_of_a_healthy_run_claims_no_cause(healthy_diagnosis):
    text = render_explanation(healthy_diagnosis, "offline")
    assert "None found" in text and "## Fix" not in text


def test_wrong_types_are_clear_errors(broken_report):
    with pytest.raises(TypeError, match="DiagnosticReport"):
        render({"run": None})
    with pytest.raises(TypeError, match="Diagnosis"):
        render(broken_report, {"findings": []})
    with pytest.raises(ValueError, match="without its report"):
        render(None, Diagnosis())


def test_report_without_diagnosis_uses_the_rule_engine(broken_report):
    from nndx.rules import diagnose

    assert render(broken_report) == render(broken_report, diagnose(broken_report))
    assert render(broken_report) != render(broken_report, Diagnosis())


def test_many_long_errors_are_capped():
    from nndx.prompts.evidence import MAX_ERRORS, MAX_MESSAGE_CHARS
    from nndx.report import ErrorRecord

    errors = [ErrorRecord(source=f"probe{i}", type="RuntimeError", message="x" * 5000) for i in range(MAX_ERRORS + 5)]
    prompt = render(DiagnosticReport(errors=errors), Diagnosis())[PROMPT]
    assert "probe19 raised RuntimeError" in prompt and "probe20" not in prompt
    assert "(5 more errors not shown.)" in prompt
    assert "x" * MAX_MESSAGE_CHARS + "\n… (5000 characters in all)" in prompt and "x" * (MAX_MESSAGE_CHARS + 1) not in prompt


def test_checklist_items_have_unique_keys_and_disjoint_valid_codes():
    from nndx.prompts.checklist import ITEMS
    from nndx.report import Probes

    keys = [item.key for item in ITEMS]
    assert len(keys) == len(set(keys))
    assert {item.probe for item in ITEMS if item.probe} == set(Probes.model_fields)  # one item per probe
    seen: set = set()
    for item in ITEMS:
        assert not (item.codes & seen), item.key  # a finding fails one item
        seen |= item.codes
