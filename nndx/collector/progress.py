"""Progress bars for nndx's long work (the probes, the LR sweep, data checks, benchmarks),
one way everywhere.

How to use::

    bar = progress_bar(total=len(names), desc="nndx probe", progress=progress, unit="probe")
    for name in names:
        bar.set_postfix_str(name)
        ...
        bar.update()
    bar.close()

    for batch in progress_bar(loader, desc="nndx lr_find", progress=progress):  # or wrap an iterable
        ...

``progress=None`` (every nndx function's default) shows a bar when a person is watching:
stderr is a terminal, or the code runs in a Jupyter kernel. Output to a file, a pipe or
a CI log stays quiet; ``True`` and ``False`` force it. Bars are tqdm's, on stderr (never
stdout, so ``nndx probe ... > out`` stays clean), as a widget in a notebook when
ipywidgets is installed and as text otherwise. A disabled bar is tqdm's own no-op, so
callers never branch on whether it shows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def in_notebook() -> bool:
    """True inside a Jupyter kernel (not a plain IPython terminal)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def wanted(progress: bool | None) -> bool:
    """Whether to show progress: ``progress`` when given, else whether someone watches."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr
    try:
        interactive = stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        interactive = False
    return interactive or in_notebook()


def _bar_class() -> type[tqdm]:
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm's notebook bar needs it; text otherwise)
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
        except ImportError:
            pass
    return tqdm


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: float | None = None,
    desc: str,
    progress: bool | None = None,
    unit: str = "it",
    leave: bool = True,
) -> tqdm:
    """A tqdm bar on stderr, shown only when :func:`wanted` says so."""
    show = wanted(progress)
    cls = _bar_class() if show else tqdm
    return cls(iterable, total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr, disable=not show,
               dynamic_ncols=True)  # fmt: skip
