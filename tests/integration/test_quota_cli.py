"""`koordbus quota …` against a real API over HTTP (uvicorn on a free port, the quota service on a real nats-server,
SQLite projections): apply with parents first, unchanged detection, the tree table, get, check's exit code,
what-if, delete refusals, and clear errors for a wrong token, an unreachable API and a bad file."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from sqlalchemy.ext.asyncio import AsyncEngine

from bus.cluster import free_port
from koordbus import cli, http_serve
from services.common import auth
from tests.fakes.kube_api import FakeKubeApi
from tests.support import api_auth
from tests.support.quota_stack import quota_stack
from tests.support.waiting import eventually

QUOTAS_YAML = """\
apiVersion: v1
kind: List
items:
- apiVersion: scheduling.sigs.k8s.io/v1alpha1
  kind: ElasticQuota
  metadata:
    name: team-a
    namespace: teams
    labels: {quota.scheduling.koordinator.sh/parent: org}
  spec: {min: {cpu: "15"}, max: {cpu: "40"}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: org
  namespace: teams
  labels: {quota.scheduling.koordinator.sh/is-parent: "true"}
spec: {min: {cpu: "30"}, max: {cpu: "40"}}
"""

POD_YAML = """\
apiVersion: v1
kind: Pod
metadata: {name: big, namespace: apps, labels: {quota.scheduling.koordinator.sh/name: team-a}}
spec: {containers: [{name: c, resources: {requests: {cpu: "50"}}}]}
"""


@pytest_asyncio.fixture
async def api_url(tmp_path: Path, migrated_engine: AsyncEngine) -> AsyncIterator[str]:
    async with quota_stack(tmp_path, migrated_engine) as stack, contextlib.AsyncExitStack() as exits:
        port = free_port()
        await http_serve.serve_http(exits, stack.app, host="127.0.0.1", port=port)
        yield f"http://127.0.0.1:{port}"


async def koordbus(
    capsys: pytest.CaptureFixture[str], url: str, *args: str, role: str = auth.QUOTA_ADMIN
) -> tuple[int, str, str]:
    argv = ["quota", "--api", url, "--token", api_auth.TOKENS[role], *args]
    code = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_apply_tree_get_check_what_if_delete(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS_YAML)
    code, out, err = await koordbus(capsys, api_url, "apply", "-f", str(quotas))
    assert code == 0, err
    assert out.splitlines() == ["elasticquota/org created", "elasticquota/team-a created"]  # parent first

    async def projected() -> bool:
        code, _, _ = await koordbus(capsys, api_url, "get", "team-a")
        return code == 0

    await eventually(projected, timeout=15)
    code, out, _ = await koordbus(capsys, api_url, "apply", "-f", str(quotas))
    assert code == 0 and out.splitlines() == ["elasticquota/org unchanged", "elasticquota/team-a unchanged"]

    code, out, _ = await koordbus(capsys, api_url, "tree")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("tree default: total cpu=40")
    assert lines[1].split()[:2] == ["QUOTA", "PODS"]
    names = [line.split()[0] for line in lines[2:]]
    assert names[0] == "koordinator-root-quota" and names.index("team-a") == names.index("org") + 1
    assert any(line.startswith("    team-a ") for line in lines)  # indented under org
    code, out, _ = await koordbus(capsys, api_url, "tree", "-o", "json")
    assert code == 0 and '"tree": "default"' in out

    code, out, _ = await koordbus(capsys, api_url, "get", "team-a")
    assert code == 0 and "name: team-a" in out and "quota.scheduling.koordinator.sh/runtime" in out
    code, out, _ = await koordbus(capsys, api_url, "get")
    assert code == 0 and out.splitlines()[0].split() == ["NAME", "PARENT", "MIN", "MAX", "RUNTIME", "USED"]

    pod = tmp_path / "pod.yaml"
    pod.write_text(POD_YAML)
    code, out, _ = await koordbus(capsys, api_url, "check", "-f", str(pod), role=auth.VIEWER)
    assert code == 1 and "apps/big" in out and "NO" in out and "exceeds runtime 40" in out

    code, out, _ = await koordbus(capsys, api_url, "what-if", "--min", "team-a:cpu=20")
    assert code == 0 and "team-a" in out and "min" in out and "cpu=20" in out
    code, out, _ = await koordbus(capsys, api_url, "what-if", "--min", "team-a:cpu=31")
    assert code == 1 and "REJECTED: quota team-a: " in out

    code, _, err = await koordbus(capsys, api_url, "delete", "org")
    assert code == 1 and "has children (team-a)" in err
    code, out, err = await koordbus(capsys, api_url, "delete", "team-a")
    assert code == 0 and out.strip() == "elasticquota/team-a deleted"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_errors_are_clear(api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS_YAML)
    code, _, err = await koordbus(capsys, api_url, "apply", "-f", str(quotas), role=auth.VIEWER)
    assert code == 2 and "role quota-admin needed" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ElasticQuota\nmetadata: {name: x}\nspec: {min: {cpu: 50}, max: {cpu: 40}}\n")
    code, _, err = await koordbus(capsys, api_url, "apply", "-f", str(bad))
    assert code == 1 and "elasticquota/x: quota x: spec.min.cpu 50 exceeds spec.max.cpu 40" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    code, _, err = await koordbus(capsys, api_url, "apply", "-f", str(broken))
    assert code == 2 and "is not valid YAML or JSON" in err
    code, _, err = await koordbus(capsys, f"http://127.0.0.1:{free_port()}", "tree")
    assert code == 2 and "cannot reach the koordbus API" in err


IMPORT_YAML = """\
apiVersion: v1
kind: List
items:
- kind: ElasticQuota
  metadata: {name: dev, namespace: teams, labels: {quota.scheduling.koordinator.sh/parent: eng},
             resourceVersion: "77", uid: 0f0f}
  spec: {min: {cpu: "10"}, max: {cpu: "40"}}
  status: {used: {cpu: "2"}}
- kind: ElasticQuota
  metadata: {name: ops, namespace: teams, labels: {quota.scheduling.koordinator.sh/parent: eng}}
  spec: {min: {cpu: "25"}, max: {cpu: "40"}}
- kind: ElasticQuota
  metadata: {name: eng, namespace: teams, labels: {quota.scheduling.koordinator.sh/is-parent: "true"}}
  spec: {min: {cpu: "30"}, max: {cpu: "40"}}
"""


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_import_refuses_an_invalid_tree_then_adopts_a_valid_one(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = tmp_path / "export.yaml"
    exported.write_text(IMPORT_YAML)
    code, out, err = await koordbus(capsys, api_url, "import", "-f", str(exported))
    assert code == 1 and "import refused, nothing was changed" in err
    assert "min-sum" in err or "exceeds" in err  # dev 10 + ops 25 > eng 30
    code, out, _ = await koordbus(capsys, api_url, "tree")
    assert " eng " not in out  # nothing appended

    exported.write_text(IMPORT_YAML.replace('min: {cpu: "25"}', 'min: {cpu: "20"}'))
    code, out, err = await koordbus(capsys, api_url, "import", "-f", str(exported), "--dry-run")
    assert code == 0 and "would change 3" in out, err
    code, out, err = await koordbus(capsys, api_url, "import", "-f", str(exported))
    assert code == 0 and "imported 3, unchanged 0" in out, err
    assert out.splitlines()[1:] == ["  elasticquota/eng", "  elasticquota/dev", "  elasticquota/ops"]
    code, out, err = await koordbus(capsys, api_url, "import", "-f", str(exported))
    assert code == 0 and "imported 0, unchanged 3" in out, err

    async def dev_is_projected_at_the_import_sequence() -> bool:
        code, out, _ = await koordbus(capsys, api_url, "get", "dev", "-o", "json")
        return code == 0 and '"resourceVersion": "1"' in out

    await eventually(dev_is_projected_at_the_import_sequence, timeout=15)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_import_reads_a_cluster(
    api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], kube_api: FakeKubeApi
) -> None:
    for item in yaml.safe_load(IMPORT_YAML.replace('min: {cpu: "25"}', 'min: {cpu: "20"}'))["items"]:
        kube_api.put("ElasticQuota", {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", **item})
    kubeconfig = kube_api.kubeconfig(tmp_path / "kubeconfig")
    code, out, err = await koordbus(capsys, api_url, "import", "--kubeconfig", str(kubeconfig))
    assert code == 0 and "3 ElasticQuotas read from the cluster" in out and "imported 3" in out, err
    code, _, err = await koordbus(capsys, api_url, "import", "--kubeconfig", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err
