"""Prediction benchmark: the prod predictor's cost at N nodes × P pods, and a replica's restore of every model.

Run as `python bench/prediction.py [flags]` (see --help) and, with tiny flags, by tests/e2e/test_bench_prediction.py.
In one process, as the nodemetric service holds them: it trains N nodes' models (services.nodemetric.training) for
--rounds minutes of synthetic per-pod usage (steady pods with noise, 60 % prod), then measures --measure-rounds
more minutes of training plus one prediction per node (what each report asks), and the memory the models take
(RSS growth per model, after a collection), and the time of a full collection with them held (`gc_full_s`: how
long the event loop of a service holding them would stall at one). Then it starts an embedded nats-server, publishes
every node's snapshot to KOORD_PREDICTION (services.nodemetric.snapshots, part by part as a replica does over each
10 minutes, the parts back to back: the longest part and the longest event-loop stall meanwhile are reported) and
times a restore of all of them, as a restarting replica does before its replay, checking a sample of nodes bit for
bit. Exactly one JSON
line goes to stdout; progress goes to stderr. The nats-server and the temporary directory go away on the way out.

Targets (issue 22): the predictor adds at most 0.2 core (`predictor_cores`: CPU seconds per simulated minute / 60)
and 1 GB for a million pod models (`model_bytes` × 1e6), and a restart restores every model in under 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bus import streams
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas import vocab
from schemas.node import TrainingRound
from services.nodemetric import snapshots
from services.nodemetric.core import PodInfo
from services.nodemetric.training import NodePredictor

log = logging.getLogger("bench.prediction")

GiB = 1 << 30
T0 = 1_800_000_000.0
PROD_SHARE = 0.6
CORES_TARGET = 0.2
MEMORY_TARGET_BYTES_PER_MILLION = 1 << 30
RESTORE_TARGET_SECONDS = 60.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=10_000, help="nodes (10000)")
    p.add_argument("--pods", type=int, default=100, help="pods per node (100)")
    p.add_argument("--rounds", type=int, default=10, help="training minutes before measuring (10)")
    p.add_argument("--measure-rounds", type=int, default=3, help="minutes of training + prediction measured (3)")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    if args.nodes < 1 or args.pods < 1 or args.rounds < 1 or args.measure_rounds < 1:
        p.error("--nodes, --pods, --rounds and --measure-rounds must be at least 1")
    return args


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Cluster:
    """N nodes of P pods with steady usage (a base per pod, ±20 % a minute) and their predictors."""

    def __init__(self, nodes: int, pods: int, seed: int) -> None:
        rng = random.Random(seed)
        self.rng = rng
        self.names = [f"bench-node-{i:05d}" for i in range(nodes)]
        self.pods = [
            [
                PodInfo(
                    "bench",
                    f"pod-{i}-{k}",
                    f"{i:08d}-{k:04d}-4000-8000-000000000000",
                    vocab.PRIORITY_PROD if k < pods * PROD_SHARE else vocab.PRIORITY_BATCH,
                    "LS",
                    4000,
                    8 * GiB,
                    None,
                    False,
                )
                for k in range(pods)
            ]
            for i in range(nodes)
        ]
        self.base = [[rng.uniform(0.1, 3.0) for _ in range(pods)] for _ in range(nodes)]
        self.predictors = [NodePredictor(capacity={"cpu": 64_000, "memory": 256 * GiB}) for _ in range(nodes)]
        self.minute = 0

    def train_minute(self, *, predict: bool) -> None:
        end = T0 + 60 * (self.minute + 1)
        self.minute += 1
        uniform = self.rng.uniform
        for predictor, pods, base in zip(self.predictors, self.pods, self.base, strict=True):
            cpu = [b * uniform(0.8, 1.2) for b in base]
            round_ = TrainingRound(
                start=end - 60,
                end=end,
                node_cpu=sum(cpu) + 2.0,
                node_memory=int(sum(base) * 2 * GiB),
                pods=list(range(len(pods))),
                pod_cpu=cpu,
                pod_memory=[int(b * 2 * GiB * uniform(0.95, 1.05)) for b in base],
            )
            predictor.train(round_, pods)
            if predict:
                predictor.predict(end, pods, explain=False)  # as a report asks


class StallMonitor:
    """The longest the event loop went without running this task (asking to run every millisecond) while it ran:
    how long the ingest would have waited behind whatever held the loop."""

    def __init__(self) -> None:
        self.longest = 0.0

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            self.longest = max(self.longest, time.perf_counter() - started - 0.001)


async def snapshot_and_restore(cluster: Cluster, workdir: Path) -> dict[str, Any]:
    server = EmbeddedNatsServer(store_dir=workdir / "nats")
    await server.start()
    print(f"nats-server at {server.url}", file=sys.stderr, flush=True)
    bus = await JetStreamBus.connect(server.url, name="bench-prediction")
    try:
        await bus.ensure_streams([streams.prediction_stream()])
        writer = snapshots.SnapshotWriter(bus)
        predictors = dict(zip(cluster.names, cluster.predictors, strict=True))
        stalls = StallMonitor()
        monitor = asyncio.create_task(stalls.run())
        started = time.perf_counter()
        saved, tick_seconds = 0, []
        for part in range(writer.parts):  # the service's ticks, back to back
            tick_started = time.perf_counter()
            saved += await writer.save(predictors, now=time.time(), part=part)
            tick_seconds.append(time.perf_counter() - tick_started)
        save_seconds = time.perf_counter() - started
        monitor.cancel()
        stored_bytes = (await bus.jetstream.stream_info(streams.KOORD_PREDICTION)).state.bytes
        log.info("%d snapshots published in %.1f s (%.0f MB stored)", saved, save_seconds, stored_bytes / 1e6)
        started = time.perf_counter()
        restored = await snapshots.restore(bus, None)
        restore_seconds = time.perf_counter() - started
        log.info("%d nodes restored in %.1f s", len(restored.predictors), restore_seconds)
        sample = cluster.names[:: max(1, len(cluster.names) // 50)]
        exact = all(
            restored.predictors[name].snapshot(name, 0) == cluster.predictors[i].snapshot(name, 0)
            for i, name in enumerate(cluster.names)
            if name in sample
        )
        return {
            "snapshots": saved,
            "snapshot_save_s": round(save_seconds, 2),
            "snapshot_tick_max_s": round(max(tick_seconds), 2),
            "snapshot_stall_max_ms": round(stalls.longest * 1000, 1),
            "snapshot_stored_mb": round(stored_bytes / 1e6, 1),
            "restored_nodes": len(restored.predictors),
            "restore_s": round(restore_seconds, 2),
            "restore_exact": exact and restored.unreadable == 0,
        }
    finally:
        await bus.close()
        await server.stop()


def full_collection() -> tuple[float, int]:
    """The fastest of three full collections (the event loop's stall when one runs), and how many objects the
    collector tracks: the models' share of them is what a collection scans."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    return min(times), len(gc.get_objects())


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    gc.collect()
    before = rss_bytes()
    cluster = Cluster(args.nodes, args.pods, args.seed)
    gc.collect()
    without_models = rss_bytes()
    for minute in range(args.rounds):
        cluster.train_minute(predict=False)
        log.info("trained minute %d of %d", minute + 1, args.rounds)
    gc.collect()
    models = sum(len(p.models.models) for p in cluster.predictors)
    model_bytes = (rss_bytes() - without_models) / models
    gc_full_s, gc_tracked = full_collection()
    cpu_started = time.process_time()
    for _ in range(args.measure_rounds):
        cluster.train_minute(predict=True)
    cpu_per_minute = (time.process_time() - cpu_started) / args.measure_rounds
    result: dict[str, Any] = {
        "bench": "prediction",
        "nodes": args.nodes,
        "pods": args.pods,
        "models": models,
        "model_bytes": round(model_bytes),
        "memory_per_million_models_mb": round(model_bytes * 1e6 / 2**20),
        "cluster_fixture_mb": round((without_models - before) / 2**20),
        "gc_full_s": round(gc_full_s, 3),
        "gc_tracked_objects": gc_tracked,
        "cpu_s_per_minute": round(cpu_per_minute, 2),
        "predictor_cores": round(cpu_per_minute / 60, 3),
        "ms_per_node_minute": round(cpu_per_minute / args.nodes * 1000, 3),
    }
    result |= asyncio.run(snapshot_and_restore(cluster, workdir))
    result["target_held"] = (
        result["predictor_cores"] <= CORES_TARGET * args.nodes * args.pods / 1e6
        and model_bytes * 1e6 <= MEMORY_TARGET_BYTES_PER_MILLION
        and result["restore_s"] < RESTORE_TARGET_SECONDS
        and result["restore_exact"]
    )
    result["command"] = " ".join(["python", "bench/prediction.py", *sys.argv[1:]])
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="koordbus-bench-") as workdir:
        result = run(args, Path(workdir))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
