"""The node's pods as its kubelet lists them (GET /pods, a PodList), for the QoS loops: what koordlet reads too.

`parse_pod_list` is pure: each item becomes an agent.actuate.NodePod (the object as kube.Pod, plus each running
container's runtime and ID from status.containerStatuses, e.g. `containerd://<id>`); an item that does not decode
is skipped and counted, and so is one whose uid is not a pod UID or whose status.qosClass is none of Kubernetes'
(its cgroup directory cannot be named), with the reason in `refused`; a container ID that is not one (schemas.names)
is left out, as a container not running yet.

`KubeletPods` fetches the list the way koordlet does on a real node, and the agent never talks to the API server:
the kubelet's secure port (https://<node>:10250/pods) with a bearer token file (the pod's service account token,
which the kubelet checks with a TokenReview; the agent's role needs nodes/proxy or nodes/pods get), verifying the
kubelet's serving certificate with its CA file (or, explicitly, not at all: kubelets serve self-signed certificates
by default), or the read-only port (http://<node>:10255/pods) where a cluster still opens it. Every failure is a
PodListError naming the URL and what answered (a status, a TLS or connection error, a body that is no PodList).
One GET a round with the standard library's client in a worker thread: an async HTTP client library would be most
of the agent's memory for one request a second.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Final, Protocol

import msgspec

from agent.actuate import NodePod
from schemas import kube, names, vocab

KUBE_QOS_CLASSES: Final = frozenset(
    {"", vocab.KUBE_QOS_GUARANTEED, vocab.KUBE_QOS_BURSTABLE, vocab.KUBE_QOS_BESTEFFORT}
)


class ContainerStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    container_id: str = msgspec.field(default="", name="containerID")


class _Status(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    container_statuses: list[ContainerStatus] | None = None
    init_container_statuses: list[ContainerStatus] | None = None


class _Item(msgspec.Struct, frozen=True, kw_only=True):
    status: _Status = _Status()


class PodListError(Exception):
    """The kubelet's answer is not a PodList."""


@dataclass(frozen=True)
class PodList:
    pods: list[NodePod]
    unreadable: int
    """Items skipped because they did not decode as a pod."""
    refused: list[str] = field(default_factory=list)
    """Items skipped because a name or class of theirs cannot become a cgroup path: one reason each."""


def parse_pod_list(data: bytes) -> PodList:
    try:
        document = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise PodListError(f"the kubelet's pod list is not JSON: {e}") from None
    items = document.get("items") if isinstance(document, dict) else None
    if not isinstance(items, list):
        raise PodListError("the kubelet's answer has no items list (is the URL the kubelet's /pods?)")
    pods: list[NodePod] = []
    unreadable = 0
    refused: list[str] = []
    for item in items:
        try:
            pod = msgspec.convert(item, kube.Pod)
            status = msgspec.convert(item, _Item).status
        except (msgspec.ValidationError, ValueError):
            unreadable += 1
            continue
        meta = pod.metadata
        if not names.is_pod_uid(meta.uid):
            refused.append(
                f"pod {names.shown(meta.namespace)}/{names.shown(meta.name)}: uid {names.shown(meta.uid)} "
                "is not a pod UID"
            )
            continue
        if pod.status.qos_class not in KUBE_QOS_CLASSES:
            refused.append(
                f"pod {names.shown(meta.namespace)}/{names.shown(meta.name)}: status.qosClass "
                f"{names.shown(pod.status.qos_class)} is none of Guaranteed, Burstable, BestEffort"
            )
            continue
        containers: dict[str, tuple[str, str]] = {}
        for cs in (*(status.init_container_statuses or ()), *(status.container_statuses or ())):
            runtime, sep, container_id = cs.container_id.partition("://")
            if sep and names.is_container_id(container_id):
                containers[cs.name] = (runtime, container_id)
        pods.append(NodePod(pod=pod, containers=containers))
    return PodList(pods=pods, unreadable=unreadable, refused=refused)


class PodSource(Protocol):
    """Where the agent's two halves read the node's pods: KubeletPods, or a test's list."""

    async def list(self) -> PodList: ...


class KubeletPods:
    """GET <url> (the kubelet's /pods) with an optional bearer token; `ca_file` verifies the kubelet's certificate
    with that CA instead of the system's, `insecure` skips TLS verification."""

    def __init__(
        self, url: str, *, token_file: str = "", ca_file: str = "", insecure: bool = False, timeout: float = 5.0
    ) -> None:
        self.url = url
        self._token_file = token_file
        try:
            context = ssl.create_default_context(cafile=ca_file or None)
        except (OSError, ssl.SSLError) as e:
            raise PodListError(f"cannot load the kubelet CA file {ca_file!r} for {url}: {e}") from None
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        # no proxy from the environment: the kubelet is on this node
        self._open = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        ).open
        self._timeout = timeout
        self._last: tuple[bytes, PodList] | None = None

    async def list(self) -> PodList:
        """The pods; an answer byte for byte like the last one is not parsed again (the list changes when a pod's
        status does: decoding 200 pods every round was a third of the agent's CPU)."""
        body = await asyncio.to_thread(self._get)
        if self._last is None or self._last[0] != body:
            try:
                self._last = (body, parse_pod_list(body))
            except PodListError as e:
                raise PodListError(f"{self.url}: {e}") from None
        return self._last[1]

    def _get(self) -> bytes:
        headers = {"Accept": "application/json"}
        if self._token_file:
            try:  # re-read every time: projected tokens rotate
                headers["Authorization"] = f"Bearer {_read_token(self._token_file)}"
            except OSError as e:
                raise PodListError(f"cannot read the kubelet token file for {self.url}: {e}") from None
        request = urllib.request.Request(self.url, headers=headers)
        try:
            with self._open(request, timeout=self._timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as e:
            with e:
                body = e.read()
            raise PodListError(f"the kubelet answered {e.code} for {self.url}: {body[:200]!r}") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLCertVerificationError):
                raise PodListError(
                    f"the kubelet's certificate at {self.url} is not trusted ({e.reason.verify_message}): give its "
                    "CA (--kubelet-ca-file) or skip verification explicitly (--kubelet-insecure)"
                ) from None
            raise PodListError(f"cannot reach the kubelet at {self.url}: {e.reason}") from None
        except (TimeoutError, OSError) as e:  # a timeout or reset after the connection was made
            raise PodListError(f"no complete answer from the kubelet at {self.url}: {e!r}") from None

    async def close(self) -> None:
        """Nothing stays open between requests; kept so callers can close any pod source alike."""


def _read_token(path: str) -> str:
    with open(path) as f:
        return f.read().strip()
