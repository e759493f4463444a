"""`koordbus calc <kind>`: the offline calculators of ../shared/design/CALC-CONTRACT.md.

Registered by koordbus/cli.py through `add_parser`. Each kind is one `Calculator` entry in `CALCULATORS`: a msgspec
input type (so a wrong type is reported with its JSON path) and a function from that decoded input to the JSON-ready
output, running the same pure core the services run; later kinds plug in by adding an entry (koordbus.calc_*). Bad
input exits 2 with one line on stderr; a calculation Koordinator itself rejects exits 0 with `{"error": ...}`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from koordbus import (
    calc_evict,
    calc_loadaware,
    calc_migration,
    calc_prediction,
    calc_profile,
    calc_qos,
    calc_quota,
    calc_slo,
)
from koordbus.calc_errors import InputError
from koordbus.calc_input import decode_input
from koordbus.calc_kind import Calculator
from koordbus.calc_lownodeload import LOW_NODE_LOAD, LOW_NODE_LOAD_UTIL
from schemas import koordinator, kube, nodemetric_json, percentile
from services.nodemetric import aggregate, core
from services.noderesource import config as colocation_config
from services.noderesource import core as noderesource


@dataclass(frozen=True)
class Outcome:
    """What the command prints and returns; `run` performs it."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""


# --- nodemetric-aggregate (§1.5)


class AggregateInput(msgspec.Struct, frozen=True, kw_only=True):
    samples: list[float]
    aggregations: list[str] = msgspec.field(default_factory=lambda: list(aggregate.AGGREGATIONS))


def _aggregate(inp: AggregateInput) -> dict[str, Any]:
    _require_finite(inp.samples, "$.samples")
    if not inp.samples:
        return {"error": "no samples to aggregate"}
    out: dict[str, Any] = {}
    try:
        for name in inp.aggregations:
            value = aggregate.aggregate(name, inp.samples)
            out[name] = int(value) if name == aggregate.COUNT else value
    except aggregate.AggregationError as err:
        return {"error": str(err)}
    n = len(inp.samples)
    ranks = {
        name: percentile.nearest_rank_index(n, p)
        for name, p in aggregate.PERCENTILES.items()
        if name in inp.aggregations
    }
    out["explain"] = {"count": n, "percentileIndex": ranks}
    return out


# --- nodemetric (§1.6)

SampleRow = tuple[float, float, float]


