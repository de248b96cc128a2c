"""User-controlled text cannot leave its table cell or its fenced block."""

from __future__ import annotations

import re

import pytest
from markdown_structure import INJECTED, check_structure

from nndx.prompts import render, render_explanation
from nndx.report import (
    ActivationStats,
    CauseCode,
    Diagnosis,
    DiagnosticReport,
    ErrorRecord,
    Finding,
    GradientStats,
    LayerInfo,
    LayerStats,
    LoopStats,
    LossPoint,
    ModelSummary,
    OverfitResult,
    ParameterStats,
    Probes,
    RunInfo,
)

HOSTILE = f"fc`1`` | x |\n{INJECTED}\n```\n| fake | row |\r\n## Fake heading\u2028<!-- hidden"


def hostile_report() -> DiagnosticReport:
    act = ActivationStats(mean=0, std=1, min=0, max=1, zero_fraction=0.5, dead_unit_fraction=0.9)
    grad = GradientStats(abs_mean=1e-3, max=1e-2, norm=1e-1)
    return DiagnosticReport(
        run=RunInfo(name=HOSTILE, project=HOSTILE),
        model=ModelSummary(layers=[LayerInfo(name=HOSTILE, type=HOSTILE)], activations=[HOSTILE], last_layer=HOSTILE),
        loss_history={HOSTILE: [LossPoint(step=0, value=1.0)], "train": [LossPoint(step=0, value=2.0)]},
        layers=[LayerStats(name=HOSTILE, type=HOSTILE, step=3, activation=act, gradient=grad)],
        parameters=[ParameterStats(name=HOSTILE, weight_norm=1.0)],
        probes=Probes(overfit_one_batch=OverfitResult(status="error", message=HOSTILE)),
        loop=LoopStats(steps=3, params_not_in_optimizer=[HOSTILE], params_grad_none=[HOSTILE]),
        errors=[ErrorRecord(source=HOSTILE, type=HOSTILE, message=HOSTILE + "\n`````\n" + INJECTED)],
    )


def hostile_diagnosis() -> Diagnosis:
    return Diagnosis(findings=[Finding(rule_id=HOSTILE, code=CauseCode.DEAD_RELU, severity="error", title=HOSTILE,
                                       symptom=HOSTILE, evidence={HOSTILE: HOSTILE, "layers": [HOSTILE]},
                                       fix=HOSTILE, next_probe=HOSTILE, explained_by=HOSTILE)])  # fmt: skip


@pytest.mark.parametrize("name", ["prompt-nn-debugger.md", "skill-debug-checklist.md"])
def test_hostile_names_keep_the_rendered_structure(name):
    text = render(hostile_report(), hostile_diagnosis())[name]
    assert check_structure(text) > 0  # the text is shown (as data), not dropped
    assert "\u2028" not in text


def test_hostile_error_message_stays_inside_its_fence():
    prompt = render(hostile_report(), hostile_diagnosis())["prompt-nn-debugger.md"]
    block = prompt[prompt.index("### Errors caught"):prompt.index("## Rule findings")]
    opening = re.search(r"^(`{3,})text$", block, re.M)
    assert opening is not None and len(opening.group(1)) == 6  # longer than the 5-backtick run inside
    assert INJECTED in block


def test_hostile_findings_keep_the_explanation_structure():
    text = render_explanation(hostile_diagnosis(), "offline")
    assert check_structure(text) > 0


# ---------------------------------------------------------------- Markdown structure, parsed

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from markdown_it import MarkdownIt  # noqa: E402

#: Pieces of Markdown and Unicode that would become structure or hide text if they got through.
FRAGMENTS = [
    "# ", "## ", "###### ", "\n", "\r\n", "\u2028", "\n# ", "\n- ", "\n1. ", "\n> ", "\n---\n", "\n===\n",
    "![i](http://evil.test/x.png)", "[link](http://evil.test)", "[r]: http://evil.test", "[r]", "[t][r]",
    "<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "<http://evil.test>", "<!-- c -->",
    "- ", "* ", "+ ", "1. ", "2) ", "> ", "---", "***", "===", "```", "~~~", "|", "\\", "&#60;b&#62;",
    "\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\x07", "\x1b[31m", "\x85", "\U000e0041", "    ", "\t",
]
# "z" at the end: an empty name would take other template branches than "benign" does
payloads = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), min_size=1, max_size=8).map(
    lambda parts: "".join(parts) + "z")
