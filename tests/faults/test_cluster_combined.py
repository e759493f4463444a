"""The whole control plane on the three-server cluster through a sequence of server losses, under agent load
(issue 26 point 2, and point 3's quota commands during an election).

On tests/fixtures/nats_cluster.py's cluster (R3 streams, the chart's auth), every projecting service runs at once
as it is deployed: two replicas each of nodemetric and noderesource (instance names r1 and r2: they split the node
partitions between them, each pair on one database) and one each of quota, migration and slo. Each gets the inputs
and load of its case in tests/faults/service_cases.py (node names prefixed per case, so the cases do not overwrite
each other's nodes; slo's ConfigMap keeps noderesource's colocation-config), published steadily, not paced by the
consumers; nodemetric's load — the agents' batches — goes through a separate connection as the `agents` user, and
every batch it got an ack for is remembered. Then, in sequence, while that load runs:

1. the server leading KOORD_NODE gets SIGKILL, and is started again once another leads it;
2. the server leading KOORD_QUOTA gets SIGKILL while quota commands are being sent (each retried with its command
   id until applied: what an election answers is surfaced to the asker as "unavailable", an error or no answer,
   never as a silent loss), and is started again;
3. the server leading slo's consumer of KOORD_CLUSTER (whose deliveries turn into KV puts) gets SIGKILL, restarted;
4. the server leading the KOORD_SLO KV bucket's stream gets SIGKILL while slo puts NodeSLOs in it, restarted;
5. the server leading KOORD_NODE gets SIGSTOP for PAUSE_SECONDS (a partition), then SIGCONT.

After each: a new leader elected, every service process — the same ones, never restarted — answers /readyz with
200 within READY_BOUND_SECONDS of the fault, and every stream is whole again (three current replicas) before the
next. At the end: every service's consumers catch up with the whole load; every agent batch acked is in KOORD_NODE
exactly once; every quota command applied is in KOORD_QUOTA exactly once; and per service, as in
test_cluster_failover.py, a clean replay into an empty database (one process, no instance name) publishes nothing
the run had not (no decision lost), no decision is stored twice, and the projections read back the same.

Cost: 100–160 s (at nice 19 on a two-core machine busy with a benchmark; 3 nats-servers and 7 service processes,
then 5 replays): five elections of ~5 s each, the pause, restarted servers catching up, and up to a consumer's
ack_wait (30 s) for deliveries a killed server took with it; the timeout is 420 s. It prints its figures with -s.
KOORDBUS_FAULTS_SEED reproduces the load and the timing of the faults (not the machine's).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

import tests.unit.test_noderesource_state as nr
import tests.unit.test_quota_validation as quota_validation
from bus import streams, subjects
from bus.cluster import LocalNatsCluster, free_port
from bus.errors import BusError, BusUnavailableError, RemoteError
from bus.jetstream import JetStreamBus
from schemas import quota_events as ev
from schemas.quota_service import CommandReply, CommandRequest
from services.common import membership
from services.slo import service as slo
from tests.faults import service_cases as cases
from tests.faults.processes import KoordbusProcess, stream_messages, wait_for
from tests.faults.test_cluster_failover import (
    CLUSTER_CATCH_UP_SECONDS,
    ELECTION_TIMEOUT_SECONDS,
    PAUSE_SECONDS,
    ClusterRun,
    consumers_state,
    seed,  # noqa: F401  (the fixture)
)
from tests.fixtures.nats_cluster import REPLICAS, ClusterUnderTest

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

log = logging.getLogger(__name__)

SCALED = {"nodemetric": ("r1", "r2"), "noderesource": ("r1", "r2")}
"""The services run as two replicas (their instance names); the others as one."""
PREFIXES = {"nodemetric": "nm", "noderesource": "nr", "quota": "quota", "migration": "mig", "slo": "slo"}
MAX_STEPS = 150
"""Each case's load stops at this many steps, or once the faults are over."""
STEP_SECONDS = 0.6
READY_BOUND_SECONDS = 40.0
"""From a fault (for a pause: from its end) until every process answers /readyz with 200."""
STREAMS_WHOLE_SECONDS = 40.0
QUOTA_COMMAND_BOUND_SECONDS = 40.0
"""How long one quota command may take to be applied, asked again and again through an election."""
QUOTA_REQUEST_TIMEOUT_SECONDS = 5.0
QUOTA_WRITES_AFTER = 3
"""Quota commands applied after the KOORD_QUOTA leader's election before the writes stop."""