class PodInput(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    namespace: str = ""
    priority: str = ""
    qos: str = ""
    samples: list[SampleRow] = []


class NodeMetricInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    now: float | dt.datetime
    spec: koordinator.MetricCollectPolicyJSON = koordinator.MetricCollectPolicyJSON()
    node_samples: list[SampleRow] = []
    system_samples: list[SampleRow] = []
    pods: list[PodInput] = []


def _nodemetric(inp: NodeMetricInput) -> dict[str, Any]:
    try:
        spec = koordinator.collect_policy_from_struct(inp.spec)
    except koordinator.KoordinatorFormatError as err:
        raise InputError(str(err.under("$.spec"))) from None
    _require_finite_rows(inp.node_samples, "$.nodeSamples")
    _require_finite_rows(inp.system_samples, "$.systemSamples")
    for i, pod in enumerate(inp.pods):
        _require_finite_rows(pod.samples, f"$.pods[{i}].samples")
    now = _unix_seconds(inp.now)
    pods = [core.PodSeries(p.namespace, p.name, p.samples, p.priority, p.qos) for p in inp.pods]
    status = core.compute_from_samples(
        report_time=now, spec=spec, node_samples=inp.node_samples, system_samples=inp.system_samples, pods=pods
    )
    counts = core.count_from_samples(
        report_time=now, spec=spec, node_samples=inp.node_samples, system_samples=inp.system_samples, pods=pods
    )
    out = koordinator.nodemetric_status_to_json(status, quantities=False)
    out["explain"] = {
        "effectivePolicy": koordinator.collect_policy_to_json(core.effective_policy(spec)),
        "windows": [_count_to_json(c) for c in counts],
    }
    return out


def _count_to_json(count: core.WindowCount) -> dict[str, Any]:
    out: dict[str, Any] = {
        "for": "nodeUsage, systemUsage, podsMetric" if count.pod_samples is not None else "aggregated usages",
        "duration": koordinator.format_go_duration(count.duration_seconds),
        "start": count.start,
        "end": count.end,
        "nodeSamples": count.node_samples,
        "systemSamples": count.system_samples,
    }
    if count.pod_samples is not None:
        out["podSamples"] = count.pod_samples
    return out


def _unix_seconds(now: float | dt.datetime) -> float:
    """`now` as Unix seconds; an RFC 3339 time without an offset is UTC."""
    if not isinstance(now, dt.datetime):
        return now
    return (now if now.tzinfo is not None else now.replace(tzinfo=dt.UTC)).timestamp()


# --- batch-resource (§2)


class BatchResourceInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    now: float | dt.datetime
    node: kube.Node
    pods: list[kube.Pod] = []
    node_metric: nodemetric_json.NodeMetricObject | None = None
    colocation_config: dict[str, Any] | None = None


def _batch_resource(inp: BatchResourceInput) -> dict[str, Any]:
    meta = inp.node.metadata
    try:
        strategy = colocation_config.effective_strategy_from_json(inp.colocation_config, meta.labels, meta.annotations)
    except colocation_config.ColocationConfigError as err:
        message = "; ".join(f"$.colocationConfig{path[1:]}: {reason}" for path, reason in err.problems)
        if err.malformed:  # a wrong type or unparsable value: bad input (exit 2), not a config Koordinator rejects
            raise InputError(message) from None
        # Well-typed but out of range: Koordinator rejects the config and leaves the node as it was.
        return {"error": message}
    now = _unix_seconds(inp.now)
    if not math.isfinite(now):
        raise InputError(f"$.now: Expected a finite number, got {now!r}")
    snapshot = None if inp.node_metric is None else nodemetric_json.usage_snapshot(inp.node_metric)
    result = noderesource.calculate(inp.node, [kube.summarize_pod(p) for p in inp.pods], snapshot, strategy, now)
    patch = noderesource.prepare(inp.node, result)
    explained = {
        name: {**msgspec.to_builtins(item), "prepare": patch.steps.get(name, [])}
        for name, item in result.resources.items()
    }
    return {
        "resources": patch.resources,
        "explain": {
            "resources": explained,
            "pods": msgspec.to_builtins(result.pods),
            "annotations": patch.annotations,
            "strategy": colocation_config.strategy_to_json(strategy),
        },
    }


def _require_finite(values: Sequence[float], path: str) -> None:
    for i, value in enumerate(values):
        if not math.isfinite(value):
            raise InputError(f"{path}[{i}]: Expected a finite number, got {value!r}")


def _require_finite_rows(rows: Sequence[Sequence[float]], path: str) -> None:
    for i, row in enumerate(rows):
        _require_finite(row, f"{path}[{i}]")


CALCULATORS: Mapping[str, Calculator] = {
    "nodemetric-aggregate": Calculator(
        AggregateInput,
        _aggregate,
        "avg / nearest-rank percentiles / last / count of samples in time order (spec §1.5)",
        '{"samples": [3, 1, 2], "aggregations": ["avg", "p50", "p99", "last", "count"]}',
    ),
    "nodemetric": Calculator(
        NodeMetricInput,
        _nodemetric,
        "a NodeMetric status from raw [unixSeconds, cores, bytes] samples (spec §1.6)",
        '{"now": "2026-01-01T12:00:00Z", "spec": {"nodeAggregatePolicy": {"durations": ["5m"]}},\n'
        '     "nodeSamples": [[1767268790, 2.5, 8e9]], "systemSamples": [],\n'
        '     "pods": [{"namespace": "ns", "name": "web", "priority": "koord-prod", "qos": "LS",\n'
        '               "samples": [[1767268790, 0.5, 1e9]]}]}',
    ),
    "batch-resource": Calculator(
        BatchResourceInput,
        _batch_resource,
        "batch-cpu/batch-memory/mid-cpu/mid-memory of a node (spec §2); null = removed",
        '{"now": "2026-01-01T12:00:00Z", "colocationConfig": {"enable": true},\n'
        '     "node": {"status": {"capacity": {"cpu": "100", "memory": "400Gi"},\n'
        '                         "allocatable": {"cpu": "98", "memory": "392Gi"}}},\n'
        '     "pods": [], "nodeMetric": {"status": {"updateTime": "2026-01-01T11:59:00Z",\n'
        '       "nodeMetric": {"systemUsage": {"resources": {"cpu": "3", "memory": "10Gi"}}}}}}',
    ),
    "arbitrate": Calculator(
        calc_migration.ArbitrateInput,
        calc_migration.arbitrate,
        "one arbitration round of PodMigrationJobs: passed / failed / waiting, with the filter and why (spec §4.4)",
        '{"args": {"maxMigratingPerNode": 1}, "jobs": [{"metadata": {"name": "j"},\n'
        '     "spec": {"podRef": {"namespace": "default", "name": "p"}}}], "pods": [], "workloads": []}',
    ),
    "arbitrate-math": Calculator(
        calc_migration.ArbitrateMathInput,
        calc_migration.arbitrate_math,
        "GetMaxUnavailable / GetMaxMigrating for a workload (spec §4.3)",
        '{"op": "getMaxUnavailable", "replicas": 10, "value": "50%"}',
    ),
    "resctrl": Calculator(
        calc_qos.ResctrlInput,
        calc_qos.resctrl,
        "L3 CAT and MBA schemata lines per QoS group (spec §5.4)",
        '{"vendor": "GenuineIntel", "cbmMask": "7ff", "cacheIds": [0, 1],\n'
        '     "classes": {"BE": {"catRangeStartPercent": 0, "catRangeEndPercent": 30, "mbaPercent": 55}}}',
    ),
    "be-cgroup": Calculator(
        calc_qos.BeCgroupInput,
        calc_qos.be_cgroup,
        "a BE pod's and its containers' cpu/memory cgroup values from batch resources (spec §5.7)",
        '{"cgroupVersion": 1, "pod": {"metadata": {"labels": {"koordinator.sh/qosClass": "BE"}},\n'
        '     "spec": {"containers": [{"name": "c",\n'
        '       "resources": {"requests": {"kubernetes.io/batch-cpu": "1000"}}}]}}}',
    ),
    "be-cgroup-math": Calculator(
        calc_qos.BeCgroupMathInput,
        calc_qos.be_cgroup_math,
        "MilliCPUToShares / MilliCPUToQuota / cgroup v2 weight conversions (spec §5.7)",
        '{"op": "milliCPUToShares", "value": 1000}',
    ),
    "loadaware": Calculator(
        calc_loadaware.NodeStateInput,
        calc_loadaware.loadaware,
        "the load-aware extender's filter, 0-100 score, estimates and assigned-pod cache for a pod on a node (spec §6)",
        '{"now": "2026-01-01T12:00:00Z", "args": {},\n'
        '     "node": {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "32", "memory": "128Gi"}}},\n'
        '     "nodeMetric": {"status": {"updateTime": "2026-01-01T11:59:30Z",\n'
        '       "nodeMetric": {"nodeUsage": {"resources": {"cpu": "12", "memory": "64Gi"}}}}},\n'
        '     "assignedPods": [], "pod": {"spec": {"containers": [{"name": "c",\n'
        '       "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]}}}',
    ),
    "loadaware-estimate": Calculator(
        calc_loadaware.EstimateInput,
        calc_loadaware.loadaware_estimate,
        "the load-aware scheduler's DefaultEstimator: a pod's estimated usage, a node's allocatable (spec §6.3)",
        '{"args": {}, "pod": {"spec": {"containers": [{"name": "c",\n'
        '     "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]}}}',
    ),
    "nodeslo": Calculator(
        calc_slo.NodeSloInput,
        calc_slo.nodeslo,
        "a node's NodeSLO spec from the slo-controller-config data, as koord-manager renders it (spec §7.1)",
        '{"configMap": {"resource-threshold-config":\n'
        '       "{\\"clusterStrategy\\": {\\"enable\\": true, \\"cpuSuppressThresholdPercent\\": 60}}"},\n'
        '     "previousConfigMap": null, "node": {"metadata": {"labels": {"pool": "batch"}}}}',
    ),
    "histogram": Calculator(
        calc_prediction.HistogramInput, calc_prediction.histogram_percentiles, *calc_prediction.HISTOGRAM_HELP
    ),
    "prod-reclaimable": Calculator(
        calc_prediction.ProdReclaimableInput, calc_prediction.prod_reclaimable, *calc_prediction.PROD_RECLAIMABLE_HELP
    ),
    "colocation-profile": Calculator(
        calc_profile.ColocationProfileInput, calc_profile.colocation_profile, *calc_profile.COLOCATION_PROFILE_HELP
    ),
    "low-node-load": LOW_NODE_LOAD,
    "low-node-load-util": LOW_NODE_LOAD_UTIL,
    "quota-runtime": Calculator(
        calc_quota.QuotaRuntimeInput,
        calc_quota.runtimes,
        "runtime / request / used of every ElasticQuota in one tree (spec §3.5–3.7)",
        '{"total": {"cpu": "100"}, "requests": {"a": {"cpu": "30"}},\n'
        '     "quotas": [{"metadata": {"name": "a"}, "spec": {"min": {"cpu": "20"}, "max": {"cpu": "100"}}}]}',
    ),
    **{name: Calculator(*parts) for name, parts in calc_evict.KINDS.items()},
}


# --- decoding and the command


def calculate(kind: str, text: str) -> Outcome:
    """The whole command for one document: decode, compute, render; never raises for bad input."""
    calculator = CALCULATORS.get(kind)
    if calculator is None:
        known = ", ".join(sorted(CALCULATORS))
        return Outcome(2, stderr=f"koordbus calc: unknown kind {kind!r} (known kinds: {known})\n")
    try:
        result = calculator.compute(decode_input(text, calculator.input_type))
    except InputError as err:
        message = " ".join(str(err).split())
        return Outcome(2, stderr=f"koordbus calc {kind}: {message}\n")
    return Outcome(0, stdout=json.dumps(result, allow_nan=False) + "\n")


def _epilog() -> str:
    lines = ["kinds:"]
    for name, calculator in CALCULATORS.items():
        lines += [f"  {name}", f"      {calculator.summary}", f"      example: {calculator.example}", ""]
    lines.append('Exit 2 (one line on stderr) for malformed input; exit 0 with {"error": ...} when the')
    lines.append("calculation itself rejects the input. Contract: shared/design/CALC-CONTRACT.md.")
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "calc",
        help="run one calculator on a JSON or YAML document",
        description="Read one JSON or YAML document (stdin or --input), run a calculator, print one JSON document.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", metavar="KIND", help="one of: " + ", ".join(CALCULATORS))
    p.add_argument("--input", "-i", metavar="FILE", help="read the document from FILE instead of stdin")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.kind not in CALCULATORS:
        outcome = calculate(args.kind, "")
    else:
        try:
            text = Path(args.input).read_text(encoding="utf-8") if args.input else sys.stdin.read()
        except (OSError, UnicodeDecodeError) as err:
            sys.stderr.write(f"koordbus calc {args.kind}: cannot read input: {err}\n")
            return 2
        outcome = calculate(args.kind, text)
    sys.stdout.write(outcome.stdout)
    sys.stderr.write(outcome.stderr)
    return outcome.exit_code
