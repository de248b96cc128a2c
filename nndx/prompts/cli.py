"""Sub-commands of this subpackage; see nndx/cli.py."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this subpackage's commands to the ``nndx`` parser."""
