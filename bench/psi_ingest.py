"""PSI ingest cost: what pod PSI adds to the nodemetric service's per-batch work (decode + window), one JSON line.

`python bench/psi_ingest.py [--pods 100] [--batches 60]`: simulated batches (agent.simulate) with and without pod PSI
columns (every pod, every second, all six stall ratios, as an agent on a PSI kernel sends them) decoded and added to a
node window, best of three passes; prints the microseconds per batch of each and the wire bytes of each.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from agent.simulate import SimulatedNode
from schemas.node import NODE_EVENT_DECODER, MetricCollectPolicy, encode_node_event
from schemas.psi import PodPsiColumns, PsiSample
from services.nodemetric.window import NodeWindow

T0 = 1_800_000_000


def per_batch_microseconds(batches: list[bytes]) -> float:
    best = float("inf")
    for _ in range(3):
        window = NodeWindow(MetricCollectPolicy())
        started = time.perf_counter()
        for data in batches:
            window.add(NODE_EVENT_DECODER.decode(data))
        best = min(best, (time.perf_counter() - started) / len(batches))
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=100, help="pods per simulated node (100; ~80%% run at a time)")
    p.add_argument("--batches", type=int, default=60, help="10-second batches per pass (60)")
    args = p.parse_args(argv)
    rng = random.Random(7)
    sim = SimulatedNode("bench-psi", 3, pods=args.pods)
    plain, with_psi = [], []
    pods = 0
    for k in range(args.batches):
        start = T0 + 10 * k
        batch = sim.batch(start, start + 10)
        pods = max(pods, len(batch.pods))
        rows = [
            (i, PsiSample(t=start + s, cpu_some=rng.random() * 0.1, cpu_full=0.01, memory_some=0.0,
                          memory_full=0.0, io_some=0.02, io_full=0.01))
            for i in range(len(batch.pods))
            for s in range(10)
        ]  # fmt: skip
        plain.append(encode_node_event(batch))
        with_psi.append(encode_node_event(msgspec.structs.replace(batch, pod_psi=PodPsiColumns.of(rows))))
    without_us, with_us = per_batch_microseconds(plain), per_batch_microseconds(with_psi)
    result = {
        "bench": "psi_ingest",
        "pods_per_batch": pods,
        "batch_us_without_pod_psi": round(without_us),
        "batch_us_with_pod_psi": round(with_us),
        "bytes_without_pod_psi": len(plain[0]),
        "bytes_with_pod_psi": len(with_psi[0]),
        "command": " ".join(["python", "bench/psi_ingest.py", *sys.argv[1:]]),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
