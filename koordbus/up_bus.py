"""`koordbus up`'s NATS side: its embedded nats-server (or `--nats-cluster N` of them, or the server of --nats-url),
its own connection, which sets up the streams, and one connection per in-process service as that service's own NATS
user, the agent as its node's, as the Helm chart has them.

Called by koordbus.up.run_up; the users and their credentials files are koordbus.natsauth's (`up_identities`), the
servers and connections koordbus.runtime's, so what is opened here closes with `up`'s AsyncExitStack.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus import streams
from bus.cluster import LocalNatsCluster
from bus.jetstream import JetStreamBus
from koordbus import natsauth, runtime
from koordbus.settings import CommonSettings

NATS_CREDS_FILE = "nats-creds.json"
"""`koordbus up` with its embedded nats-server: the credentials of its own NATS user (everything allowed), which sets
up the streams and runs the simulation (generated on first start, mode 0600; pass it as --nats-creds to join another
process)."""
CLUSTER_STREAM_REPLICAS = 3
"""Stream replicas with --nats-cluster (fewer when the cluster is smaller), as the chart's streamReplicas."""


@dataclass(frozen=True, kw_only=True)
class UpNats:
    """The NATS `up` runs on: where it is and who may connect."""

    url: str
    creds: str
    """`up`'s own credentials file ("" with --nats-url and no --nats-creds: connect without)."""
    replicas: int
    """Each stream's replicas."""
    identities: dict[str, Path]
    """Part → the credentials file of its own NATS user; empty with --nats-url (every part on `up`'s connection)."""
    cluster: LocalNatsCluster | None = None
    """With --nats-cluster N (N > 1): its members."""


async def start_nats(
    stack: AsyncExitStack, common: CommonSettings, data_dir: Path, *, cluster_size: int, agent_node: str | None
) -> UpNats:
    """The server of --nats-url, or the embedded nats-server (`cluster_size` > 1: that many, clustered) letting in
    only `up`'s users: its own, each in-process service's and, unless `agent_node` is None, that node's agent's."""
    if common.nats_url:
        return UpNats(url=common.nats_url, creds=common.nats_creds, replicas=common.stream_replicas, identities={})
    # no anonymous access, even on loopback: other local users must not read or write the streams
    creds = data_dir / NATS_CREDS_FILE
    identities, authorization = natsauth.up_identities(data_dir, creds=creds, node=agent_node)
    if cluster_size > 1:
        cluster = await runtime.open_embedded_nats_cluster(
            stack, data_dir, size=cluster_size, authorization=authorization
        )
        replicas = min(cluster_size, CLUSTER_STREAM_REPLICAS)
        return UpNats(url=cluster.url, creds=str(creds), replicas=replicas, identities=identities, cluster=cluster)
    url = await runtime.open_embedded_nats(stack, data_dir, authorization=authorization)
    return UpNats(url=url, creds=str(creds), replicas=common.stream_replicas, identities=identities)


class UpBuses:
    """`up`'s connections: its own (`bus`) and the ones `of` opens for its parts, each watched by the metrics."""

    def __init__(self, stack: AsyncExitStack, nats: UpNats, bus: JetStreamBus, *, registry: Any) -> None:
        self._stack = stack
        self._nats = nats
        self._registry = registry
        self.bus = bus
        self._open: dict[str, JetStreamBus] = {"up": bus}

    async def of(self, part: str) -> JetStreamBus:
        """The bus of `part`: with the embedded nats-server its own connection as its own NATS user (the chart's pod
        of its own), else `up`'s."""
        from services.common import observe

        if part not in self._nats.identities:
            return self.bus
        self._open[part] = await runtime.open_bus(
            self._stack,
            self._nats.url,
            name=f"koordbus-up-{part}",
            creds=str(self._nats.identities[part]),
            ensure_streams=False,
        )
        observe.watch_bus(self._registry, self._open[part])
        return self._open[part]

    def liveness(self) -> Callable[[], str | None]:
        """/healthz's bus check over the connections opened so far (koordbus.runtime.bus_liveness), naming the
        part."""
        checks = {part: runtime.bus_liveness(bus) for part, bus in self._open.items()}

        def check() -> str | None:
            for part, one in checks.items():
                if (reason := one()) is not None:
                    return reason if len(checks) == 1 else f"{part}: {reason}"
            return None

        return check


async def open_buses(stack: AsyncExitStack, nats: UpNats, *, registry: Any, caps: streams.SizeCaps) -> UpBuses:
    """`up`'s own connection, which creates the streams (or brings them to their spec) with the byte `caps`."""
    from services.common import observe

    bus = await runtime.open_bus(
        stack, nats.url, name="koordbus-up", creds=nats.creds, caps=caps, replicas=nats.replicas
    )
    observe.watch_bus(registry, bus)
    return UpBuses(stack, nats, bus, registry=registry)
