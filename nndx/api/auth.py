"""Optional bearer-token authentication, each token scoped to one project.

With no tokens configured the service is open and every report is visible. With tokens
configured every data endpoint needs ``Authorization: Bearer <token>`` (401 without a
valid one), and the token's project is the *scope*: storage queries are filtered by it,
so another project's report answers 404 exactly like a report that does not exist.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from nndx.api.settings import Settings

bearer = HTTPBearer(auto_error=False, description="a token from NNDX_TOKENS, scoped to one project")


def find_project(settings: Settings, token: str) -> str | None:
    """The project of ``token``, or None. Compares every token in constant time."""
    project = None
    for candidate, candidate_project in settings.tokens.items():
        if hmac.compare_digest(candidate.encode(), token.encode()):
            project = candidate_project
    return project


def bearer_project(settings: Settings, authorization: str | None) -> str | None:
    """The project of an ``Authorization: Bearer <token>`` header's token, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return find_project(settings, token.strip())


async def get_scope(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> str | None:
    """The project this request may see, or None for everything (auth disabled).

    ``async`` although it never awaits: FastAPI runs a sync dependency in the threadpool,
    a round trip per request for a dictionary look-up."""
    settings: Settings = request.app.state.settings
    if not settings.auth_enabled:
        return None
    project = find_project(settings, credentials.credentials) if credentials else None
    if project is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="a valid bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return project