@dataclass(frozen=True)
class Fault:
    action: str  # "kill" | "pause"
    stream: str
    durable: str | None = None
    quota_writes: bool = False

    def __str__(self) -> str:
        return f"{self.action} the leader of {self.stream}{f' consumer {self.durable}' if self.durable else ''}"


FAULTS = (
    Fault("kill", streams.KOORD_NODE),
    Fault("kill", streams.KOORD_QUOTA, quota_writes=True),
    Fault("kill", streams.KOORD_CLUSTER, slo.CLUSTER_CONSUMER),
    Fault("kill", streams.KV_KOORD_SLO),
    Fault("pause", streams.KOORD_NODE),
)


class ScaledRun(ClusterRun):
    """A ClusterRun whose failover run is `instances` replicas on one database ("failover"), each with its HTTP
    port; the replay is one process without an instance name, as in ClusterRun."""

    instances: tuple[str, ...]
    replicas: list[tuple[KoordbusProcess, int]]

    def start_replicas(self) -> None:
        self.replicas = []
        for instance in self.instances:
            port = free_port()
            process = self.process("failover", instance=instance, port=port)
            process.start()
            self.replicas.append((process, port))

    def replica_durables(self) -> tuple[tuple[str, str], ...]:
        return tuple(
            (stream, membership.durable(name, instance))
            for instance in self.instances
            for stream, name in self.case.durables
        )

    def assert_alive(self) -> None:
        for process, _ in self.replicas:
            process.assert_alive()

    async def consumed(self, process: KoordbusProcess) -> None:
        if all(process is not p for p, _ in self.replicas):  # the replay
            await super().consumed(process)
            return
        since = min(p.started_at for p, _ in self.replicas)

        async def idle() -> bool:
            self.assert_alive()
            return await consumers_state(self.bus, self.replica_durables(), since=since, idle=True)

        await wait_for(idle, timeout=CLUSTER_CATCH_UP_SECONDS, what=f"{self.context()}: consumers caught up")

    async def consumers_started(self) -> bool:
        since = min(p.started_at for p, _ in self.replicas)
        return await consumers_state(self.bus, self.replica_durables(), since=since, idle=False)

    async def ready(self, http: httpx.AsyncClient) -> bool:
        self.assert_alive()
        for _, port in self.replicas:
            try:
                response = await http.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            except httpx.TransportError:
                return False
            if response.status_code != 200:
                return False
        return True


@dataclass
class Agents:
    """The nodemetric case's load as the agents send it (`publish_many`, what its load calls): every message whose
    batch was acknowledged is remembered by msg id."""

    bus: JetStreamBus
    acked: set[str] = field(default_factory=set)

    async def publish_many(self, messages: list[tuple[str, bytes, str]]) -> Any:
        acks = await self.bus.publish_many(messages)
        self.acked.update(mid for _, _, mid in messages)
        return acks


@dataclass
class Load:
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    steps: dict[str, int] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)

    async def run(self, run: ScaledRun, bus: Any) -> None:
        """Steadily, one step every STEP_SECONDS until stopped; a step the bus failed (past its own retries) is
        sent again, as an agent keeps its batch."""
        service = run.case.service
        step = 0
        while step < run.case.steps and not self.stop.is_set():
            try:
                await run.case.load(bus, step)
            except BusError as e:
                self.failed[service] += 1
                log.warning("%s load step %d failed, sent again: %s", service, step, e)
            else:
                step += 1
            self.steps[service] = step
            await asyncio.sleep(STEP_SECONDS)


