"""Documentation that is generated from code must match the code."""

from pathlib import Path

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
