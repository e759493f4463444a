"""`koordbus up` runs the load-aware kube-scheduler extender (issue 27 point 2): its verbs answer over mutual TLS on
the port the banner names, with the client certificate `up` wrote to its data dir and to no client without one;
`koordbus scheduler explain`, run from the project directory with no flag, asks it; a bind is recorded as the
Binding the bridge would create; and the watermarks view shows the scheduler's stated watermarks."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.cluster import free_port
from tests.e2e.test_up import get_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
NODES = 3
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]},
}


def test_up_serves_the_extender_over_mutual_tls_and_explain_finds_it(tmp_path: Path) -> None:
    data = tmp_path / ".koordbus"  # as `make up` in a checkout: explain run from tmp_path finds it
    port = free_port()
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data), "--port", str(port), "--no-agent",
        "--extender-port", "0", "--simulate-nodes", str(NODES), "--simulate-pods", "5", "--simulate-backfill", "600",
    ]  # fmt: skip
    log = tmp_path / "up.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env={**os.environ, **_pythonpath()}
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C stops." not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        banner = log.read_text()
        found = re.search(r"  extender    (https://127\.0\.0\.1:(\d+))   \(", banner)
        assert found, banner
        url = found.group(1)
        assert (data / "extender-url").read_text().strip() == url
        assert re.search(r"try: curl --cacert \S+/extender-ca\.crt --cert \S+/extender-client\.crt", banner)
        assert "not running the admission webhook (`koordbus service webhook` answers a kube-apiserver" in banner
        token = (data / "api-token").read_text().strip()
        names: list[str] = []
        while len(names) < NODES:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            listed = get_json(f"{base}/api/v1/nodemetrics", token)
            names = [item["metadata"]["name"] for item in listed["items"]]  # type: ignore[attr-defined,index]
            time.sleep(0.5)

        trusted = ssl.create_default_context(cafile=str(data / "extender-ca.crt"))
        scheduler = ssl.create_default_context(cafile=str(data / "extender-ca.crt"))
        scheduler.load_cert_chain(str(data / "extender-client.crt"), str(data / "extender-client.key"))
        with httpx.Client(base_url=url, verify=scheduler, timeout=10) as client:
            filtered = client.post("/filter", json={"Pod": POD, "NodeNames": names}).json()
            assert filtered["NodeNames"] == names and filtered["Error"] == ""
            scores = client.post("/prioritize", json={"Pod": POD, "NodeNames": names}).json()
            assert [s["Host"] for s in scores] == names and all(0 <= s["Score"] <= 10 for s in scores)
            binding = {"PodName": "web", "PodNamespace": "default", "PodUID": "uid-web", "Node": names[0]}
            assert client.post("/bind", json=binding).json() == {"Error": ""}
        with pytest.raises(httpx.HTTPError), httpx.Client(base_url=url, verify=trusted, timeout=10) as stranger:
            stranger.post("/filter", json={"Pod": POD, "NodeNames": names})  # no client certificate: no handshake
        # the bind asked the bridge, which without a cluster records the Binding it would create
        recorded: dict[str, Any] = get_json(f"{base}/api/v1/k8s/recorded-writes", token)
        # (the simulated cluster's team pods are bound through the extender too: this test's pod is the one named web)
        web = [b for b in recorded["bindings"] if b["binding"]["metadata"]["name"] == "web"]
        assert [b["binding"]["target"]["name"] for b in web] == [names[0]]
        assert web[0]["binding"]["metadata"] == {
            "name": "web",
            "namespace": "default",
            "uid": "uid-web",
        }

        pod_file = tmp_path / "pod.json"
        pod_file.write_text(json.dumps(POD))
        env = {k: v for k, v in os.environ.items() if k != "KOORDBUS_LOADAWARE_URL"} | _pythonpath()
        explained = subprocess.run(
            [sys.executable, "-m", "koordbus.cli", "scheduler", "explain", "pod.json", names[1]],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        assert explained.stdout.startswith(f"pod default/web on node {names[1]}\n"), explained.stdout
        assert re.search(r"\n    cpu \d+% = \(usage \d+ \+ assigned \d+ \+ pod \d+\) / 32000 ", explained.stdout)

        # the scheduler states its watermarks: the view no longer shows defaults for it
        view: dict[str, Any] = get_json(f"{base}/api/v1/config/watermarks", token)
        assert view["scheduler"]["reported"] is True
        assert not [f for f in view["findings"] if f["code"] == "not-reported" and "scheduler" in f["message"]]
        state: dict[str, Any] = get_json(f"{base}/api/v1/scheduler/nodes/{names[0]}/state", token)
        assert state["node"]["metadata"]["name"] == names[0] and state["nodeMetric"]
        # the bound pod counts on its node at once (assumed until a pod watch would show it there)
        assert "web" in [p["pod"]["metadata"]["name"] for p in state["assignedPods"]]
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    output = log.read_text()
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output


def _pythonpath() -> dict[str, str]:
    """The checkout on the children's path: they run in tmp_path, where `-m koordbus.cli` would not find it."""
    root = str(Path(__file__).resolve().parents[2])
    return {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
