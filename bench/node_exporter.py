"""The exporter Prometheus scrapes in bench/compare_prometheus.py: the same nodes' usage the load generators send.

A process of its own (multiprocessing, spawn), started by the benchmark. Node i's values come from the same
simulated template node as its batches in bench.loadgen (template i mod pool size, rendered for the same
agent-interval windows and seed), so both systems see the same series: at a scrape at time t it serves each
node's sample for the whole second t falls in. `/metrics/<shard>` serves nodes [shard × k, shard × k + k) for
k = nodes_per_target. A window's bodies are built before it starts, one template at a time between requests;
the HTTP side is a minimal keep-alive HTTP/1.1 responder so the exporter's own cost stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

from agent.simulate import simulated_node_names
from bench import loadgen, promsetup

log = logging.getLogger("bench.node_exporter")

STOP_POLL_SECONDS = 0.1
HEADER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True, kw_only=True)
class ExporterConfig:
    port: int
    nodes: int
    pods: int
    interval: float
    """The agents' publish interval: windows and templates line up with bench.loadgen's."""
    nodes_per_target: int
    pool_size: int = 64
    seed: int = 7


WindowBodies = list[list[bytes]]
"""[second in window][shard] → response body."""


def render_window(config: ExporterConfig, templates: list[loadgen.Template]) -> WindowBodies:
    """Every shard's body for every second of the window `templates` were rendered for."""
    names = simulated_node_names(config.nodes)
    seconds = len(templates[0].batch.node_samples)
    cpu = [[f"{c:.6g}" for _, c, _ in t.batch.node_samples] for t in templates]
    memory = [[str(m) for _, _, m in t.batch.node_samples] for t in templates]
    per = config.nodes_per_target
    bodies: WindowBodies = []
    for j in range(seconds):
        row = []
        for shard in range(promsetup.shards(config.nodes, per)):
            indices = range(shard * per, min((shard + 1) * per, config.nodes))
            row.append(
                promsetup.exposition(
                    [names[i] for i in indices],
                    [cpu[i % len(templates)][j] for i in indices],
                    [memory[i % len(templates)][j] for i in indices],
                )
            )
        bodies.append(row)
    return bodies


class _Exporter:
    def __init__(self, config: ExporterConfig, scrapes: Synchronized[float]) -> None:
        self._config = config
        self._scrapes = scrapes
        self._pool = loadgen.TemplatePool(min(config.pool_size, config.nodes), pods=config.pods, seed=config.seed)
        self._windows: dict[float, WindowBodies] = {}

    async def _render(self, start: float) -> None:
        """Build the window starting at `start`, yielding to requests between templates."""
        templates = []
        for k in range(len(self._pool)):
            templates.append(self._pool.render(k, start, start + self._config.interval))
            await asyncio.sleep(0)
        self._windows[start] = render_window(self._config, templates)
        for old in [w for w in self._windows if w < start - self._config.interval]:
            del self._windows[old]

    def body(self, path: bytes) -> bytes | None:
        now = time.time()
        start = loadgen.aligned_window_start(now, self._config.interval)
        bodies = self._windows.get(start)
        prefix = b"/metrics/"
        if bodies is None or not path.startswith(prefix) or not path[len(prefix) :].isdigit():
            return None
        shard = int(path[len(prefix) :])
        second = min(int(now - start), len(bodies) - 1)
        return bodies[second][shard] if shard < len(bodies[second]) else None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                parts = head.split(b" ", 2)
                body = self.body(parts[1]) if len(parts) > 2 else None
                writer.write(NOT_FOUND if body is None else HEADER % len(body) + body)
                await writer.drain()
                if body is not None:
                    with self._scrapes.get_lock():
                        self._scrapes.value += 1
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def run(self, ready: Event, stop: Event) -> None:
        interval = self._config.interval
        start = loadgen.aligned_window_start(time.time(), interval)
        await self._render(start)
        server = await asyncio.start_server(self.handle, "127.0.0.1", self._config.port)
        ready.set()
        next_render: asyncio.Task[None] = asyncio.create_task(self._render(start + interval))
        try:
            while not stop.is_set():
                await asyncio.sleep(STOP_POLL_SECONDS)
                current = loadgen.aligned_window_start(time.time(), interval)
                if current > start and next_render.done():
                    next_render.result()
                    start = current
                    next_render = asyncio.create_task(self._render(start + interval))
        finally:
            next_render.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await next_render
            server.close()
            await server.wait_closed()


def run_exporter(config: ExporterConfig, scrapes: Synchronized[float], ready: Event, stop: Event) -> None:
    """Process entry point: serve until `stop` is set; `scrapes` counts bodies served, `ready` says it listens."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops us through `stop`, also on Ctrl-C
    logging.basicConfig(level=logging.INFO, format="%(asctime)s node-exporter: %(message)s")
    asyncio.run(_Exporter(config, scrapes).run(ready, stop))