@dataclass
class QuotaWrites:
    """UpdateQuota commands on leaf "a", one after another, each asked until applied under its one command id."""

    bus: JetStreamBus
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    applied: list[str] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    """Every answer but "applied", by outcome or error: what an election surfaced to the asker."""
    _writer: asyncio.Task[None] = field(init=False)

    async def start(self) -> None:
        """Writing, once the first command is applied (so the next are in flight when the fault comes)."""
        self.stop.clear()
        self._writer = asyncio.create_task(self.run())
        first = len(self.applied) + 1
        await wait_for(lambda: self._applied(first), timeout=QUOTA_COMMAND_BOUND_SECONDS, what="a quota command")

    async def finish(self, what: str) -> None:
        """Once QUOTA_WRITES_AFTER more commands are applied: stop writing (AssertionError if one failed)."""
        after = len(self.applied) + QUOTA_WRITES_AFTER
        await wait_for(lambda: self._applied(after), timeout=QUOTA_COMMAND_BOUND_SECONDS, what=f"{what}: quota writes")
        self.stop.set()
        await self._writer

    def cancel(self) -> None:
        self.stop.set()
        if hasattr(self, "_writer"):
            self._writer.cancel()

    async def _applied(self, count: int) -> bool:
        if self._writer.done():
            self._writer.result()  # what went wrong
            return True
        return len(self.applied) >= count

    async def run(self) -> None:
        n = len(self.applied)
        while not self.stop.is_set():
            command_id = f"combined-update-{n}"
            spec = quota_validation.eq("a", parent="org", min={"cpu": "16"}, max={"cpu": str(20 + n % 40)})
            request = CommandRequest(actor="faults", command=ev.UpdateQuota(command_id=command_id, quota=spec))
            await self._until_applied(request)
            self.applied.append(command_id)
            n += 1

    async def _until_applied(self, request: CommandRequest) -> None:
        deadline = time.monotonic() + QUOTA_COMMAND_BOUND_SECONDS
        while True:
            try:
                data = await self.bus.request(
                    subjects.QUOTA_RPC_COMMAND, msgspec.json.encode(request), timeout=QUOTA_REQUEST_TIMEOUT_SECONDS
                )
            except (BusUnavailableError, RemoteError) as e:
                self.answers[type(e).__name__] += 1
            else:
                reply = msgspec.json.decode(data, type=CommandReply)
                if reply.outcome == "applied":
                    return
                # "unavailable" is the service saying "not now": anything else is not what a retry may hear
                assert reply.outcome == "unavailable", (request.command.command_id, reply)
                self.answers[reply.outcome] += 1
            assert time.monotonic() < deadline, (
                f"quota command {request.command.command_id} not applied within {QUOTA_COMMAND_BOUND_SECONDS:.0f} s "
                f"(answers so far: {dict(self.answers)})"
            )
            await asyncio.sleep(0.2)


async def leader(cluster: LocalNatsCluster, fault: Fault) -> str | None:
    if fault.durable is None:
        return await cluster.stream_leader(fault.stream)
    return await cluster.consumer_leader(fault.stream, fault.durable)


async def streams_whole(cluster: LocalNatsCluster) -> bool:
    for spec in streams.all_streams(replicas=REPLICAS):
        if not await cluster.stream_current(spec.name):
            return False
    return True


async def inject(
    fault: Fault,
    cluster: LocalNatsCluster,
    *,
    ready: Callable[[], Awaitable[bool]],
    quota_writes: QuotaWrites,
    context: str,
) -> str:
    """`fault` on the server leading its stream (or consumer), asserting a new leader, every service `ready` again
    within the bound, quota commands applied through it (when asked) and every stream whole again; its figures."""
    if fault.quota_writes:
        await quota_writes.start()
    victim = await cluster.wait_for(lambda: leader(cluster, fault), timeout=ELECTION_TIMEOUT_SECONDS, what=str(fault))
    index = cluster.index_of(victim)
    at = time.monotonic()
    if fault.action == "kill":
        await cluster.kill(index)
    else:
        cluster.pause(index)
    elected = await cluster.wait_for(
        lambda: leader(cluster, fault), timeout=ELECTION_TIMEOUT_SECONDS, what=f"{fault}: a new one"
    )
    what = f"{context}, {fault}: {victim}, {elected} elected in {time.monotonic() - at:.1f} s"
    assert elected != victim, what
    ready_from = at
    if fault.action == "kill":
        await cluster.restart(index)
    else:  # the partition heals after PAUSE_SECONDS: the old leader comes back as a follower
        await asyncio.sleep(max(0.0, PAUSE_SECONDS - (time.monotonic() - at)))
        cluster.resume(index)
        ready_from = time.monotonic()
    await wait_for(ready, timeout=READY_BOUND_SECONDS, what=f"{what}: every service ready again")
    what += f"; every service ready {time.monotonic() - ready_from:.1f} s after"
    if fault.quota_writes:
        await quota_writes.finish(what)
        what += f", quota commands applied {len(quota_writes.applied)}, other answers {dict(quota_writes.answers)}"
    await cluster.wait_for(lambda: streams_whole(cluster), timeout=STREAMS_WHOLE_SECONDS, what=f"{what}: streams")
    return f"{what}, streams whole after {time.monotonic() - at:.1f} s"


