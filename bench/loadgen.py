"""Load-generator processes for the ingest benchmark: many nodes' NodeMetricsReported batches at an agent's cadence.

bench/nodemetric_ingest.py starts `generators` of these (multiprocessing, spawn) and reads their `Counters`.
Simulating 10,000 nodes every 10 s is too slow (~3 ms per 100-pod batch), so each process simulates a small
pool of template nodes per window (agent.simulate, a template per pool slot, rendered a few at a time between
publishes); a node's payload is its template re-addressed to that node and stamped with the real publish
time, then encoded, so it decodes as a valid NodeMetricsReported of that node and window (sample times,
pod_samples.t included, are the real window's: templates are rendered per window). Node i of N
sends its batch for [start, end) at end + i × interval / N, like agents whose clocks are spread over the
interval, through the project's JetStreamBus with a deterministic Nats-Msg-Id and a bounded number in flight.
Nothing is ever skipped: a generator that falls behind publishes late and says so (`lag_max_s`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import msgspec

from agent.batch import PodListThinner
from agent.settings import AgentSettings
from agent.simulate import SimulatedNode, simulated_node_names
from bus import subjects
from bus.api import msg_id
from bus.errors import BusError
from bus.jetstream import JetStreamBus
from schemas.node import NodeMetricsReported, encode_node_event, pod_list_digest

log = logging.getLogger("bench.loadgen")

STOP_POLL_SECONDS = 0.1
DRAIN_TIMEOUT_SECONDS = 15.0


@dataclass(frozen=True)
class Template:
    """One rendered batch, re-addressed to each node it stands in for."""

    batch: NodeMetricsReported
    pod_samples: int

    @classmethod
    def of(cls, batch: NodeMetricsReported, *, training: bool = True) -> Template:
        """The template with its pod list's digest computed once (every node it stands in for lists the same);
        without `training`, with the batch's training round (if any) left out."""
        digest = pod_list_digest(batch.pods) if batch.pods else 0
        rounds = batch.training if training else None
        return cls(
            batch=msgspec.structs.replace(batch, pods_digest=digest, training=rounds),
            pod_samples=len(batch.pod_samples),
        )

    def stamp(self, node: str, sent_at: float, thinner: PodListThinner) -> bytes:
        """The batch as `node` sends it at `sent_at`, in the node subjects' wire format; `thinner` is the node's
        own and leaves the pod list out when that node sent the same list recently, as an agent does.

        Re-encoding per node (tens of µs for 100 pods) keeps the generator independent of that format.
        """
        return encode_node_event(thinner.thin(msgspec.structs.replace(self.batch, node=node, sent_at=sent_at)))


class TemplatePool:
    """`size` simulated nodes whose batches stand in for every node (node i uses template i mod size); without
    `training` the batches carry no training rounds, so the service's prod predictor has nothing to train."""

    def __init__(self, size: int, *, pods: int, seed: int = 7, training: bool = True) -> None:
        self._nodes = [SimulatedNode(f"bench-template-{k:03d}", seed=seed + k, pods=pods) for k in range(size)]
        self._training = training

    def __len__(self) -> int:
        return len(self._nodes)

    def render(self, k: int, window_start: float, window_end: float) -> Template:
        return Template.of(self._nodes[k].batch(window_start, window_end), training=self._training)


class _Rendering:
    """One window's templates, built one at a time so the work fits in the gaps between publishes."""

    def __init__(self, pool: TemplatePool, window_start: float, window_end: float) -> None:
        self._pool = pool
        self._window = (window_start, window_end)
        self.templates: list[Template] = []

    @property
    def done(self) -> bool:
        return len(self.templates) == len(self._pool)

    def step(self) -> None:
        self.templates.append(self._pool.render(len(self.templates), *self._window))

    def finish(self) -> list[Template]:
        while not self.done:
            self.step()
        return self.templates


def aligned_window_start(now: float, interval: float) -> float:
    """The start of the publish window `now` is in; windows sit on wall-clock multiples of the interval."""
    return math.floor(now / interval) * interval


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    index: int
    generators: int
    nats_url: str
    nodes: int
    pods: int
    interval: float
    pool_size: int = 64
    max_in_flight: int = 256
    seed: int = 7
    training: bool = True
    """Whether the batches carry the agent's training rounds (bench/nodemetric_ingest.py --no-training: False)."""

    def slots(self) -> list[tuple[float, int, str]]:
        """(send offset after the window end, node index, node name) of this generator's nodes, in send order."""
        names = simulated_node_names(self.nodes)
        step = self.interval / self.nodes
        return [(i * step, i, names[i]) for i in range(self.index, self.nodes, self.generators)]


