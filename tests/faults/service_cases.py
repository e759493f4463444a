"""Per service, what tests/faults/test_kill_and_restart.py needs: inputs, load, consumers, decisions, projection.

Each `Case` says how to put the service's inputs on the bus before it starts (`setup`) and while it runs (`load`,
one step at a time), which durable consumers it runs (to tell when it has caught up), which streams hold its
decisions and how to read them back with the identity that must be unique, and how to read its projection through
its store. The loads are small (a few hundred events) so a case with a kill, a restart and a clean replay stays
well under 20 s on two cores; their content is drawn from the test's seeded random generator.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agent.simulate import SimulatedNode
from bus import streams, subjects
from bus.api import Delivery, msg_id
from bus.jetstream import JetStreamBus
from schemas.node import NodeMetricsReported, encode_node_event
from services.nodemetric import service as nodemetric
from services.nodemetric.store import NodeMetricStore
from tests.faults.processes import stream_messages

PAGE = 10_000

Decisions = list[Any]


@dataclass(kw_only=True)
class Case:
    service: str
    durables: tuple[tuple[str, str], ...]
    """(stream, durable) of every consumer the service runs."""
    decision_streams: tuple[str, ...]
    setup: Callable[[JetStreamBus], Awaitable[None]]
    load: Callable[[JetStreamBus, int], Awaitable[None]]
    read_decisions: Callable[[JetStreamBus], Awaitable[Decisions]]
    """The decisions in their streams, oldest first, each as its identity (what must not repeat)."""
    read_projection: Callable[[JetStreamBus, AsyncEngine | None], Awaitable[Any]]
    min_decisions: int
    steps: int = 40
    step_seconds: float = 0.1
    kill_window: float = 2.5
    """The SIGKILL comes within this many seconds (drawn uniformly) after the service's consumers started."""
    database: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    after_load: Callable[[JetStreamBus], Awaitable[None]] = field(default=lambda bus: _nothing())

    def assert_no_duplicates(self, decisions: Decisions, what: str) -> None:
        seen: set[Any] = set()
        repeated = [d for d in decisions if d in seen or seen.add(d)]  # type: ignore[func-returns-value]
        assert not repeated, f"{what}: decisions stored more than once: {repeated[:5]}"

    def enough(self, decisions: Decisions) -> bool:
        return len(decisions) >= self.min_decisions


async def _nothing() -> None:
    return None


def _ids(messages: list[Delivery]) -> Decisions:
    return [(m.subject, m.msg_id) for m in messages]


# ---- nodemetric: agent batches in, NodeMetricComputed out, the latest per node (and node liveness) projected


def nodemetric_case(rng: random.Random) -> Case:
    nodes = [SimulatedNode(f"fault-node-{i}", seed=rng.randrange(1 << 30), pods=4) for i in range(4)]
    window = 10.0
    # Event times 20 minutes back (inside the service's replay window): 40 windows are 6-7 reports per node.
    base = math.floor(time.time() / 60) * 60 - 20 * 60
    steps = 40
    batches: list[list[NodeMetricsReported]] = [
        [node.batch(base + step * window, base + (step + 1) * window) for node in nodes] for step in range(steps)
    ]

    async def load(bus: JetStreamBus, step: int) -> None:
        await bus.publish_many(
            [
                (subjects.node_metrics(b.node), encode_node_event(b), msg_id(b.node, "metrics", b.window_start))
                for b in batches[step]
            ]
        )

    async def decisions(bus: JetStreamBus) -> Decisions:
        return _ids(await stream_messages(bus, streams.KOORD_NODEMETRIC, subjects.NODEMETRIC_COMPUTED_ALL))

    async def projection(bus: JetStreamBus, engine: AsyncEngine | None) -> Any:
        assert engine is not None
        store = NodeMetricStore(engine)
        return await store.list(limit=PAGE), await store.nodes(limit=PAGE)

    return Case(
        service="nodemetric",
        durables=(
            (streams.KOORD_NODE, nodemetric.INGEST_CONSUMER),
            (streams.KOORD_NODEMETRIC, nodemetric.PROJECTOR_CONSUMER),
        ),
        decision_streams=(streams.KOORD_NODEMETRIC,),
        setup=lambda bus: _nothing(),
        load=load,
        read_decisions=decisions,
        read_projection=projection,
        min_decisions=4 * 5,
        steps=steps,
    )


BUILDERS: dict[str, Callable[[random.Random], Case]] = {
    "nodemetric": nodemetric_case,
}
SERVICES = list(BUILDERS)


def build(service: str, rng: random.Random) -> Case:
    return BUILDERS[service](rng)
