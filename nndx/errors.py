"""Every exception nndx raises on purpose derives from :class:`NndxError`.

Catch ``nndx.NndxError`` to handle any of them; each also derives from the built-in
exception it has always been (``ValueError``, ``ImportError``...), so existing
``except ValueError`` code keeps working. Errors that belong to one part (the store's
``StorageError``, the LLM client's ``LLMUnavailable``) live beside that part and derive
from a class here.

Torch-free, like :mod:`nndx.report`: the service and the rules import it.
"""

from __future__ import annotations


class NndxError(Exception):
    """Base of every error nndx raises deliberately."""


class UsageError(NndxError, ValueError):
    """Bad input from a user (a command-line argument, a factory, an option): the message
    says what is wrong and how to fix it; the CLI prints it as one line and exits 2."""


class SettingsError(UsageError):
    """A setting (environment variable or argument) holds a value nndx cannot use; the
    message names it."""


class ReportError(UsageError):
    """A report file could not be read or is not a valid DiagnosticReport."""


class MissingExtraError(NndxError, ImportError):
    """An optional library is not installed; the message names the nndx extra to install."""


class ServiceError(NndxError, RuntimeError):
    """The nndx service (or its store, or the LLM it calls) could not do what was asked."""
