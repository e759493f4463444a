"""bench/soak.py at toy size: a real `koordbus up` with 20 simulated nodes, subscribers and quota traffic for 40 s;
one JSON line with the documented keys and sane figures, nothing left running or on disk afterwards."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "soak.py"
DOCUMENTED_KEYS = {
    "bench", "nodes", "duration_s", "warmup_s", "samples", "rss_start_mb", "rss_after_warmup_mb", "rss_end_mb",
    "rss_peak_mb", "rss_growth_percent_after_warmup", "rss_slope_percent_per_hour", "processes", "consumer_lag_max",
    "consumer_lag_max_during_warmup", "consumer_lag_settled_s", "consumers_watched", "error_log_lines",
    "error_log_first", "http_5xx", "http_5xx_by_route", "requests_total", "request_p99_s", "dead_letters",
    "data_dir_mb_end", "data_dir_growth_mb_per_hour", "subscribers", "up_exit_code", "leftover_processes",
    "target_held", "target_misses", "command",
}  # fmt: skip
PROCESS_KEYS = {"rss_start_mb", "rss_after_warmup_mb", "rss_end_mb", "rss_peak_mb", "rss_growth_percent_after_warmup",
                "rss_slope_percent_per_hour", "cpu_cores"}  # fmt: skip


@pytest.mark.timeout(300)
def test_prints_one_json_line_with_sane_figures(tmp_path: Path) -> None:
    command = [sys.executable, str(SCRIPT), "--nodes", "20", "--duration", "40s", "--warmup", "10s"]
    command += ["--sample-interval", "2s", "--write-interval", "4s"]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=280, env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert result.keys() >= DOCUMENTED_KEYS
    assert (result["bench"], result["nodes"], result["warmup_s"]) == ("soak", 20, 10.0)
    # samples every 2 s at a fixed rate; on a busy machine a slow /metrics scrape may take a slot or two
    assert 40 <= result["duration_s"] < 60 and result["samples"] >= 10
    # koordbus up and its nats-server, each measured on its own, and the sum of both
    assert set(result["processes"]) == {"koordbus-up", "nats-server"}
    for figures in result["processes"].values():
        assert figures.keys() == PROCESS_KEYS
        assert 0 < figures["rss_start_mb"] <= figures["rss_peak_mb"] and figures["rss_end_mb"] <= figures["rss_peak_mb"]
    up, nats = result["processes"]["koordbus-up"], result["processes"]["nats-server"]
    assert up["rss_end_mb"] > 60 and up["cpu_cores"] > 0
    assert result["rss_end_mb"] == pytest.approx(up["rss_end_mb"] + nats["rss_end_mb"], abs=1.0)
    # the lag of every service's consumers is read off /metrics
    assert result["consumers_watched"] >= 5 and result["consumer_lag_max"] >= 0
    assert result["consumer_lag_settled_s"] is not None  # 20 nodes: no lasting backlog
    # every request of the traffic answered: quota writes and what-ifs succeed, nothing is a 5xx or refused (a round
    # every 4 s, or slower when its 15 requests take longer on a busy machine: at least two rounds in 40 s)
    assert result["requests_total"] >= 30 and result["quota_writes"] >= 4 and result["what_ifs"] >= 2
    assert result["http_5xx"] == 0 and result["http_4xx_first"] == [] and result["request_failures"] == 0
    assert 0 < result["request_p50_s"] <= result["request_p99_s"] <= result["request_max_s"] < 60
    assert result["error_log_lines"] == 0, result["error_log_first"]
    assert result["dead_letters"] == 0
    assert result["data_dir_mb_end"] > 1 and "KOORD_NODE" in result["data_dir_largest_mb"]
    subscribers = result["subscribers"]
    assert len(subscribers) == 5 and [s["path"].split("?")[0] for s in subscribers].count("/api/v1/events/ws") == 1
    assert all(s["events"] > 0 and s["drops"] == 0 for s in subscribers)  # each filter saw its events
    assert result["up_exit_code"] == 0 and result["leftover_processes"] == []
    assert result["target_held"] == (result["target_misses"] == [])
    assert result["command"].startswith("python bench/soak.py --duration 40s --warmup 10s --nodes 20")
    # nothing left: up's API port and nats-server closed, the temporary directory removed
    port = re.search(r"on port (\d+)", run.stderr)
    assert port, run.stderr
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(port.group(1))), timeout=1):
        pass
    assert list(tmp_path.iterdir()) == []
