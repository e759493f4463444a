"""Settings of the API gateway."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_API_"
    """Each field from KOORDBUS_API_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds; the embedded default stays on loopback."""
    port: int = 8080
    """HTTP port."""
    stale_after_seconds: float = 180.0
    """A node whose newest sample is older than this is reported stale (annotation koordbus.io/stale)."""
    page_limit_max: int = 1000
    """Largest page a list route returns."""
    auth_enabled: bool = True
    """Require bearer tokens (services.common.auth); false only with `koordbus api --no-auth` (insecure)."""
    api_tokens_file: str | None = None
    """Token file, one `token role [name]` per line (roles viewer, quota-admin, admin); env
    KOORDBUS_API_TOKENS_FILE. Unset: `koordbus up` generates an admin token in its data dir, `koordbus api`
    refuses to start."""
    events_max_subscriptions: int = 1000
    """Event subscriptions (SSE and WebSocket) served at once; past it a new one gets 503."""
    events_max_per_caller: int = 100
    """Event subscriptions one caller (a token's name) may hold at once; past it 503."""
    events_queue_size: int = 10_000
    """Events queued for one subscriber before it counts as too slow and is dropped (with the reason)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not a TCP port")
        if self.stale_after_seconds <= 0:
            raise ValueError("stale_after_seconds must be positive")
        if min(self.events_max_subscriptions, self.events_max_per_caller, self.events_queue_size) < 1:
            raise ValueError("events_max_subscriptions, events_max_per_caller and events_queue_size must be >= 1")
