"""What the webhook's tests need: an RFC 6902 applier (add, remove, replace; independent of the diff), cluster
objects published exactly as the bridge publishes them (the observer's own `observed_message`), AdmissionReview v1
bodies as kube-apiserver sends them (and `ApiServerWebhook`, kube-apiserver calling a webhook for the fake API
server), and a `koordbus service webhook` process with its serving certificate. Used by the webhook's unit tests,
tests/integration/test_webhook_service.py and tests/integration/test_webhook_quotas.py."""

from __future__ import annotations

import copy
import json
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bus.api import Bus
from bus.cluster import free_port
from services.k8s import core
from services.k8s.observer import KIND_NAMESPACE, KIND_PRIORITY_CLASS, KIND_PROFILE, observed_message
from tests.fakes.kube_api import AdmissionAttributes
from tests.fakes.kube_rules import ApiError
from tests.faults.service_process import ServiceProcess
from tests.support.tls import Issued

_VERSIONS = iter(range(1000, 10**9))


async def publish_observed(bus: Bus, kind: str, obj: dict[str, Any] | None, *, name: str = "") -> None:
    """`obj` (None with `name`: its tombstone) on its subject with the observer's message and msg id."""
    name = name or obj["metadata"]["name"]  # type: ignore[index]
    seen = core.Seen(resource_version=str(next(_VERSIONS)), uid=f"uid-{name}")
    raw = None if obj is None else msgspec.json.encode(obj)
    change = core.Change(key=("", name), seen=seen, deleted=obj is None, raw=raw)
    subject, data, identity = observed_message(kind, change, observed_at=1.0)
    await bus.publish(subject, data, msg_id=identity)


def profile(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "config.koordinator.sh/v1alpha1",
        "kind": "ClusterColocationProfile",
        "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "7", "generation": 1},
        "spec": spec,
    }


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}, "spec": {}}


def priority_class(name: str, value: int, preemption_policy: str | None = "PreemptLowerPriority") -> dict[str, Any]:
    found: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
    found["value"] = value
    if preemption_policy is not None:
        found["preemptionPolicy"] = preemption_policy
    return found


KINDS = {"profile": KIND_PROFILE, "namespace": KIND_NAMESPACE, "priorityclass": KIND_PRIORITY_CLASS}


