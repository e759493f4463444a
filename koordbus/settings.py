"""Settings shared by every `koordbus` subcommand: where the bus and the database are, where data lives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class CommonSettings:
    nats_url: str = ""
    """NATS server URL (KOORDBUS_NATS_URL). Empty under `koordbus up` means: start an embedded nats-server."""
    database_url: str = ""
    """Projection database (KOORDBUS_DATABASE_URL): sqlite:///path or postgresql://… Empty under `koordbus up`
    means SQLite in the data directory."""
    data_dir: str = ".koordbus"
    """Where `koordbus up` keeps the embedded nats-server store, its log and the SQLite database."""
    log_level: str = "INFO"
    """Python logging level name."""
    log_format: str = "text"
    """KOORDBUS_LOG_FORMAT: "text" (human lines) or "json" (one JSON object per line with time, level, logger,
    message and, while an event is handled, its event_id, subject, stream_seq, consumer and node)."""
    nats_creds: str = ""
    """A NATS credentials file (KOORDBUS_NATS_CREDS, from `koordbus creds`): connect as that user. Empty: anonymous,
    which no koordbus-configured server allows (`koordbus up`'s embedded one takes the credential it generates)."""
    nats_token_file: str = ""
    """A file holding the token to connect to NATS with (KOORDBUS_NATS_TOKEN_FILE), read again at every reconnect:
    an agent's projected ServiceAccount token, which the NATS auth callout (`koordbus natsauth`) exchanges for its
    node's user. Exclusive with nats_creds."""
    stream_replicas: int = 1
    """JetStream replicas of koordbus's streams (KOORDBUS_STREAM_REPLICAS): 3 on a 3-server NATS cluster."""
