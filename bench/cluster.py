"""Cluster benchmark: agent batches into the nodemetric service through three clustered nats-servers (bus.cluster:
the chart's distributed setup on loopback, routes authenticated) with R3 streams, and the time to recover from the
loss of the server leading KOORD_NODE under that load.

`python bench/cluster.py [flags]` (bench/nodemetric_ingest.py's flags, smaller defaults, plus --failover-*). Two
phases, each on a fresh cluster: (1) bench/nodemetric_ingest.py's measurement as it is, only against the cluster
(every publish acknowledged by a quorum of two of the three stores); (2) the same load for --failover-seconds, a
probe publishing one batch every PROBE_INTERVAL_SECONDS through the bus (retries included) and timing each
acknowledgement, and --failover-kill-after seconds in the SIGKILL of the KOORD_NODE leader; it reports the new
leader's election, the first probe acknowledged after the kill, the longest a probe waited, publish errors, whether
every acknowledged probe is stored exactly once, and when the service's ingest backlog was back to its level
before the kill. One JSON line on stdout, progress on stderr; everything started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import shlex
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (`python bench/cluster.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import loadgen, nodemetric_ingest, processes
from bus import streams, subjects
from bus.cluster import LocalNatsCluster
from bus.jetstream import JetStreamBus
from services.nodemetric.service import INGEST_CONSUMER

log = logging.getLogger("bench")

SERVERS = 3
STREAM_REPLICAS = 3
PROBE_INTERVAL_SECONDS = 0.05
BACKLOG_POLL_SECONDS = 0.25
RECOVERY_TIMEOUT_SECONDS = 120.0
RECOVERED_FOR_SECONDS = 5.0
"""The ingest backlog counts as recovered once back to its level before the kill and kept there this long."""
PROBE_NODE = "bench-probe"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/cluster.py",
        description="The nodemetric ingest benchmark against three clustered nats-servers with R3 streams, then the "
        "time to recover from a SIGKILL of the KOORD_NODE leader under the same load; one JSON line.",
    )
    parser.add_argument("--failover-seconds", type=float, default=60.0, help="load of the failover phase (60)")
    parser.add_argument("--failover-kill-after", type=float, default=15.0, help="kill the leader this far in (15)")
    defaults = {"nodes": 2000, "duration": 60.0, "warmup": 20.0, "stream_max_gb": 4.0}
    args = nodemetric_ingest.parse_args(argv, parser, defaults)
    if not 0 < args.failover_kill_after < args.failover_seconds:
        parser.error("--failover-kill-after must be within --failover-seconds")
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/cluster.py", "--nodes", str(args.nodes), "--pods", str(args.pods)]
    parts += ["--interval", f"{args.interval:g}", "--duration", f"{args.duration:g}", "--warmup", f"{args.warmup:g}"]
    parts += ["--failover-seconds", f"{args.failover_seconds:g}"]
    parts += ["--failover-kill-after", f"{args.failover_kill_after:g}"]
    return shlex.join(parts)


def cluster(workdir: Path) -> LocalNatsCluster:
    return LocalNatsCluster(workdir / "nats-cluster", size=SERVERS)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    (workdir / "ingest").mkdir()
    ingest = await nodemetric_ingest.run(args, workdir / "ingest", nats=cluster, stream_replicas=STREAM_REPLICAS)
    (workdir / "failover").mkdir()
    failover = await leader_kill(args, workdir / "failover")
    figures = {k: v for k, v in ingest.items() if k not in ("bench", "command")}
    return {
        "bench": "cluster",
        "servers": SERVERS,
        "stream_replicas": STREAM_REPLICAS,
        **figures,
        "failover": failover,
        "command": command_line(args),
    }


async def leader_kill(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with cluster(workdir) as nats:
        bus = await JetStreamBus.connect(nats.url, name="bench-failover")
        try:
            await bus.ensure_streams(
                [
                    streams.node_stream(max_bytes=int(args.stream_max_gb * 2**30), replicas=STREAM_REPLICAS),
                    streams.nodemetric_stream(replicas=STREAM_REPLICAS),
                    streams.dlq_stream(replicas=STREAM_REPLICAS),
                    streams.members_stream(replicas=STREAM_REPLICAS),
                ]
            )
            with contextlib.ExitStack() as stack:
                port = nodemetric_ingest.free_port()
                service_log = workdir / "service.log"
                arguments = ["nodemetric", "--nats-url", nats.url, "--database-url", f"sqlite:///{workdir}/bench.db"]
                service = stack.enter_context(
                    processes.pinned_service(
                        [*arguments, "--port", str(port)],
                        cpu=args.service_cpu,
                        log_path=service_log,
                        env={"KOORDBUS_STREAM_REPLICAS": str(STREAM_REPLICAS)},
                    )
                )
                await nodemetric_ingest.wait_for_service(port, service, service_log)
                config = loadgen.GeneratorConfig(
                    index=0,
                    generators=1,
                    nats_url=nats.url,
                    nodes=args.nodes,
                    pods=args.pods,
                    interval=args.interval,
                    pool_size=args.template_pool,
                    max_in_flight=args.max_in_flight,
                    training=args.training,
                )
                spawn = multiprocessing.get_context("spawn")
                with nodemetric_ingest.generator_processes(spawn, [config]) as counters:
                    await nodemetric_ingest.wait_for_first_publishes(counters, args.interval)
                    figures = await _kill_under_load(args, nats, bus)
                    figures["load_publish_errors"] = int(counters[0].totals().errors)
                if service.poll() is not None:
                    raise RuntimeError(f"the service died:\n{processes.tail(service_log)}")
                figures["service_restarted"] = False
                return figures
        finally:
            await bus.close()


async def _kill_under_load(args: argparse.Namespace, nats: LocalNatsCluster, bus: JetStreamBus) -> dict[str, Any]:
    probes: list[tuple[float, float | None, str]] = []
    """(sent at, acknowledged at or None for an error, msg id)."""
    stop = asyncio.Event()

    async def probe() -> None:
        n = 0
        while not stop.is_set():
            msg_id, sent = f"probe-{n}", time.monotonic()
            try:
                await bus.publish(subjects.node_actuation(PROBE_NODE), b"probe", msg_id=msg_id)
                probes.append((sent, time.monotonic(), msg_id))
            except Exception as e:
                log.warning("probe %s: %s", msg_id, e)
                probes.append((sent, None, msg_id))
            n += 1
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)

    prober = asyncio.create_task(probe())
    started = time.monotonic()
    before: list[int] = []
    while time.monotonic() - started < args.failover_kill_after:
        if (backlog := await _backlog(bus)) is not None:
            before.append(backlog)
        await asyncio.sleep(BACKLOG_POLL_SECONDS)
    baseline = max(before[-20:] or [0])
    leader = await nats.stream_leader(streams.KOORD_NODE)
    assert leader is not None
    log.info("killing %s, the KOORD_NODE leader (ingest backlog before: up to %d)", leader, baseline)
    killed_at = time.monotonic()
    await nats.kill(nats.index_of(leader))
    elected = await nats.wait_for(lambda: nats.stream_leader(streams.KOORD_NODE), timeout=RECOVERY_TIMEOUT_SECONDS)
    election = time.monotonic() - killed_at
    log.info("%s elected after %.1f s", elected, election)
    recovered: float | None = None
    """Since the kill, when the ingest backlog was last back to its level before it (and stayed there)."""
    peak = 0
    while time.monotonic() - killed_at < RECOVERY_TIMEOUT_SECONDS:
        backlog = await _backlog(bus)
        since_kill = time.monotonic() - killed_at
        if backlog is None or backlog > baseline:
            recovered = None  # unknown during the election, or not back yet
            peak = max(peak, backlog or 0)
        elif recovered is None:
            recovered = since_kill
        steady = recovered is not None and since_kill - recovered >= RECOVERED_FOR_SECONDS
        if steady and time.monotonic() - started >= args.failover_seconds:
            break
        await asyncio.sleep(BACKLOG_POLL_SECONDS)
    log.info("ingest backlog back to its level %s s after the kill (peak %d)", recovered, peak)
    stop.set()
    await prober
    acked = [p for p in probes if p[1] is not None]
    after = [p for p in acked if p[0] >= killed_at]
    stored = await bus.read_recent(
        streams.KOORD_NODE, subjects.stored(subjects.node_actuation(PROBE_NODE)), since=0, limit=len(probes) + 10
    )
    stored_ids = [m.msg_id for m in stored]
    return {
        "killed": leader,
        "elected": elected,
        "election_s": round(election, 2),
        "first_ack_after_kill_s": round(after[0][1] - killed_at, 2) if after and after[0][1] else None,
        "probe_ack_max_s": round(max((a - s for s, a, _ in acked if a is not None), default=0.0), 2),
        "probes": len(probes),
        "probe_errors": len(probes) - len(acked),
        "probe_retries": dict(bus.publish_retries),
        "acked_stored_exactly_once": sorted(stored_ids) == sorted(m for _, _, m in acked),
        "ingest_backlog_before": baseline,
        "ingest_backlog_peak": peak,
        "ingest_recovered_s": None if recovered is None else round(recovered, 2),
    }


async def _backlog(bus: JetStreamBus) -> int | None:
    """The service's ingest backlog (not yet delivered plus not yet acknowledged); None while nobody can say."""
    try:
        info = await bus.jetstream.consumer_info(streams.KOORD_NODE, INGEST_CONSUMER, timeout=1)
    except Exception:
        return None
    return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


def main(argv: list[str] | None = None) -> int:
    return processes.run_pinned_bench(parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
