"""LLM settings, read from the environment in this one place.

=====================  ====================================================  =======
variable               meaning                                               default
=====================  ====================================================  =======
NNDX_LLM_BASE_URL      OpenAI-compatible base URL, up to ``/v1``             unset: rule-only
                       (``https://api.openai.com/v1``,
                       ``http://localhost:11434/v1`` for Ollama,
                       ``http://localhost:8000/v1`` for vLLM / llama.cpp)
NNDX_LLM_MODEL         model name sent with every request                    unset: rule-only
NNDX_LLM_API_KEY       bearer token; never logged or shown                   none
NNDX_LLM_TIMEOUT       total deadline in seconds, retries included           60
NNDX_LLM_STREAM        ``1``/``true``: ask for a streamed (SSE) answer       false
NNDX_LLM_MAX_ATTEMPTS  first try plus retries on 429/5xx                     4
=====================  ====================================================  =======

:func:`settings_from_env` is the one reader of the environment that both this and
the service's settings (``nndx.api.settings``) go through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from nndx.errors import SettingsError

ENV_BASE_URL = "NNDX_LLM_BASE_URL"
ENV_MODEL = "NNDX_LLM_MODEL"
ENV_API_KEY = "NNDX_LLM_API_KEY"
ENV_TIMEOUT = "NNDX_LLM_TIMEOUT"
ENV_STREAM = "NNDX_LLM_STREAM"

AnySettings = TypeVar("AnySettings", bound=BaseSettings)


def settings_from_env(
    cls: type[AnySettings], environ: Mapping[str, str] | None, *, secret_fields: set[str] = frozenset()
) -> AnySettings:
    """``cls`` from ``environ`` (``os.environ`` when None, through pydantic-settings).
    An invalid value raises ``SettingsError`` naming its variable; the value itself is
    shown only for fields that cannot hold a secret."""
    prefix = cls.model_config.get("env_prefix", "")
    try:
        if environ is None:
            return cls()
        values = {
            name: environ[prefix + name.upper()]
            for name in cls.model_fields
            if environ.get(prefix + name.upper(), "").strip()
        }
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            message = str(error["msg"]).removeprefix("Value error, ")
            message = message[:1].lower() + message[1:]
            if field and field not in secret_fields and "input" in error:
                message += f", got {str(error['input'])[:100]!r}"
            problems.append(f"{prefix}{field.upper()}: {message}" if field else message)
        raise SettingsError("; ".join(problems)) from None


class LLMSettings(BaseSettings):
    """Where and how to reach the LLM. ``api_key`` is a ``SecretStr``: its repr, str and
    JSON are masked, and only the HTTP client reads the value."""

    model_config = SettingsConfigDict(env_prefix="NNDX_LLM_", env_ignore_empty=True, frozen=True, extra="forbid")

    base_url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = None
    timeout: float = Field(
        60.0, gt=0, le=86400, allow_inf_nan=False, description="total deadline in seconds, retries included"
    )
    stream: bool = False
    max_attempts: int = Field(4, ge=1, description="first try plus retries on 429/5xx")
    backoff_base: float = Field(0.5, ge=0, description="first retry delay; doubles each retry")
    backoff_max: float = Field(8.0, ge=0)
    max_retry_after: float = Field(10.0, ge=0, description="a longer Retry-After ends the attempts")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        value = value.strip() if value else None
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value or None

    @field_validator("model")
    @classmethod
    def _stripped(cls, value: str | None) -> str | None:
        return value.strip() or None if value else None

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LLMSettings:
        """Settings from ``environ`` (default ``os.environ``); raises ``SettingsError``."""
        return settings_from_env(cls, environ, secret_fields={"api_key"})