BLOCKS = {"heading_open", "bullet_list_open", "ordered_list_open", "list_item_open", "blockquote_open", "hr",
          "html_block", "fence", "code_block", "table_open", "tr_open", "th_open", "td_open"}
INVISIBLE = ["\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\x07", "\x1b", "\x85", "\U000e0041", "\u2028"]
PARSER = MarkdownIt("commonmark").enable("table")


def report_with(text: str, marker: str = "") -> tuple[DiagnosticReport, Diagnosis]:
    """A report and diagnosis with ``text`` in every user-controlled string."""
    act = ActivationStats(mean=0, std=1, min=0, max=1, zero_fraction=0.5, dead_unit_fraction=0.9)
    grad = GradientStats(abs_mean=1e-3, max=1e-2, norm=1e-1)
    report = DiagnosticReport(
        run=RunInfo(name=text, project=text),
        model=ModelSummary(layers=[LayerInfo(name=text, type="Linear")], activations=["ReLU"], last_layer=text),
        loss_history={"train": [LossPoint(step=0, value=2.0)]},
        layers=[LayerStats(name=text, type="Linear", step=3, activation=act, gradient=grad)],
        parameters=[ParameterStats(name=text + ".weight", weight_norm=1.0)],
        probes=Probes(overfit_one_batch=OverfitResult(status="error", message=text)),
        loop=LoopStats(steps=3, params_not_in_optimizer=[text], params_grad_none=[text]),
        errors=[ErrorRecord(source=text, type=text, message=text)],
    )
    findings = [Finding(rule_id="NNDX001", code=code, severity=severity, title=f"probe {text} raised {text}",
                        symptom=text, evidence={"layer": text, "layers": [text, text], "value": 1.0},
                        fix=f"fix {text}", next_probe=text)
                for code, severity in ((CauseCode.DEAD_RELU, "error"), (CauseCode.LR_TOO_HIGH, "warning"))]  # fmt: skip
    return report, Diagnosis(findings=findings, rules_run=2)


def rendered(text: str) -> dict[str, str]:
    report, diagnosis = report_with(text)
    files = dict(render(report, diagnosis))
    files["explanation"] = render_explanation(diagnosis, text, report)
    return files


def structure(markdown: str) -> tuple[list[str], list[str], list[str]]:
    """(block token types in order, heading levels, inline structure: images, links, HTML)."""
    blocks, headings, inline = [], [], []
    tokens = PARSER.parse(markdown)
    for index, token in enumerate(tokens):
        if token.type in BLOCKS:
            blocks.append(token.type)
        if token.type == "heading_open":
            headings.append(token.tag)
        for child in token.children or []:
            if child.type in ("image", "link_open") or (child.type == "html_inline" and child.content != "<br>"):
                inline.append(f"{child.type}: {child.content or child.attrs}")
    return blocks, headings, inline


BASELINE = {name: structure(text) for name, text in rendered("benign").items()}


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(payloads)
def test_no_user_text_becomes_markdown_structure(text):
    """Whatever the run name, layer names, error source/type/message and evidence hold,
    each rendered file parses (markdown-it-py, CommonMark + tables) to the same blocks
    and headings as with harmless text, with no image, link or HTML node, and without
    invisible or reordering characters."""
    for name, markdown in rendered(text).items():
        blocks, headings, inline = structure(markdown)
        assert (blocks, headings) == BASELINE[name][:2], name
        assert inline == [], name
        assert [c for c in INVISIBLE if c in markdown] == [], name


@pytest.mark.parametrize("text", [
    "# Fake heading", "![x](http://evil.test/x.png)", "[click](http://evil.test)", "<img src=x>", "1. step",
    "- item", "> quote", "x\n## heading after a line break", "---", "\u202eevil\u2066", "[r]: http://evil.test",
])
def test_each_known_injection_is_inert(text):
    for name, markdown in rendered(text).items():
        assert structure(markdown)[:2] == BASELINE[name][:2] and structure(markdown)[2] == [], (name, text)
