"""The load-aware extender's vectorised filter in process, without HTTP: `Matrix.filter` of one pod over N nodes, and
the rebuild of every node's rows after a slo-controller-config change.

Run as `python bench/loadaware_filter.py [--nodes 5000] [--repeats 200] [--node-qos]`. The state is
bench/loadaware.py's (`build_state`); with --node-qos the pod is BE and two resource-threshold strategies cap it.
Prints one JSON line: the filter's median and p99 in ms, how many nodes it rejected, and how long a ConfigMap change
took to rebuild the rows (services.loadaware.state.LoadState.apply_config + fast.Matrix.refresh).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import measure
from bench.loadaware import NODE_QOS, build_state


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--nodes", type=int, default=5_000, help="nodes in the state and in the request (5000)")
    p.add_argument("--repeats", type=int, default=200, help="filter calls timed (200)")
    p.add_argument("--node-qos", action="store_true", help="a BE pod against node QoS eviction caps (off)")
    a = p.parse_args(argv)
    import msgspec

    from schemas import kube
    from services.common.watermarks import read_watermarks
    from services.loadaware import core, fast

    now = time.time()
    state = build_state(a.nodes, 20, 1, now, a.node_qos)
    matrix = fast.Matrix(state)
    matrix.refresh()
    labels = {"koordinator.sh/qosClass": "BE"} if a.node_qos else {}
    pod = msgspec.convert(
        {
            "metadata": {"name": "bench", "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]},
        },
        kube.Pod,
    )
    incoming = core.incoming(pod, state.args)
    names = [f"node-{i:05d}" for i in range(a.nodes)]
    timings: list[float] = []
    rejected = 0
    for _ in range(a.repeats):
        started = time.perf_counter()
        _, failed = matrix.filter(incoming, names, now=now)
        timings.append((time.perf_counter() - started) * 1000)
        rejected = len(failed)
    started = time.perf_counter()
    state.apply_config(state.args, read_watermarks({**NODE_QOS, "load-watermarks-config": '{"usageThresholds": {}}'}))
    fast.Matrix(state).refresh()
    rebuild_ms = (time.perf_counter() - started) * 1000
    print(
        json.dumps(
            {
                "bench": "loadaware_filter",
                "nodes": a.nodes,
                "repeats": a.repeats,
                "node_qos": a.node_qos,
                "filter_median_ms": round(statistics.median(timings), 2),
                "filter_p99_ms": round(measure.quantile(timings, 0.99) or 0.0, 2),
                "rejected_nodes": rejected,
                "config_rebuild_ms": round(rebuild_ms, 1),
                "command": shlex.join(
                    [sys.executable, "bench/loadaware_filter.py", *(argv if argv is not None else sys.argv[1:])]
                ),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
