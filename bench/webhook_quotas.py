"""The ElasticQuota half of bench/webhook.py (`--quotas`): the quota service it asks, the quotas it starts from and
the AdmissionReviews of the load.

`quota_service(...)` runs `koordbus service quota` (SQLite projections in the work directory) pinned with the
webhook: the validation's latency is the webhook's and the quota service's together. `create_reviews` are the
kubectl-shaped CREATEs of a parent quota `org` and Q team quotas under it, sent before the load (each must be
allowed, so the tree exists in the log); `update_reviews` are the load: kubectl-shaped UPDATEs of the teams in turn,
each old object as the mirror leaves it in the cluster (koordbus's labels and shared-weight, koord-scheduler's
write-back annotations, status.used, kubectl's last-applied configuration and managedFields) and each new one
changing spec.max.cpu, so every request is a change the quota service validates against the tree and appends
(PatchQuota) before the webhook answers.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from bench import processes

NAMESPACE = "teams"
USER = "alice"
MAX_CPU = (8, 64)
"""Each team's spec.max.cpu cycles within these bounds (min stays 1: every change is valid)."""


@contextlib.contextmanager
def quota_service(nats_url: str, workdir: Path, *, port: int, cpu: int) -> Iterator[subprocess.Popen[bytes]]:
    """`koordbus service quota` on `nats_url`, its projections in SQLite under `workdir`, pinned to `cpu`."""
    arguments = ["quota", "--nats-url", nats_url, "--port", str(port)]
    arguments += ["--database-url", f"sqlite:///{workdir / 'quota.db'}"]
    with processes.pinned_service(arguments, cpu=cpu, log_path=workdir / "quota.log") as service:
        yield service


def _quota(name: str, *, labels: dict[str, str], min_cpu: int, max_cpu: int) -> dict[str, Any]:
    """min memory 1 GiB per core of min, max 8 GiB per core of max."""
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "min": {"cpu": str(min_cpu), "memory": f"{min_cpu}Gi"},
            "max": {"cpu": str(max_cpu), "memory": f"{8 * max_cpu}Gi"},
        },
    }


def _team(index: int) -> str:
    return f"team-{index:04d}"


def _stored(obj: dict[str, Any], version: int) -> dict[str, Any]:
    """`obj` as the cluster holds it once the mirror wrote it."""
    stored: dict[str, Any] = json.loads(json.dumps(obj))
    meta = stored["metadata"]
    meta["labels"] = {**meta["labels"], "quota.scheduling.koordinator.sh/parent": "org"}
    meta["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj, separators=(",", ":")),
        "quota.scheduling.koordinator.sh/shared-weight": json.dumps(obj["spec"]["max"], separators=(",", ":")),
        "quota.scheduling.koordinator.sh/runtime": '{"cpu":"4","memory":"8Gi"}',
        "quota.scheduling.koordinator.sh/request": '{"cpu":"6","memory":"12Gi"}',
        "quota.scheduling.koordinator.sh/child-request": '{"cpu":"6","memory":"12Gi"}',
        "quota.scheduling.koordinator.sh/guaranteed": "{}",
        "quota.scheduling.koordinator.sh/allocated": "{}",
        "quota.scheduling.koordinator.sh/non-preemptible-request": "{}",
        "quota.scheduling.koordinator.sh/non-preemptible-used": "{}",
    }
    meta.update(
        uid=str(uuid.uuid5(uuid.NAMESPACE_OID, meta["name"])),
        resourceVersion=str(version),
        generation=1,
        creationTimestamp="2026-11-01T10:00:00Z",
        managedFields=[
            {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1"},
            {"manager": "koordbus", "operation": "Update", "apiVersion": "v1"},
        ],
    )
    stored["status"] = {"used": {"cpu": "3", "memory": "6Gi"}}
    return stored


def _review(operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> tuple[bytes, str]:
    uid = str(uuid.uuid4())
    gvk = {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"}
    gvr = {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"}
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}[operation]
    review = {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": obj["metadata"]["name"],
            "namespace": NAMESPACE,
            "operation": operation,
            "userInfo": {"username": USER, "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
        },
    }
    return msgspec.json.encode(review), uid


def create_reviews(teams: int) -> list[tuple[bytes, str]]:
    """The parent (its min the sum of the teams') and the teams, to be sent one after the other."""
    org = _quota("org", labels={"quota.scheduling.koordinator.sh/is-parent": "true"}, min_cpu=teams, max_cpu=teams * 64)
    reviews = [_review("CREATE", org, None)]
    for index in range(teams):
        team = _quota(
            _team(index), labels={"quota.scheduling.koordinator.sh/parent": "org"}, min_cpu=1, max_cpu=MAX_CPU[0]
        )
        reviews.append(_review("CREATE", team, None))
    return reviews


def update_reviews(teams: int, count: int) -> list[tuple[bytes, str]]:
    """`count` UPDATEs, the teams in turn, each raising (then wrapping) its spec.max.cpu by one."""
    current = {index: MAX_CPU[0] for index in range(teams)}
    reviews = []
    for number in range(count):
        index = number % teams
        low, high = MAX_CPU
        before, after = current[index], low + (current[index] - low + 1) % (high - low)
        current[index] = after
        labels = {"quota.scheduling.koordinator.sh/parent": "org"}
        old = _stored(_quota(_team(index), labels=labels, min_cpu=1, max_cpu=before), 1000 + number)
        new = json.loads(json.dumps(old))
        new["spec"]["max"]["cpu"] = str(after)
        reviews.append(_review("UPDATE", new, old))
    return reviews
