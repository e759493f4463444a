"""`koordbus colocation-profile …` against a real API over HTTP (uvicorn on a free port, the profile routes over a
real nats-server): apply creates, finds unchanged and replaces; get lists and shows; delete; a bad profile's field,
a viewer's token and an unreachable API are clear errors with their exit codes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from bus.cluster import free_port
from koordbus import cli
from services.common import auth
from tests.integration.test_quota_cli import api_url
from tests.support import api_auth

__all__ = ["api_url"]  # the fixture: the quota stack, whose API serves the profile routes too

PROFILES_YAML = """\
apiVersion: config.koordinator.sh/v1alpha1
kind: ClusterColocationProfile
metadata: {name: batch-jobs}
spec:
  namespaceSelector: {matchLabels: {koordinator.sh/enable-colocation: "true"}}
  selector: {matchExpressions: [{key: job-name, operator: Exists}]}
  qosClass: BE
  priorityClassName: koord-batch
---
apiVersion: config.koordinator.sh/v1alpha1
kind: ClusterColocationProfile
metadata: {name: mid-web, labels: {team: web}}
spec: {selector: {matchLabels: {app: web}}, qosClass: LS, probability: "20%"}
"""


async def koordbus(
    capsys: pytest.CaptureFixture[str], url: str, *args: str, role: str = auth.ADMIN
) -> tuple[int, str, str]:
    argv = ["colocation-profile", "--api", url, "--token", api_auth.TOKENS[role], *args]
    code = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_apply_get_delete(api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES_YAML)
    code, out, err = await koordbus(capsys, api_url, "apply", "-f", str(path), "--dry-run")
    assert (code, err) == (0, ""), err
    assert "clustercolocationprofile/batch-jobs created (dry run)" in out
    code, out, _ = await koordbus(capsys, api_url, "get")
    assert code == 0 and "batch-jobs" not in out  # the dry run kept nothing

    code, out, err = await koordbus(capsys, api_url, "apply", "-f", str(path))
    assert (code, err) == (0, ""), err
    assert out.splitlines() == [
        "clustercolocationprofile/batch-jobs created",
        "clustercolocationprofile/mid-web created",
    ]
    code, out, _ = await koordbus(capsys, api_url, "apply", "-f", str(path))
    assert code == 0 and "clustercolocationprofile/batch-jobs unchanged" in out

    code, out, _ = await koordbus(capsys, api_url, "get")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "NAMESPACES", "PODS", "QOS", "PRIORITYCLASS", "PROBABILITY", "VERSION"]
    assert lines[1].startswith("batch-jobs") and "job-name Exists" in lines[1] and "BE" in lines[1]
    assert lines[2].startswith("mid-web") and "app=web" in lines[2] and "20%" in lines[2]
    code, out, _ = await koordbus(capsys, api_url, "get", "mid-web")
    assert yaml.safe_load(out)["metadata"]["labels"] == {"team": "web"}

    path.write_text(PROFILES_YAML.replace("qosClass: LS", "qosClass: LSR"))
    code, out, _ = await koordbus(capsys, api_url, "apply", "-f", str(path))
    assert code == 0 and "clustercolocationprofile/mid-web configured" in out
    code, out, _ = await koordbus(capsys, api_url, "get", "mid-web", "-o", "json")
    assert '"qosClass": "LSR"' in out

    path.write_text(PROFILES_YAML.replace("qosClass: BE", "qosClass: Batch"))
    code, _, err = await koordbus(capsys, api_url, "apply", "-f", str(path))
    assert code == 1 and "clustercolocationprofile/batch-jobs: spec.qosClass: must be one of" in err

    code, _, err = await koordbus(capsys, api_url, "delete", "mid-web", role=auth.VIEWER)
    assert code == 2 and "admin" in err
    code, out, err = await koordbus(capsys, api_url, "delete", "mid-web", "gone")
    assert (
        code == 1 and "clustercolocationprofile/mid-web deleted" in out and "no colocation profile named 'gone'" in err
    )
    code, _, err = await koordbus(capsys, f"http://127.0.0.1:{free_port()}", "get")
    assert code == 2 and "cannot reach the koordbus API" in err
