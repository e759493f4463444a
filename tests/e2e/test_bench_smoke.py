"""bench/nodemetric_ingest.py at toy size: one JSON line with the documented keys and sane values, nothing left
running or on disk afterwards (also after Ctrl-C), and its two helpers — payload stamping and the histogram
quantile — checked on their own."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.batch import PodListThinner
from bench import loadgen, measure, nodemetric_ingest
from bus.api import msg_id
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "nodemetric_ingest.py"
DOCUMENTED_KEYS = {
    "bench", "nodes", "pods", "interval_s", "duration_s", "offered_batches_per_s", "batches_per_s",
    "pod_samples_per_s", "latency_p50_s", "latency_p99_s", "service_rss_peak_mb", "service_cpu_cores",
    "backlog_end", "reports", "target_held", "command", "projection_latency_p50_s", "projection_latency_p99_s",
}  # fmt: skip
TOY = ["--nodes", "20", "--pods", "5", "--interval", "2", "--warmup", "3"]


def bench_command(*flags: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *TOY, *flags]


def environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path)}  # the benchmark's temporary directory lands where we can look


def assert_stopped(stderr: str, tmp_path: Path) -> None:
    """The service process and the nats-server are gone and the temporary directory was removed."""
    service = re.search(r"service pid (\d+)", stderr)
    assert service, stderr
    assert not Path(f"/proc/{service.group(1)}").exists()
    nats = re.search(r"nats-server at nats://127\.0\.0\.1:(\d+)", stderr)
    assert nats, stderr
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(nats.group(1))), timeout=1):
        pass
    assert not list(tmp_path.glob("koordbus-bench-*"))


def test_prints_one_json_line_with_sane_figures(tmp_path: Path) -> None:
    run = subprocess.run(
        bench_command("--duration", "8"), capture_output=True, text=True, timeout=100, env=environment(tmp_path)
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert result.keys() >= DOCUMENTED_KEYS
    assert result["bench"] == "nodemetric_ingest"
    assert (result["nodes"], result["pods"], result["interval_s"]) == (20, 5, 2.0)
    assert result["offered_batches_per_s"] == 10.0
    assert 7.5 <= result["duration_s"] <= 12
    # 80 batches in 8 s: only those straddling the period's edges may fall either side.
    assert 8.5 <= result["batches_per_s"] <= 11.5
    assert 8.5 <= result["published_batches_per_s"] <= 11.5
    assert 0 < result["pod_samples_per_batch"] <= 5 * 2  # at most every pod with both of its 1 s samples
    assert result["pod_samples_per_s"] == pytest.approx(result["batches_per_s"] * result["pod_samples_per_batch"], 0.01)
    assert 0 < result["latency_p50_s"] <= result["latency_p99_s"] < 2.0
    assert result["latency_above_top_bucket"] == 0.0
    if result["projection_latency_p99_s"] is not None:  # only when a report round fell in the measured period
        assert 0 < result["projection_latency_p50_s"] <= result["projection_latency_p99_s"] < 2.0
    assert 20 < result["service_rss_peak_mb"] < 2048
    assert 0 < result["service_cpu_cores"] <= 1.05  # pinned to one CPU
    assert result["backlog_end"] >= 0 and result["reports"] >= 0 and result["publish_errors"] == 0
    assert result["target_held"] is (not result["target_misses"])
    assert result["command"].startswith("python bench/nodemetric_ingest.py --nodes 20 --pods 5 --interval 2")
    assert_stopped(run.stderr, tmp_path)


def test_ctrl_c_stops_everything_and_prints_no_result(tmp_path: Path) -> None:
    process = subprocess.Popen(
        bench_command("--duration", "60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(tmp_path),
    )
    deadline = time.monotonic() + 60
    try:
        assert process.stderr is not None
        seen = ""
        while "warming up" not in seen and time.monotonic() < deadline:
            seen += process.stderr.readline()
        assert "warming up" in seen, seen
        process.send_signal(signal.SIGINT)
        stdout, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, seen + rest
    assert stdout == ""
    assert "Traceback" not in rest
    assert_stopped(seen + rest, tmp_path)


def test_stamped_template_decodes_as_that_nodes_batch() -> None:
    pool = loadgen.TemplatePool(2, pods=6)
    template = pool.render(1, 1_700_000_000.0, 1_700_000_010.0)
    original = template.batch
    thinner = PodListThinner(6)
    stamped = NODE_EVENT_DECODER.decode(template.stamp("sim-node-10000", 1_700_000_012.625, thinner))
    assert isinstance(stamped, NodeMetricsReported)
    assert (stamped.node, stamped.sent_at) == ("sim-node-10000", 1_700_000_012.625)
    assert (stamped.window_start, stamped.window_end) == (1_700_000_000.0, 1_700_000_010.0)
    assert stamped.pods == original.pods and stamped.node_samples == original.node_samples
    assert stamped.pod_samples == original.pod_samples
    assert len(stamped.node_samples) == 10
    assert template.pod_samples == len(stamped.pod_samples) > 0
    assert all(1_700_000_000.0 <= t < 1_700_000_010.0 for t in stamped.pod_samples.arrays().t.tolist())
    again = NODE_EVENT_DECODER.decode(template.stamp("sim-node-10000", 1_700_000_022.625, thinner))
    assert isinstance(again, NodeMetricsReported)  # the same list again: named by digest, not resent
    assert again.pods == [] and again.pods_digest == stamped.pods_digest != 0
    assert msg_id("sim-node-10000", "metrics", 1_700_000_000.0) != msg_id("sim-node-0001", "metrics", 1_700_000_000.0)


def test_generator_slots_spread_every_node_once_over_the_interval() -> None:
    configs = [
        loadgen.GeneratorConfig(index=i, generators=3, nats_url="", nodes=10, pods=1, interval=5.0) for i in (0, 1, 2)
    ]
    slots = [slot for config in configs for slot in config.slots()]
    assert sorted(index for _, index, _ in slots) == list(range(10))
    assert sorted(offset for offset, _, _ in slots) == [i * 0.5 for i in range(10)]
    assert {name for _, _, name in slots} == {f"sim-node-{i:04d}" for i in range(1, 11)}
    assert loadgen.aligned_window_start(1_700_000_017.3, 10.0) == 1_700_000_010.0


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    inf = math.inf
    buckets = ((0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (inf, 100.0))
    assert measure.histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert measure.histogram_quantile(0.25, buckets) == pytest.approx(0.05)  # the first bucket starts at 0
    assert measure.histogram_quantile(0.7, buckets) == pytest.approx(0.3)
    assert measure.histogram_quantile(0.99, buckets) == pytest.approx(0.95)
    assert measure.histogram_quantile(0.99, ((1.0, 10.0), (2.0, 10.0), (inf, 20.0))) == 2.0  # +Inf: highest bound
    assert measure.histogram_quantile(0.5, ((1.0, 0.0), (inf, 0.0))) is None
    assert measure.fraction_above_top_bucket(((1.0, 10.0), (2.0, 15.0), (inf, 20.0))) == 0.25
    before = ((0.1, 40.0), (inf, 45.0))
    assert measure.bucket_deltas(((0.1, 50.0), (inf, 60.0)), before) == ((0.1, 10.0), (inf, 15.0))


def test_parses_the_services_metrics_and_proc_files() -> None:
    text = (
        "# TYPE koordbus_nodemetric_batches counter\nkoordbus_nodemetric_batches_total 12.0\n"
        "# TYPE koordbus_nodemetric_reports counter\nkoordbus_nodemetric_reports_total 3.0\n"
        "# TYPE koordbus_nodemetric_ingest_latency_seconds histogram\n"
        'koordbus_nodemetric_ingest_latency_seconds_bucket{le="0.5"} 10.0\n'
        'koordbus_nodemetric_ingest_latency_seconds_bucket{le="+Inf"} 12.0\n'
        "koordbus_nodemetric_ingest_latency_seconds_count 12.0\nkoordbus_nodemetric_ingest_latency_seconds_sum 2.0\n"
    )
    parsed = measure.parse_metrics(text)
    assert (parsed.batches, parsed.reports, parsed.latency) == (12.0, 3.0, ((0.5, 10.0), (math.inf, 12.0)))
    stat = "42 (python3 (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 1000 200"
    status = "Name:\tpython3\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    sample = measure.parse_proc(stat, status, clock_ticks=100)
    assert (sample.cpu_seconds, sample.rss_peak_bytes, sample.rss_bytes) == (3.0, 200 * 2**20, 100 * 2**20)


def test_verdict_names_each_miss() -> None:
    held = measure.Outcome(
        offered_per_s=100.0,
        published_per_s=99.0,
        applied_per_s=99.0,
        latency_p99_s=0.5,
        rss_peak_bytes=2**30,
        backlog_start=0,
        backlog_end=10,
        publish_errors=0,
    )
    assert measure.misses(held) == []
    slow = dataclasses.replace(held, applied_per_s=60.0, latency_p99_s=4.0, backlog_end=5000)
    reasons = measure.misses(slow)
    assert len(reasons) == 3 and any("p99" in r for r in reasons) and any("backlog" in r for r in reasons)
    assert measure.misses(dataclasses.replace(held, rss_peak_bytes=3 * 2**30))[0].startswith("peak RSS")


def test_templates_carry_the_minutes_training_round_unless_told_not_to() -> None:
    minute_end = 1_699_999_980.0  # a wall-clock minute: the agents' training rounds end there
    for training in (True, False):
        pool = loadgen.TemplatePool(1, pods=6, training=training)
        batches = [pool.render(0, minute_end - 60 + 10 * k, minute_end - 50 + 10 * k).batch for k in range(6)]
        rounds = [b.training for b in batches]
        assert rounds[:5] == [None] * 5
        assert (rounds[5] is not None) is training
        assert batches[5].pod_samples  # the samples stay: only the round is left out


def ingest_line(**fields: object) -> str:
    line = {
        "bench": "nodemetric_ingest", "nodes": 20, "pods": 5, "interval_s": 2.0, "training": False,
        "service_rss_peak_mb": 1500.0, "service_cpu_cores": 0.5, "command": "python bench/nodemetric_ingest.py …",
    } | fields  # fmt: skip
    return "progress on stderr is not here\n" + json.dumps(line) + "\n"


def measured(cpu_seconds: float, rss_peak_mb: float) -> tuple[nodemetric_ingest.Snapshot, nodemetric_ingest.Snapshot]:
    """Two snapshots 100 s apart: every batch offered applied in 0.1 s, the service's CPU time and peak RSS as given."""
    buckets = ((0.1, 0.0), (math.inf, 0.0))
    done = ((0.1, 1000.0), (math.inf, 1000.0))

    def snapshot(at: float, batches: float, latency: measure.Buckets, cpu: float) -> nodemetric_ingest.Snapshot:
        return nodemetric_ingest.Snapshot(
            at=at,
            replicas=[measure.ServiceMetrics(batches, reports=0.0, latency=latency, projection_latency=latency)],
            procs=[measure.ProcSample(cpu, int(rss_peak_mb * 2**20), int(rss_peak_mb * 2**20))],
            sent=[loadgen.Totals(int(batches), 0, 0, 0, 0.0, True)],
            backlog=0,
        )

    return snapshot(0.0, 0.0, buckets, 0.0), snapshot(100.0, 1000.0, done, cpu_seconds)


