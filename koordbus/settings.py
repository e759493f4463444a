"""Settings shared by every `koordbus` subcommand (where the bus and the database are, where data lives), and the
caps `koordbus up` puts on its streams."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bus import streams


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


MIB = 2**20


@dataclass(frozen=True, kw_only=True)
class EmbeddedStreamSettings:
    """The byte caps `koordbus up` puts on the streams that grow with the number of nodes: its nats-server stores in
    the data dir, on a machine nobody sized for it. Sized for `--simulate-nodes 1000` (bench/soak.py, the most `up`
    is run with here); a single real node stays far below them. `up --nats-url` puts them on that server too; the
    other subcommands, which join a cluster's NATS, set none (its operator sizes that server). Each stream keeps its
    max age either way. -1: no cap."""

    node_stream_max_bytes: int = 1536 * MIB
    """KOORD_NODE (KOORDBUS_NODE_STREAM_MAX_BYTES): at least the longest NodeMetric window (30 min) plus the
    replay slack, which the nodemetric service replays at start-up to rebuild its windows."""
    nodemetric_stream_max_bytes: int = 512 * MIB
    """KOORD_NODEMETRIC (KOORDBUS_NODEMETRIC_STREAM_MAX_BYTES): the history behind the dashboard's node charts and
    nodemetric.computed events."""
    noderesource_stream_max_bytes: int = 256 * MIB
    """KOORD_NODERESOURCE (KOORDBUS_NODERESOURCE_STREAM_MAX_BYTES): batch/mid decisions (the database keeps each
    node's last ones for /resources/history) and noderesource.computed events."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if (value := getattr(self, field.name)) != -1 and value < 1:
                raise ValueError(
                    f"KOORDBUS_{field.name.upper()}: expected a positive number of bytes or -1 (no cap), got {value}"
                )

    def caps(self) -> streams.SizeCaps:
        return streams.SizeCaps(
            node=self.node_stream_max_bytes,
            nodemetric=self.nodemetric_stream_max_bytes,
            noderesource=self.noderesource_stream_max_bytes,
        )
