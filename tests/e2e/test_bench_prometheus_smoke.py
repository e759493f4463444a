"""bench/compare_prometheus.py: at toy size against a real Prometheus (only where /usr/bin/prometheus exists — the
test never installs it), its exit without Prometheus, and its parts on their own: the rules and scrape config
Prometheus is given, and the exporter serving the very samples the load generators send to koordbus."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.simulate import simulated_node_names
from bench import compare_prometheus, loadgen, node_exporter, nodemetric_ingest, promsetup

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "compare_prometheus.py"
NO_PROMETHEUS = (
    f"SKIPPED LOUDLY: {compare_prometheus.PROMETHEUS} is missing, so the Prometheus comparison bench was NOT run; "
    f"install it with `{compare_prometheus.INSTALL_COMMAND}` to run this test"
)


@pytest.mark.skipif(not compare_prometheus.PROMETHEUS.exists(), reason=NO_PROMETHEUS)
def test_compares_both_systems_at_toy_size(tmp_path: Path) -> None:
    # 40 s of warm-up: the compared report then spans about a minute of samples (a 20-sample span differed by 11%
    # once, from the spans' edges alone)
    flags = ["--nodes", "6", "--pods", "5", "--report-interval", "30", "--warmup", "40", "--duration", "36"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *flags],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert (result["bench"], result["nodes"], result["report_interval_s"]) == ("compare_prometheus", 6, 30)
    koordbus, prometheus = result["koordbus"], result["prometheus"]
    for cpu in (koordbus["service_cpu_s"], koordbus["nats_cpu_s"], prometheus["cpu_s"], prometheus["exporter_cpu_s"]):
        assert cpu > 0
    assert koordbus["service_rss_peak_mb"] > 20 and prometheus["rss_peak_mb"] > 10
    # Every node reports each 30 s round: 36 s hold at least one round of all 6.
    assert koordbus["reports"] >= 6
    # A report's newest sample waits for its batch (≤ one 10 s agent interval plus the node's spread) to be sent.
    assert 0 < koordbus["batching_p50_s"] <= koordbus["freshness_p50_s"] <= koordbus["freshness_p99_s"]
    assert (prometheus["rules"], prometheus["rule_errors"], prometheus["scrape_targets"]) == (24, 0, 6)
    assert 3 <= prometheus["scrapes_per_s"] <= 7  # every target scraped about every second
    assert prometheus["rounds"] >= 1 and prometheus["freshness_values"] == 6 * prometheus["rounds"]
    assert 0 < prometheus["freshness_p50_s"] <= prometheus["freshness_p99_s"]
    check = result["cross_check"]
    assert check["node"] == "sim-node-0006"
    # The same samples went to both: their 5 min averages agree up to the windows' first samples.
    assert check["prometheus_cpu_avg_5m_millicores"] == pytest.approx(check["koordbus_cpu_avg_5m_millicores"], 0.05)
    assert check["koordbus_cpu_p95_5m_millicores"] is None  # cold start: under 150 s of samples in the window
    assert result["command"].startswith("python bench/compare_prometheus.py --nodes 6 --pods 5")
    assert not list(tmp_path.glob("koordbus-bench-*"))


def test_without_prometheus_it_says_how_to_install_it_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compare_prometheus, "PROMETHEUS", tmp_path / "no-prometheus")
    assert compare_prometheus.main(["--nodes", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "apt-get install -y prometheus" in captured.err


def test_rules_cover_every_resource_percentile_and_duration() -> None:
    rules = promsetup.recording_rules((300, 600, 1800), interval_seconds=60)
    (group,) = rules["groups"]
    assert group["interval"] == "60s"
    records = [r["record"] for r in group["rules"]]
    assert len(set(records)) == 24
    assert "node:koord_node_cpu_usage_cores:p90_10m" in records
    assert records[-1] == promsetup.last_rule((300, 600, 1800)) == "node:koord_node_memory_usage_bytes:p99_30m"
    exprs = {r["record"]: r["expr"] for r in group["rules"]}
    assert (
        exprs["node:koord_node_cpu_usage_cores:p95_5m"] == "quantile_over_time(0.95, koord_node_cpu_usage_cores[300s])"
    )
    assert promsetup.rule_name("x", "p50", 90) == "node:x:p50_90s"


def test_scrape_config_has_one_target_per_shard() -> None:
    config = promsetup.scrape_config(exporter_port=9999, nodes=5, nodes_per_target=2, rules_file="/r.json")
    (job,) = config["scrape_configs"]
    paths = [group["labels"]["__metrics_path__"] for group in job["static_configs"]]
    assert paths == ["/metrics/0", "/metrics/1", "/metrics/2"]
    assert config["global"]["scrape_interval"] == config["global"]["scrape_timeout"] == "1s"
    assert config["rule_files"] == ["/r.json"]
    assert promsetup.quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert promsetup.quantile([3.0, 1.0, 2.0, 4.0], 0.99) == 4.0
    assert promsetup.quantile([], 0.5) is None


def fetch(port: int, path: str) -> tuple[float, float, str]:
    before = time.time()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        text = response.read().decode()
    return before, time.time(), text


def test_exporter_serves_the_samples_the_load_generators_send() -> None:
    ctx = multiprocessing.get_context("spawn")
    config = node_exporter.ExporterConfig(
        port=nodemetric_ingest.free_port(), nodes=5, pods=4, interval=10.0, nodes_per_target=2, pool_size=3
    )
    scrapes, ready, stop = ctx.Value("d", 0.0), ctx.Event(), ctx.Event()
    process = ctx.Process(target=node_exporter.run_exporter, args=(config, scrapes, ready, stop))
    process.start()
    try:
        assert ready.wait(60)
        before, after, text = fetch(config.port, "/metrics/1")  # nodes 3 and 4 (indices 2 and 3)
        with pytest.raises(urllib.error.HTTPError) as missing:
            fetch(config.port, "/metrics/9")
        missing.value.close()
        assert missing.value.code == 404
        assert scrapes.value == 1
    finally:
        stop.set()
        process.join(20)
    assert process.exitcode == 0
    served = {
        (sample.name, sample.labels["node"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    names = simulated_node_names(5)
    assert {node for _, node in served} == {names[2], names[3]}
    pool = loadgen.TemplatePool(3, pods=4)  # the generators' pool: node i stands for template i mod 3
    candidates = []
    for at in {int(before), int(after)}:  # the request may straddle a second
        start = loadgen.aligned_window_start(at, 10.0)
        for index in (2, 3):
            samples = {
                int(t): (cpu, memory) for t, cpu, memory in pool.render(index % 3, start, start + 10).batch.node_samples
            }
            candidates.append((at, index, samples[at]))
    for index in (2, 3):
        cpu = served[("koord_node_cpu_usage_cores", names[index])]
        memory = served[("koord_node_memory_usage_bytes", names[index])]
        assert any(i == index and cpu == pytest.approx(c, rel=1e-5) and memory == m for _, i, (c, m) in candidates), (
            index,
            cpu,
            memory,
            candidates,
        )
