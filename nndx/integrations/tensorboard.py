"""Export nndx's series to TensorBoard.

How to use::

    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter("runs/exp1")
    sink = TensorBoardSink(writer)            # or TensorBoardSink("runs/exp1")
    sink.log_step(step, {"loss/train": 0.7}, {"weights/fc.weight": fc.weight})
    export_report(sink, report)               # a finished report's whole series
    sink.close()

Tags are ``nndx/<series>`` (names in :mod:`nndx.integrations._common`), so nndx's
charts sit in their own section next to the user's. Importing this module never needs
tensorboard; creating a writer from a log directory does, and says which extra to
install when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from nndx.integrations._common import Histograms, export_report, finite_values, require

__all__ = ["TensorBoardSink", "export_report"]


class TensorBoardSink:
    """Writes scalars and histograms through a ``SummaryWriter`` (torch's, or any object
    with ``add_scalar``/``add_histogram``). Given a log directory instead of a writer,
    it creates the writer and closes it in :meth:`close`; a writer passed in stays the
    caller's to close."""

    def __init__(self, writer: Any, *, prefix: str = "nndx") -> None:
        if isinstance(writer, (str, os.PathLike)):
            require("tensorboard", "tensorboard", "nndx's TensorBoard export")
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=os.fspath(writer))
            self._owns_writer = True
        else:
            if not (hasattr(writer, "add_scalar") and hasattr(writer, "add_histogram")):
                raise TypeError(
                    "TensorBoardSink needs a torch.utils.tensorboard.SummaryWriter (or a log directory); "
                    f"got {type(writer).__name__}"
                )
            self._owns_writer = False
        self.writer = writer
        self.prefix = prefix

    def log_step(self, step: int, scalars: Mapping[str, float], histograms: Histograms | None = None) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(f"{self.prefix}/{name}", float(value), global_step=step)
        for name, values in (histograms or {}).items():
            finite, dropped = finite_values(values)
            # TensorBoard cannot bin NaN/Inf; how many there were is itself a series
            if dropped:
                self.writer.add_scalar(f"{self.prefix}/nonfinite_count/{name}", float(dropped), global_step=step)
            if finite.size:
                self.writer.add_histogram(f"{self.prefix}/{name}", finite, global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if self._owns_writer:
            self.writer.close()
        else:
            self.writer.flush()
