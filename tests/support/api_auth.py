"""Bearer tokens for tests that call the REST API: a TokenStore with one token per role, the header to send, and
a token file for API processes started as subprocesses (KOORDBUS_API_TOKENS_FILE)."""

from __future__ import annotations

from pathlib import Path

from services.common import auth

TOKENS = {
    auth.VIEWER: "test-viewer-token",
    auth.QUOTA_ADMIN: "test-quota-admin-token",
    auth.ADMIN: "test-admin-token",
}


def headers(role: str = auth.ADMIN) -> dict[str, str]:
    """The Authorization header of the test token with `role`."""
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def token_file_text() -> str:
    return "".join(f"{token} {role} test-{role}\n" for role, token in TOKENS.items())


def token_store() -> auth.TokenStore:
    """What an API built from `token_file_text()` accepts."""
    return auth.parse_token_file(token_file_text(), source="test tokens")


def write_token_file(path: Path) -> Path:
    path.write_text(token_file_text())
    path.chmod(0o600)
    return path
