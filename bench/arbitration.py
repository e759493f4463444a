"""Arbitration benchmark: one round over many waiting PodMigrationJobs; prints one JSON line.

Run as `python bench/arbitration.py [flags]` (see --help); at toy size by tests/e2e/test_bench_arbitration_smoke.py.
It builds W workloads (ReplicaSets of 8–20 replicas, pods Ready, some not) spread over N nodes, and J waiting jobs on
random pods of them (plus a few already migrating), with Koordinator's default args, then times
services.migration.arbiter.arbitrate — order, filters, the whole round — over a ClusterView (the indexed pods and
workloads the service keeps between rounds; its build time is reported apart) on this process (pin it with
`taskset` for a clean figure). Reports the round's p50/p99/max over --rounds rounds, jobs/s and how the jobs came
out, and the first round apart: it works out, for the view, each job's entry (pod, kind, order key, the facts the
limits read) and each pod's static filters (non-retryable, nodeFit), which later rounds reuse until the view is
rebuilt; the first round is timed like the others and counts in p50/p99/max. By default every round gets the very
same job objects, so a round after the first also reuses the last round's order; `--churn N` replaces N waiting
jobs by changed copies (a later creation time) before each round after the first, untimed, as the service's state
would between rounds: those N entries are worked out again and the order is sorted afresh. The service rebuilds its
view whenever a pod, workload or node it reads changes; the round after that costs what the first one here does, on
top of the view build. Target (issue 25): p99 of a round < 100 ms unpinned at 10,000 jobs, 1,000 workloads, 2,000
nodes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas import kube, migration
from services.migration import arbiter
from services.migration.args import MigrationArgs

log = logging.getLogger("bench")

ROUND_TARGET_S = 0.1


def build(jobs: int, workloads: int, nodes: int, seed: int) -> tuple[list[Any], list[Any], list[Any]]:
    rng = random.Random(seed)
    pods: list[kube.Pod] = []
    owners: list[migration.Workload] = []
    for w in range(workloads):
        replicas = rng.randrange(8, 21)
        uid = f"rs-{w}"
        namespace = f"ns-{w % 50}"
        owners.append(
            migration.Workload(
                api_version="apps/v1", kind="ReplicaSet", namespace=namespace, name=uid, uid=uid, replicas=replicas
            )
        )
        for r in range(replicas):
            ready = rng.random() > 0.03
            pods.append(
                msgspec.convert(
                    {
                        "metadata": {
                            "name": f"{uid}-{r}",
                            "namespace": namespace,
                            "uid": f"{uid}-{r}",
                            "creationTimestamp": f"2026-01-01T{rng.randrange(0, 12):02d}:00:00Z",
                            "ownerReferences": [
                                {
                                    "apiVersion": "apps/v1",
                                    "kind": "ReplicaSet",
                                    "name": uid,
                                    "uid": uid,
                                    "controller": True,
                                }
                            ],
                            "labels": {"koordinator.sh/priority-class": rng.choice(["koord-prod", "koord-batch"])},
                        },
                        "spec": {
                            "nodeName": f"node-{rng.randrange(nodes)}",
                            "schedulerName": "koord-scheduler",
                            "priority": rng.choice([5500, 9100]),
                            "containers": [{"name": "c"}],
                        },
                        "status": {
                            "phase": "Running",
                            "qosClass": "Burstable",
                            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                        },
                    },
                    kube.Pod,
                )
            )
    chosen = rng.sample(pods, min(jobs + jobs // 20, len(pods)))
    pmjs: list[migration.PodMigrationJob] = []
    for index, p in enumerate(chosen):
        running = index >= jobs  # a few already migrating
        pmjs.append(
            msgspec.convert(
                {
                    "metadata": {"name": f"job-{index}", "creationTimestamp": "2026-01-01T12:00:00Z"},
                    "spec": {
                        "podRef": {"namespace": p.metadata.namespace, "name": p.metadata.name, "uid": p.metadata.uid}
                    },
                    "status": {"phase": "Running" if running else "Pending"},
                },
                migration.PodMigrationJob,
            )
        )
    return pmjs, pods, owners


def changed(job: migration.PodMigrationJob, *, seconds: int) -> migration.PodMigrationJob:
    """Another object for the job, created `seconds` later (so it also moves in the order)."""
    created = job.metadata.creation_timestamp or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    metadata = msgspec.structs.replace(job.metadata, creation_timestamp=created + dt.timedelta(seconds=seconds))
    return msgspec.structs.replace(job, metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Time one arbitration round over many waiting jobs; print one JSON line.")
    p.add_argument("--jobs", type=int, default=10_000, help="waiting jobs (10000)")
    p.add_argument("--workloads", type=int, default=1_000, help="ReplicaSets of 8–20 pods (1000)")
    p.add_argument("--nodes", type=int, default=2_000, help="nodes the pods are spread over (2000)")
    p.add_argument("--rounds", type=int, default=100, help="rounds timed (100; p99 is the nearest rank)")
    p.add_argument("--churn", type=int, default=0, help="waiting jobs changed before each round after the first (0)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if min(a.jobs, a.workloads, a.nodes, a.rounds) < 1:
        p.error("--jobs, --workloads, --nodes and --rounds must be positive")
    if not 0 <= a.churn <= a.jobs:
        p.error("--churn must be between 0 and --jobs")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    jobs, pods, workloads = build(a.jobs, a.workloads, a.nodes, a.seed)
    if len(pods) < a.jobs:
        p.error(f"only {len(pods)} pods for {a.jobs} jobs: give more --workloads")
    args = MigrationArgs()
    log.info("%d jobs, %d pods, %d workloads, %d nodes", len(jobs), len(pods), len(workloads), a.nodes)
    started = time.perf_counter()
    view = arbiter.ClusterView.build(pods, workloads, args)
    view_s = time.perf_counter() - started
    timings: list[float] = []
    result = arbiter.Round()
    churn = random.Random(a.seed + 1)
    for number in range(a.rounds):
        if number and a.churn:  # the first a.jobs jobs are the waiting ones
            for index in churn.sample(range(a.jobs), a.churn):
                jobs[index] = changed(jobs[index], seconds=number)
        started = time.perf_counter()
        result = arbiter.arbitrate(jobs, view, args)
        timings.append(time.perf_counter() - started)
    p50 = statistics.median(timings)
    p99 = sorted(timings)[math.ceil(0.99 * len(timings)) - 1]
    misses = [] if p99 < ROUND_TARGET_S else [f"round p99 {p99 * 1000:.0f} ms >= {ROUND_TARGET_S * 1000:.0f} ms"]
    flags = ["--jobs", str(a.jobs), "--workloads", str(a.workloads), "--nodes", str(a.nodes)]
    command = "python bench/arbitration.py " + shlex.join(flags + (["--churn", str(a.churn)] if a.churn else []))
    print(
        json.dumps(
            {
                "bench": "arbitration",
                "jobs": a.jobs,
                "pods": len(pods),
                "workloads": a.workloads,
                "nodes": a.nodes,
                "view_build_ms": round(view_s * 1000, 2),
                "round_p50_ms": round(p50 * 1000, 2),
                "round_p99_ms": round(p99 * 1000, 2),
                "first_round_ms": round(timings[0] * 1000, 2),
                "round_max_ms": round(max(timings) * 1000, 2),
                "rounds": a.rounds,
                "churn": a.churn,
                "jobs_per_s": round(len(result.order) / p50),
                "passed": len(result.names("passed")),
                "failed": len(result.names("failed")),
                "waiting": len(result.names("waiting")),
                "target_held": not misses,
                "target_misses": misses,
                "command": command,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
