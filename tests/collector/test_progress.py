"""One progress helper: shown when someone watches (a terminal or a notebook), quiet in
files, pipes and CI logs, forced either way by ``progress=``."""

from __future__ import annotations

import io
import sys
import types

from nndx.collector import progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_shown_on_a_terminal_quiet_on_a_pipe(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.wanted(None)
    assert progress.wanted(True) and not progress.wanted(False)
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    assert progress.wanted(None) and not progress.wanted(False)


def test_shown_in_a_jupyter_kernel(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())

    class ZMQInteractiveShell:  # what get_ipython() returns inside a Jupyter kernel
        pass

    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=ZMQInteractiveShell))
    assert progress.in_notebook() and progress.wanted(None)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert not progress.wanted(None)


def test_a_quiet_bar_writes_nothing_and_a_shown_one_writes_to_stderr(monkeypatch):
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    assert list(progress.progress_bar(range(3), desc="nndx test")) == [0, 1, 2]
    assert pipe.getvalue() == ""
    bar = progress.progress_bar(total=3, desc="nndx test", progress=True)
    bar.update(3)
    bar.close()
    assert "nndx test" in pipe.getvalue() and "3/3" in pipe.getvalue()
