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
=====================  ====================================================  =======
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from nndx.errors import SettingsError

ENV_BASE_URL = "NNDX_LLM_BASE_URL"
ENV_MODEL = "NNDX_LLM_MODEL"
ENV_API_KEY = "NNDX_LLM_API_KEY"
ENV_TIMEOUT = "NNDX_LLM_TIMEOUT"
ENV_STREAM = "NNDX_LLM_STREAM"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class LLMSettings(BaseModel):
    """Where and how to reach the LLM. ``api_key`` is a ``SecretStr``: its repr, str and
    JSON are masked, and only the HTTP client reads the value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LLMSettings:
        """Settings from ``environ`` (default ``os.environ``); raises ``SettingsError``."""
        env = os.environ if environ is None else environ
        base_url = env.get(ENV_BASE_URL, "").strip() or None
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise SettingsError(f"{ENV_BASE_URL} must start with http:// or https://, got {base_url!r}")
        raw_timeout = env.get(ENV_TIMEOUT, "").strip()
        timeout = 60.0
        if raw_timeout:
            try:
                timeout = float(raw_timeout)
            except ValueError:
                raise SettingsError(f"{ENV_TIMEOUT} must be a number of seconds, got {raw_timeout!r}") from None
            if not math.isfinite(timeout) or not 0 < timeout <= 86400:
                raise SettingsError(
                    f"{ENV_TIMEOUT} must be a positive number of seconds (at most a day), got {raw_timeout!r}"
                )
        raw_stream = env.get(ENV_STREAM, "").strip().lower()
        if raw_stream not in _TRUE | _FALSE:
            raise SettingsError(f"{ENV_STREAM} must be 1/true or 0/false, got {raw_stream!r}")
        key = env.get(ENV_API_KEY, "").strip()
        return cls(
            base_url=base_url,
            model=env.get(ENV_MODEL, "").strip() or None,
            api_key=SecretStr(key) if key else None,
            timeout=timeout,
            stream=raw_stream in _TRUE,
        )
