"""Bearer-token authentication with roles for the REST API: viewer < quota-admin < admin.

services.api.app applies `require(role)` to the routers; the composition root (koordbus.api, koordbus.up) builds the
TokenStore from the token file (`token role [name]` per line, `#` comments) or from the token `koordbus up`
generates. Only SHA-256 digests of tokens are kept in memory and compared with hmac.compare_digest, so neither
the token nor its timing leaks. Errors use the API's JSON shape `{"error": ...}`: 401 with
`WWW-Authenticate: Bearer` for a missing or unknown token, 403 naming the role needed when the role is too low.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Protocol

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

ROLES: tuple[str, ...] = ("viewer", "quota-admin", "admin")
"""Lowest first: each role implies every role before it."""

VIEWER, QUOTA_ADMIN, ADMIN = ROLES

BEARER = {"WWW-Authenticate": "Bearer"}


class TokenFileError(ValueError):
    """A token file that cannot be used; the message names the file and the line."""


@dataclass(frozen=True, kw_only=True)
class Identity:
    """Who called: the name from the token file (or the token's line) and the role."""

    name: str
    role: str

    def has(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenStore:
    """SHA-256 digests of the accepted tokens with their identity; `disabled()` accepts every caller as admin."""

    def __init__(self, entries: Iterable[tuple[bytes, Identity]] = (), *, enabled: bool = True) -> None:
        self._entries = list(entries)
        self.enabled = enabled

    @classmethod
    def disabled(cls) -> TokenStore:
        return cls(enabled=False)

    @classmethod
    def single(cls, token: str, *, role: str = ADMIN, name: str = "admin") -> TokenStore:
        return cls([(digest(token), Identity(name=name, role=role))])

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> Identity | None:
        """The identity of `token`; every entry is compared (constant time in the token and its position)."""
        wanted = digest(token)
        found: Identity | None = None
        for entry_digest, identity in self._entries:
            if hmac.compare_digest(entry_digest, wanted) and found is None:
                found = identity
        return found


class TokenReviewer(Protocol):
    """Asks Kubernetes who a bearer token belongs to (a TokenReview): (username, groups), or None when it is not
    a valid token there. services.k8s.token_review.KubeTokenReviewer is the real one."""

    async def review(self, token: str) -> tuple[str, list[str]] | None: ...


def parse_role_mapping(text: str) -> dict[str, str]:
    """`user:alice=admin,group:koordbus-viewers=viewer` → {"user:alice": "admin", …}; ValueError naming the entry."""
    mapping: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        subject, sep, role = entry.rpartition("=")
        if not sep or not subject.startswith(("user:", "group:")) or role not in ROLES:
            raise ValueError(
                f"role mapping entry {entry!r}: expected user:<name>=<role> or group:<name>=<role>, role one of "
                f"{', '.join(ROLES)}"
            )
        mapping[subject] = role
    return mapping


def role_for(username: str, groups: Iterable[str], mapping: Mapping[str, str]) -> str | None:
    """The highest role the user or one of its groups is mapped to; None when none is."""
    found = [mapping[k] for k in (f"user:{username}", *(f"group:{g}" for g in groups)) if k in mapping]
    return max(found, key=ROLES.index) if found else None


class ReviewedTokens:
    """Tokens Kubernetes vouches for (TokenReview), given a role by `mapping`; answers are kept for `ttl` seconds
    (by the token's digest), so a busy client costs one review a minute, not one per request."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        mapping: Mapping[str, str],
        *,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer = reviewer
        self._mapping = dict(mapping)
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[bytes, tuple[float, Identity | None]] = {}

    async def lookup(self, token: str) -> Identity | None:
        key = digest(token)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        reviewed = await self._reviewer.review(token)
        identity = None
        if reviewed is not None:
            role = role_for(reviewed[0], reviewed[1], self._mapping)
            identity = Identity(name=reviewed[0], role=role) if role is not None else None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (now, identity)
        return identity


def parse_token_file(text: str, *, source: str = "token file") -> TokenStore:
    """`token role [name]` per line; blank lines and `#` comments are skipped. Errors name source and line."""
    entries: list[tuple[bytes, Identity]] = []
    seen: dict[bytes, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (2, 3):
            raise TokenFileError(f"{source} line {number}: expected 'token role [name]', got {len(parts)} fields")
        token, role = parts[0], parts[1]
        if role not in ROLES:
            raise TokenFileError(f"{source} line {number}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
        key = digest(token)
        if key in seen:
            raise TokenFileError(f"{source} line {number}: duplicate token (first on line {seen[key]})")
        seen[key] = number
        name = parts[2] if len(parts) == 3 else f"line {number}"
        entries.append((key, Identity(name=name, role=role)))
    if not entries:
        raise TokenFileError(f"{source}: no tokens")
    return TokenStore(entries)


def load_token_file(path: str | Path) -> TokenStore:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TokenFileError(f"cannot read token file {path}: {e.strerror or e}") from e
    return parse_token_file(text, source=str(path))


def ensure_admin_token(path: Path) -> tuple[str, bool]:
    """The admin token stored at `path` (mode 0600), generated on first use; (token, created)."""
    if path.exists():
        token = path.read_text().strip()
        if token:
            path.chmod(0o600)
            return token, False
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with open(path, "x", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
        f.write(token + "\n")
    return token, True


bearer_scheme = HTTPBearer(auto_error=False, description="A token from the API token file (role viewer or higher)")


async def identify(connection: HTTPConnection, token: str | None, role: str) -> Identity:
    """Who holds `token` (a request's or a WebSocket's), if its role is `role` or higher; else HTTPException 401/403
    saying why."""
    store: TokenStore = connection.app.state.context.tokens
    if not store.enabled:
        anonymous = Identity(name="anonymous (auth disabled)", role=ADMIN)
        connection.state.identity = anonymous
        return anonymous
    if not token:
        raise HTTPException(
            401, f"missing bearer token: send 'Authorization: Bearer <token>' with role {role} or higher", BEARER
        )
    identity = store.lookup(token)
    reviewed: ReviewedTokens | None = connection.app.state.context.reviewed_tokens
    if identity is None and reviewed is not None:
        identity = await reviewed.lookup(token)
    if identity is None:
        raise HTTPException(401, "unknown bearer token", BEARER)
    connection.state.identity = identity  # who, for the audit log (refused writes too)
    if not identity.has(role):
        raise HTTPException(403, f"role {role} needed; {identity.name} has role {identity.role}")
    return identity


def bearer_token(connection: HTTPConnection) -> str | None:
    """The token of an `Authorization: Bearer <token>` header."""
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def require(role: str) -> Callable[..., Awaitable[Identity]]:
    """A FastAPI dependency: the caller's Identity when its bearer token has `role` or higher; else 401/403."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})")

    async def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
    ) -> Identity:
        return await identify(request, credentials.credentials if credentials else None, role)

    return dependency