def test_baseline_bounds_what_the_predictor_may_add(tmp_path: Path) -> None:
    baseline = tmp_path / "no-training.json"
    baseline.write_text(ingest_line())
    args = nodemetric_ingest.parse_args([*TOY, "--baseline", str(baseline)])
    assert args.baseline_figures.target().rss_bytes == 1500 * 2**20 + 2**30
    first, last = measured(cpu_seconds=60.0, rss_peak_mb=2400.0)
    held = nodemetric_ingest.result(args, first, last, load_seconds=100.0)
    assert (held["predictor_rss_mb"], held["predictor_cpu_cores"], held["training"]) == (900.0, 0.1, True)
    assert held["target_held"], held["target_misses"]  # 2.3 GiB: over the plain bound, within the allowance
    assert held["command"].endswith(f"--baseline {baseline}")
    first, last = measured(cpu_seconds=80.0, rss_peak_mb=2600.0)
    missed = nodemetric_ingest.result(args, first, last, load_seconds=100.0)
    assert len(missed["target_misses"]) == 2, missed["target_misses"]
    assert missed["target_misses"][0].startswith("peak RSS 2600 MiB >= 2524 MiB")
    assert missed["target_misses"][1].startswith("the predictor added 0.300 core")
    plain = nodemetric_ingest.result(nodemetric_ingest.parse_args(TOY), first, last, load_seconds=100.0)
    assert plain["predictor_rss_mb"] is None and plain["target_misses"][0].startswith("peak RSS 2600 MiB >= 2048")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (ingest_line(training=True), "its JSON line is not one of `python bench/nodemetric_ingest.py --no-training`"),
        (ingest_line(nodes=10_000), "it ran --nodes 10000 --pods 5 --interval 2, this run --nodes 20"),
        (ingest_line(service_rss_peak_mb=None), "cannot read its JSON line"),
        ("{not json\n", "its last line is not JSON"),
        ("", "cannot read its JSON line"),
    ],
)
def test_a_baseline_that_does_not_fit_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, why: str
) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(content)
    with pytest.raises(SystemExit) as exit_:
        nodemetric_ingest.parse_args([*TOY, "--baseline", str(baseline)])
    assert exit_.value.code == 2
    assert f"--baseline {baseline}: {why}" in capsys.readouterr().err


def test_no_training_goes_into_the_command_and_not_with_a_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = nodemetric_ingest.parse_args([*TOY, "--no-training"])
    assert not args.training and nodemetric_ingest.command_line(args).endswith(" --no-training")
    with pytest.raises(SystemExit):
        nodemetric_ingest.parse_args([*TOY, "--no-training", "--baseline", str(tmp_path / "missing.json")])
    assert "not with --no-training" in capsys.readouterr().err
