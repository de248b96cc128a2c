"""Service settings, read from the environment in this one place.

=========================  ===========================================================
variable                   meaning
=========================  ===========================================================
``NNDX_DATABASE_URL``      any SQLAlchemy URL; default ``sqlite:///./nndx.sqlite3``.
                           Use PostgreSQL (``postgresql+psycopg://...``) when several
                           API processes on several hosts share one store.
``NNDX_TOKENS``            ``token1:projectA,token2:projectB`` — bearer tokens, each
                           scoped to one project. Unset: no authentication.
``NNDX_TOKENS_FILE``       a file of ``token:project`` lines (``#`` comments allowed),
                           merged with ``NNDX_TOKENS``.
``NNDX_MAX_BODY_BYTES``    request body limit, default 4 MB (4194304); larger → 413.
=========================  ===========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from nndx.errors import SettingsError

DEFAULT_DATABASE_URL = "sqlite:///./nndx.sqlite3"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """Everything the service is configured with. ``tokens`` maps token → project."""

    database_url: str = DEFAULT_DATABASE_URL
    tokens: Mapping[str, str] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise SettingsError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        for token, project in self.tokens.items():
            if not token or not project:
                raise SettingsError("every token needs a non-empty token and project")

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``NNDX_*`` variables (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        tokens: dict[str, str] = {}
        tokens_file = env.get("NNDX_TOKENS_FILE")
        if tokens_file:
            try:
                text = Path(tokens_file).read_text(encoding="utf-8")
            except OSError as exc:
                raise SettingsError(f"NNDX_TOKENS_FILE: cannot read {tokens_file}: {exc}") from exc
            tokens.update(parse_tokens(text.splitlines(), source="NNDX_TOKENS_FILE"))
        tokens.update(parse_tokens(env.get("NNDX_TOKENS", "").split(","), source="NNDX_TOKENS"))
        raw_limit = env.get("NNDX_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES))
        try:
            max_body_bytes = int(raw_limit)
        except ValueError:
            raise SettingsError(f"NNDX_MAX_BODY_BYTES must be an integer, got {raw_limit!r}") from None
        return cls(
            database_url=env.get("NNDX_DATABASE_URL") or DEFAULT_DATABASE_URL,
            tokens=tokens,
            max_body_bytes=max_body_bytes,
        )


def parse_tokens(entries: list[str], *, source: str) -> dict[str, str]:
    """Parse ``token:project`` entries; blank entries and ``#`` comments are ignored."""
    tokens: dict[str, str] = {}
    for entry in entries:
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        token, sep, project = entry.partition(":")
        token, project = token.strip(), project.strip()
        if not sep or not token or not project:
            # never echo the entry: it may hold a secret
            raise SettingsError(f"{source}: every entry must be token:project")
        tokens[token] = project
    return tokens
