"""Documentation that is generated from code must match the code."""

import re
from pathlib import Path

import pytest

from nndx.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_rule_reference_is_current(capsys):
    assert main(["rules", "--markdown"]) == 0
    page = capsys.readouterr().out
    doc = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert doc == page, "docs/rules.md is stale: run `nndx rules --markdown > docs/rules.md`"


def test_readme_gives_the_two_setup_commands():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "make demo" in first_screen and "make test" in first_screen
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_every_rule_the_readme_names_exists_and_links_to_its_docs():
    from nndx.rules import REGISTRY

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\bNNDX\d{3}\b", text))
    assert named, "the README shows findings"
    assert named <= set(REGISTRY), f"unknown rules in the README: {sorted(named - set(REGISTRY))}"
    shown = set(re.findall(r"\((NNDX\d{3})\)", readme_section("What `make demo` prints (abridged)")))
    linked = set(re.findall(r"\]\(docs/rules\.md#(nndx\d{3})\)", text))
    assert {rule_id.lower() for rule_id in shown} <= linked, "a finding in the README without a link to its rule"
    doc = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert all(f"\n## {rule_id.upper()}\n" in doc for rule_id in linked), "a link to a missing section"


@pytest.mark.slow
def test_the_quick_start_runs_as_written(monkeypatch):
    """The README's 30-second quick start, its code blocks run in order in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", readme_section("Quick start (30 seconds)"), flags=re.S)
    assert len(blocks) == 3
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace: dict = {}
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        torch.set_num_threads(threads)
    assert namespace["found"].suggestion is not None
    assert namespace["diagnosis"].healthy
