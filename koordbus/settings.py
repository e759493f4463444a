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
    nats_creds: str = ""
    """A NATS credentials file (KOORDBUS_NATS_CREDS, from `koordbus creds`): connect as that user. Empty: anonymous
    (only `koordbus up`'s embedded server on loopback allows that)."""
    stream_replicas: int = 1
    """JetStream replicas of koordbus's streams (KOORDBUS_STREAM_REPLICAS): 3 on a 3-server NATS cluster."""