_FIELDS = ("published", "pod_samples", "duplicates", "errors", "lag_max_s", "started")


@dataclass(frozen=True)
class Totals:
    published: int
    """Batches the stream acknowledged as new."""
    pod_samples: int
    duplicates: int
    errors: int
    lag_max_s: float
    """Longest a send started after its due time, since the last reset."""
    started: bool


class Counters:
    """Shared-memory tallies one generator keeps and the benchmark reads (and whose lag maximum it resets)."""

    def __init__(self, ctx: SpawnContext) -> None:
        self._values: list[Synchronized[float]] = [ctx.Value("d", 0.0) for _ in _FIELDS]

    def _add(self, field: str, amount: float) -> None:
        value = self._values[_FIELDS.index(field)]
        with value.get_lock():
            value.value += amount

    def acked(self, pod_samples: int, *, duplicate: bool) -> None:
        self._add("duplicates" if duplicate else "published", 1)
        if not duplicate:
            self._add("pod_samples", pod_samples)
        self._values[_FIELDS.index("started")].value = 1.0

    def failed(self) -> None:
        self._add("errors", 1)

    def late(self, seconds: float) -> None:
        value = self._values[_FIELDS.index("lag_max_s")]
        with value.get_lock():
            value.value = max(value.value, seconds)

    def totals(self, *, reset_lag: bool = False) -> Totals:
        raw = {name: v.value for name, v in zip(_FIELDS, self._values, strict=True)}
        if reset_lag:
            self._values[_FIELDS.index("lag_max_s")].value = 0.0
        return Totals(
            published=int(raw["published"]),
            pod_samples=int(raw["pod_samples"]),
            duplicates=int(raw["duplicates"]),
            errors=int(raw["errors"]),
            lag_max_s=raw["lag_max_s"],
            started=raw["started"] > 0,
        )


def run_generator(config: GeneratorConfig, counters: Counters, stop: Event) -> None:
    """Process entry point: publish until `stop` is set, then let in-flight publishes finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops us through `stop`, also on Ctrl-C
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s generator-{config.index}: %(message)s")
    asyncio.run(_Generator(config, counters, stop).run())


class _Generator:
    def __init__(self, config: GeneratorConfig, counters: Counters, stop: Event) -> None:
        self._config = config
        self._counters = counters
        self._stop = stop
        self._pool = TemplatePool(
            min(config.pool_size, config.nodes), pods=config.pods, seed=config.seed, training=config.training
        )
        self._in_flight = asyncio.Semaphore(config.max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._thinners: dict[str, PodListThinner] = {}

    async def run(self) -> None:
        cfg = self._config
        bus = await JetStreamBus.connect(cfg.nats_url, name=f"bench-gen-{cfg.index}", max_in_flight=cfg.max_in_flight)
        try:
            await self._publish_windows(bus)
        finally:
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=DRAIN_TIMEOUT_SECONDS)
            await bus.close()

    async def _publish_windows(self, bus: JetStreamBus) -> None:
        interval = self._config.interval
        slots = self._config.slots()
        start = aligned_window_start(time.time(), interval)
        templates = _Rendering(self._pool, start, start + interval).finish()
        while not self._stop.is_set():
            end = start + interval
            upcoming = _Rendering(self._pool, end, end + interval)
            for offset, index, name in slots:
                if not await self._wait_until(end + offset, upcoming):
                    return
                await self._in_flight.acquire()
                self._counters.late(max(time.time() - (end + offset), 0.0))
                template = templates[index % len(templates)]
                task = asyncio.create_task(self._publish(bus, name, template, start))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            templates = upcoming.finish()
            start = end

    async def _wait_until(self, due: float, upcoming: _Rendering) -> bool:
        """Render upcoming templates while there is time, then sleep; False once asked to stop."""
        while (now := time.time()) < due:
            if self._stop.is_set():
                return False
            if not upcoming.done:
                upcoming.step()
            else:
                await asyncio.sleep(min(due - now, STOP_POLL_SECONDS))
        return not self._stop.is_set()

    async def _publish(self, bus: JetStreamBus, node: str, template: Template, window_start: float) -> None:
        try:
            thinner = self._thinners.setdefault(node, PodListThinner(AgentSettings.pod_list_resend_batches))
            data = template.stamp(node, time.time(), thinner)
            ack = await bus.publish(subjects.node_metrics(node), data, msg_id=msg_id(node, "metrics", window_start))
        except BusError as e:
            self._counters.failed()
            log.warning("publish for %s failed: %s", node, e)
        else:
            self._counters.acked(template.pod_samples, duplicate=ack.duplicate)
        finally:
            self._in_flight.release()
