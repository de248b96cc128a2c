"""Settings of the service and of its clients, read from the environment in this one
place (the LLM's are in ``nndx.prompts.settings``).

Service (:class:`Settings`, read by ``nndx serve`` and ``create_app``):

===========================  ========================================================
variable                     meaning
===========================  ========================================================
``NNDX_DATABASE_URL``        any SQLAlchemy URL; default ``sqlite:///./nndx.sqlite3``.
                             PostgreSQL: ``postgresql+psycopg://user:pass@host:5432/db``
                             (``pip install 'nndx[postgres]'``) when service processes
                             on several hosts share one store.
``NNDX_TOKENS``              ``token1:projectA,token2:projectB`` — bearer tokens, each
                             scoped to one project. Unset: no authentication.
``NNDX_TOKENS_FILE``         a file of ``token:project`` lines (``#`` comments allowed),
                             merged with ``NNDX_TOKENS``.
``NNDX_MAX_BODY_BYTES``      request body limit, default 4 MiB (4194304); larger → 413.
``NNDX_BODY_TIMEOUT``        seconds a client has to send a whole request body, default
                             15; slower → 408 and the connection is closed.
``NNDX_LLM_MAX_IN_FLIGHT``   LLM calls one service process makes at once, default 8;
                             an explain waits for a free one within its deadline.
``NNDX_HOST`` / ``_PORT``    where ``nndx serve`` listens (127.0.0.1, 8000) and how
``NNDX_WORKERS``             many worker processes it runs (1).
===========================  ========================================================

Client (:class:`ClientSettings`, read by ``nndx.client`` and ``nndx push``):
``NNDX_URL`` (the service, default ``http://127.0.0.1:8000``), ``NNDX_TOKEN`` (its
bearer token), ``NNDX_SPOOL_DIR`` (where unsent reports wait, default
``~/.cache/nndx/spool``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from nndx.errors import SettingsError
from nndx.prompts.settings import settings_from_env

DEFAULT_DATABASE_URL = "sqlite:///./nndx.sqlite3"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 15.0


class Settings(BaseSettings):
    """Everything the service is configured with. ``tokens`` maps token → project."""

    model_config = SettingsConfigDict(env_prefix="NNDX_", env_ignore_empty=True, frozen=True, extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    tokens: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    tokens_file: Path | None = None
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0)
    body_timeout: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0, le=3600, allow_inf_nan=False)
    llm_max_in_flight: int = Field(8, ge=1, le=10_000)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=1024)

    @model_validator(mode="before")
    @classmethod
    def _merge_tokens(cls, data: Any) -> Any:
        """``NNDX_TOKENS`` as ``token:project`` pairs, plus the lines of the tokens file."""
        if not isinstance(data, dict):
            return data
        tokens: dict[str, str] = {}
        tokens_file = data.get("tokens_file")
        if tokens_file:
            try:
                text = Path(tokens_file).read_text(encoding="utf-8")
            except OSError as exc:
                raise SettingsError(f"cannot read {tokens_file}: {exc.strerror}") from None
            tokens.update(parse_tokens(text.splitlines(), source="NNDX_TOKENS_FILE"))
        given = data.get("tokens")
        if isinstance(given, str):
            tokens.update(parse_tokens(given.split(","), source="NNDX_TOKENS"))
        elif isinstance(given, Mapping):
            tokens.update(given)
        for token, project in tokens.items():
            if not token or not project:
                raise SettingsError("every token needs a non-empty token and project")
        return {**data, "tokens": tokens}

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``NNDX_*`` variables (``os.environ`` by default); raises
        ``SettingsError`` naming the variable, never echoing a token."""
        return settings_from_env(cls, environ, secret_fields={"tokens"})


class ClientSettings(BaseSettings):
    """Where ``nndx.client`` sends reports, with which token, and where it spools them."""

    model_config = SettingsConfigDict(env_prefix="NNDX_", env_ignore_empty=True, frozen=True, extra="ignore")

    url: str = "http://127.0.0.1:8000"
    token: SecretStr | None = None
    spool_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "nndx" / "spool")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        return settings_from_env(cls, environ, secret_fields={"token"})


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