async def test_the_control_plane_rides_out_a_sequence_of_server_losses(
    nats_cluster: ClusterUnderTest,
    tmp_path: Path,
    seed: int,  # noqa: F811
) -> None:
    started_at = time.monotonic()
    cluster = nats_cluster.cluster
    rng = random.Random(seed)
    bus = await nats_cluster.connect("faults")
    agents = Agents(await nats_cluster.connect("agents", user="agents"))
    colocation = dict(nr.config_event().data)  # what noderesource's case publishes
    runs: list[ScaledRun] = []
    for service in cases.SERVICES:
        options: dict[str, Any] = {"prefix": PREFIXES[service], "steps": MAX_STEPS}
        if service == "slo":
            options["configmap"] = colocation
        case = cases.build(service, rng, **options)
        directory = tmp_path / service
        directory.mkdir()
        run = ScaledRun(case=case, nats_url=cluster.url, bus=bus, tmp_path=directory, seed=seed)
        run.creds = nats_cluster.creds_file(directory, user=service)
        run.instances = SCALED.get(service, ("",))
        runs.append(run)
    context = f"seed {seed} (KOORDBUS_FAULTS_SEED={seed} reproduces it)"
    figures: list[str] = []
    load = Load()
    quota_writes = QuotaWrites(bus)
    tasks: list[asyncio.Task[None]] = []
    try:
        # noderesource's ConfigMap before slo's, which keeps its colocation-config
        for run in sorted(runs, key=lambda r: r.case.service == "slo"):
            await run.case.setup(bus)
        for run in runs:
            run.start_replicas()
        pids = {process.pid: run.case.service for run in runs for process, _ in run.replicas}
        for run in runs:
            await wait_for(
                run.consumers_started, timeout=CLUSTER_CATCH_UP_SECONDS, what=f"{run.context()}: consumers started"
            )
        for run in runs:
            await run.case.after_start(bus)
        for run in runs:
            tasks.append(asyncio.create_task(load.run(run, agents if run.case.service == "nodemetric" else bus)))
        figures.append(f"services up and loaded after {time.monotonic() - started_at:.1f} s")

        async with httpx.AsyncClient() as http:

            async def all_ready() -> bool:
                return all([await run.ready(http) for run in runs])

            await wait_for(all_ready, timeout=READY_BOUND_SECONDS, what=f"{context}: every service ready")
            for fault in FAULTS:
                await asyncio.sleep(rng.uniform(1.0, 3.0))  # load in flight
                figures.append(
                    await inject(fault, cluster, ready=all_ready, quota_writes=quota_writes, context=context)
                )

        load.stop.set()
        await asyncio.gather(*tasks)
        figures.append(
            f"load: steps {load.steps}, steps sent again {dict(load.failed)}, {len(agents.acked)} agent batches acked, "
            f"agent publishes retried {dict(agents.bus.publish_retries)}"
        )
        await asyncio.gather(*(run.caught_up(run.replicas[0][0]) for run in runs))
        figures.append(f"caught up after {time.monotonic() - started_at:.1f} s")
        for run in runs:
            for process, _ in run.replicas:
                assert pids.get(process.pid) == run.case.service, f"{run.context()}: a process was restarted"

        # every agent batch acknowledged is stored once (and the agents' whole load was acknowledged in the end)
        stored = Counter(m.msg_id for m in await stream_messages(bus, streams.KOORD_NODE, subjects.NODE_METRICS_ALL))
        assert agents.acked, context
        assert not (lost := sorted(agents.acked - set(stored))), f"{context}: acked agent batches not stored: {lost}"
        assert not (twice := sorted(m for m, n in stored.items() if n > 1)), f"{context}: stored twice: {twice}"
        # every quota command applied through the election is stored once
        quota = Counter(
            ev.decode_quota_event(m.data).command_id
            for m in await stream_messages(bus, streams.KOORD_QUOTA, subjects.QUOTA_EVENTS_ALL)
        )
        assert quota_writes.applied, context
        assert all(quota[c] == 1 for c in quota_writes.applied), (
            f"{context}: quota commands not stored exactly once: "
            f"{ {c: quota[c] for c in quota_writes.applied if quota[c] != 1} }"
        )

        for run in runs:
            await asyncio.gather(*(asyncio.to_thread(p.stop) for p, _ in run.replicas))
        # slo's replay last: a starting migration process (its replay too) states its watermarks on a key of the
        # KOORD_SLO bucket, slo's decision stream
        replays = sorted(runs, key=lambda r: r.case.service == "slo")
        await asyncio.gather(
            *(run.assert_clean_replay(f"{run.context()}, {len(FAULTS)} faults") for run in replays[:-1])
        )
        await replays[-1].assert_clean_replay(f"{replays[-1].context()}, {len(FAULTS)} faults")
        figures.append(f"replays equal, {time.monotonic() - started_at:.1f} s in all")
    finally:
        print("\n" + "\n".join(figures))  # the figures (how far it got), with -s
        load.stop.set()
        quota_writes.cancel()
        for task in tasks:
            task.cancel()
        for run in runs:
            for process in run.started:
                process.kill()
        await agents.bus.close()
        await bus.close()