def job_pod(namespace_name: str = "", **labels: str) -> dict[str, Any]:
    """A Pod as the Job controller creates it (generateName, no name yet, ownerReferences, defaults applied)."""
    metadata: dict[str, Any] = {
        "generateName": "spark-pi-",
        "labels": {"job-name": "spark-pi", "batch.kubernetes.io/job-name": "spark-pi", **labels},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "spark-pi",
                "uid": "0d8e5c4e-0a7d-4c8b-9d3f-5a1e6f2b7c90",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if namespace_name:
        metadata["namespace"] = namespace_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {
            "volumes": [
                {"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
            ],
            "containers": [
                {
                    "name": "spark",
                    "image": "spark:3.5",
                    "resources": {
                        "limits": {"cpu": "2", "memory": "4Gi"},
                        "requests": {"cpu": "1500m", "memory": "4Gi"},
                    },
                    "volumeMounts": [{"name": "kube-api-access-x", "mountPath": "/var/run/secrets/x"}],
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


RESOURCES = {
    "pods": ("", "v1", "Pod"),
    "configmaps": ("", "v1", "ConfigMap"),
    "elasticquotas": ("scheduling.sigs.k8s.io", "v1alpha1", "ElasticQuota"),
}
"""resource → (group, version, kind) of the reviews these tests send."""
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
MIRROR_USER = "system:serviceaccount:koordbus:koordbus-koordbus-k8s"
"""The bridge's ServiceAccount as the chart names it (release koordbus in namespace koordbus)."""


def user_info(username: str) -> dict[str, Any]:
    """userInfo as kube-apiserver fills it in: a ServiceAccount's groups, or a kubectl user's."""
    if username.startswith("system:serviceaccount:"):
        namespace = username.split(":")[2]
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    else:
        groups = ["system:masters", "system:authenticated"]
    return {"username": username, "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, username)), "groups": groups}


def admission_review(
    resource: str,
    obj: Any,
    *,
    operation: str = "CREATE",
    namespace_name: str = "",
    name: str = "",
    old: Any = None,
    kind: str = "",
    user: str = JOB_CONTROLLER,
    dry_run: bool = False,
    sub_resource: str = "",
) -> dict[str, Any]:
    """An AdmissionReview v1 with every field kube-apiserver fills in."""
    group, version, resource_kind = RESOURCES[resource]
    gvk = {"group": group, "version": version, "kind": kind or resource_kind}
    gvr = {"group": group, "version": version, "resource": resource}
    options_kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[operation]
    request = {
        "uid": str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": name,
        "namespace": namespace_name,
        "operation": operation,
        "userInfo": user_info(user),
        "object": copy.deepcopy(obj),
        "oldObject": copy.deepcopy(old),
        "dryRun": dry_run,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def elastic_quota(
    name: str,
    *,
    namespace_name: str = "teams",
    min: dict[str, str] | None = None,
    max: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    stored: bool = False,
) -> dict[str, Any]:
    """An ElasticQuota as kubectl sends it (`stored`: as kube-apiserver holds it, with uid, resourceVersion,
    managedFields and kubectl's last-applied annotation)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace_name}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": metadata,
        "spec": {"min": dict(min or {"cpu": "4"}), "max": dict(max or {"cpu": "8"})},
    }
    if stored:
        applied = json.dumps(obj, separators=(",", ":"))
        metadata["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": applied, **(annotations or {})}
        metadata.update(
            uid=str(uuid.uuid5(uuid.NAMESPACE_OID, name)),
            resourceVersion="4711",
            generation=1,
            creationTimestamp="2026-11-01T10:00:00Z",
            managedFields=[{"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1"}],
        )
    return obj


class ApiServerWebhook:
    """kube-apiserver calling one validating webhook for the fake API server (FakeKubeApi.admission): the
    AdmissionReview of each write of `resources` POSTed over HTTPS trusting `trust` only; a refusal becomes the
    error kube-apiserver answers (`admission webhook "<name>" denied the request: <message>`, the webhook's code),
    a webhook that cannot be reached or answers no AdmissionReview is failurePolicy's business: Fail refuses with
    500 InternalError (`failed calling webhook`), Ignore lets the write through. `reviews` keeps every answer."""

    def __init__(
        self,
        url: str,
        trust: Path,
        *,
        name: str = "validate-elasticquotas.koordbus.io",
        resources: frozenset[str] = frozenset({"elasticquotas"}),
        failure_policy: str = "Fail",
        timeout_seconds: float = 10.0,
    ) -> None:
        self.url, self.name, self.resources, self.failure_policy = url, name, resources, failure_policy
        self._client = httpx.AsyncClient(verify=client_context(trust), timeout=timeout_seconds)
        self.reviews: list[tuple[dict[str, Any], dict[str, Any]]] = []
        """(request, response) of every review answered."""

    async def close(self) -> None:
        await self._client.aclose()

    async def __call__(self, attributes: AdmissionAttributes) -> None:
        if attributes.kind.plural not in self.resources:
            return
        review = admission_review(
            attributes.kind.plural,
            attributes.object,
            operation=attributes.operation,
            namespace_name=attributes.namespace,
            name=attributes.name,
            old=attributes.old_object,
        )
        review["request"]["userInfo"] = {"username": attributes.username, "groups": list(attributes.groups)}
        try:
            answer = await self._client.post(self.url, json=review)
            response = answer.json()["response"] if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            response, answer = None, err
        if response is None:
            if self.failure_policy == "Ignore":
                return
            raise ApiError(500, f'Internal error occurred: failed calling webhook "{self.name}": {answer}')
        self.reviews.append((review["request"], response))
        if not response["allowed"]:
            status = response.get("status") or {}
            message = f'admission webhook "{self.name}" denied the request: {status.get("message", "")}'
            raise ApiError(status.get("code") or 403, message, reason=status.get("reason") or None)


def client_context(trust: Path) -> ssl.SSLContext:
    """What kube-apiserver does with the webhook configuration's caBundle: trust that CA only."""
    return ssl.create_default_context(cafile=str(trust))


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    document = copy.deepcopy(document)
    for operation in operations:
        path = operation["path"]
        if path == "":
            assert operation["op"] == "replace"
            document = copy.deepcopy(operation["value"])
            continue
        *parents, last = [_unescape(t) for t in path.split("/")[1:]]
        target = document
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        op = operation["op"]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op == "add":
                assert 0 <= index <= len(target), operation
                target.insert(index, copy.deepcopy(operation["value"]))
            elif op == "remove":
                del target[index]
            else:
                target[index] = copy.deepcopy(operation["value"])
        elif op == "add":
            target[last] = copy.deepcopy(operation["value"])
        elif op == "remove":
            assert last in target, operation
            del target[last]
        else:
            assert last in target, operation  # replace needs the member to exist
            target[last] = copy.deepcopy(operation["value"])
    return document


class WebhookProcess(ServiceProcess):
    """`koordbus service webhook` with its serving certificate; `https_url` is its admission port."""

    def __init__(self, nats_url: str, serving: Issued, *, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.https_port = free_port()
        super().__init__(
            "webhook",
            "--nats-url",
            nats_url,
            log_dir=log_dir,
            env={
                "KOORDBUS_WEBHOOK_TLS_CERT_FILE": str(serving.cert),
                "KOORDBUS_WEBHOOK_TLS_KEY_FILE": str(serving.key),
                "KOORDBUS_WEBHOOK_PORT": str(self.https_port),
                **(env or {}),
            },
        )

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"
