"""The agent's lean HTTP side over real sockets: agent.port.AgentPort (/healthz, /readyz, /metrics, errors, clients
that misbehave) and agent.pods.KubeletPods against a small server that records what it was asked."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from agent.pods import KubeletPods, PodListError
from agent.port import AgentPort
from tests.support.tls import CertificateAuthority

POD_LIST = {
    "kind": "PodList",
    "items": [{"metadata": {"name": "web", "namespace": "shop", "uid": "0b6a3c1e-5f2d-4c8a-9e7b-1d2f3a4b5c6d"}}],
}


@pytest.fixture
async def port_with_checks() -> AsyncIterator[tuple[AgentPort, int, dict[str, Callable[[], object]]]]:
    registry = CollectorRegistry()
    Counter("koordbus_agent_test_things", "things", registry=registry).inc(3)
    behaviour: dict[str, Callable[[], object]] = {"bus": lambda: None}

    async def bus() -> str | None:
        outcome = behaviour["bus"]()
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome == "hang":
            await asyncio.sleep(60)
        return outcome if isinstance(outcome, str) else None

    port = AgentPort(registry, readiness=(("bus", bus),), timeout=0.3)
    number = await port.start("127.0.0.1", 0)
    yield port, number, behaviour
    await port.stop()


async def test_health_metrics_and_readiness_answers(
    port_with_checks: tuple[AgentPort, int, dict[str, Callable[[], object]]],
) -> None:
    _, number, behaviour = port_with_checks
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{number}") as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        metrics = await http.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "koordbus_agent_test_things_total 3.0" in metrics.text
        assert (await http.get("/readyz")).json() == {"status": "ready", "checked": ["bus"]}
        behaviour["bus"] = lambda: ConnectionRefusedError("nats: no servers available")
        failing = await http.get("/readyz")
        assert failing.status_code == 503
        assert failing.json()["failures"] == {"bus": "ConnectionRefusedError: nats: no servers available"}
        behaviour["bus"] = lambda: "hang"  # a hung dependency must not hang the probe
        hung = await http.get("/readyz")
        assert hung.status_code == 503 and hung.json()["error"] == "not ready: bus (no answer within 0.3 s)"
        missing = await http.get("/nope?x=1")
        assert missing.status_code == 404 and "try /healthz" in missing.json()["error"]
        assert (await http.post("/metrics")).status_code == 405
        head = await http.head("/healthz")
        assert head.status_code == 200 and head.content == b""


async def test_a_client_that_sends_garbage_or_nothing_costs_nothing(
    port_with_checks: tuple[AgentPort, int, dict[str, Callable[[], object]]],
) -> None:
    _, number, _ = port_with_checks
    reader, writer = await asyncio.open_connection("127.0.0.1", number)
    writer.write(b"x" * 9000)  # no end of head within the 8 KiB limit: dropped
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()
    reader, writer = await asyncio.open_connection("127.0.0.1", number)
    writer.close()  # gone before saying anything
    await writer.wait_closed()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{number}") as http:
        assert (await http.get("/healthz")).status_code == 200  # still serving


class Kubelet:
    """Answers every request with `status` and `body`, keeping each request head."""

    def __init__(self, status: int, body: bytes, *, tls: ssl.SSLContext | None = None) -> None:
        self.status, self.body, self.heads = status, body, list[str]()
        self.server: asyncio.Server | None = None
        self.tls = tls

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0, ssl=self.tls)
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/pods"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.append((await reader.readuntil(b"\r\n\r\n")).decode())
        writer.write(
            f"HTTP/1.1 {self.status} X\r\nContent-Length: {len(self.body)}\r\nConnection: close\r\n\r\n".encode()
            + self.body
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()


async def test_kubelet_pods_sends_the_current_token_and_parses_a_changed_list_only(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    kubelet = Kubelet(200, json.dumps(POD_LIST).encode())
    async with kubelet as url:
        pods = KubeletPods(url, token_file=str(token))
        listed = await pods.list()
        token.write_text("rotated\n")
        assert await pods.list() is listed  # the same answer is not parsed again
        kubelet.body = json.dumps({**POD_LIST, "items": []}).encode()
        changed = await pods.list()
        await pods.close()
    assert [p.pod.metadata.name for p in listed.pods] == ["web"] and changed.pods == []
    assert "Authorization: Bearer first" in kubelet.heads[0]
    assert "Authorization: Bearer rotated" in kubelet.heads[1]


async def test_kubelet_pods_errors_name_the_status_and_the_url() -> None:
    async with Kubelet(401, b"Unauthorized") as url:
        with pytest.raises(PodListError, match=r"answered 401 for http://127\.0\.0\.1:\d+/pods: b'Unauthorized'"):
            await KubeletPods(url).list()
    async with Kubelet(200, b"<html>not a pod list</html>") as url:
        with pytest.raises(PodListError, match="not JSON"):
            await KubeletPods(url).list()


async def test_kubelet_pods_on_the_secure_port_trust_only_the_kubelets_ca_or_an_explicit_insecure(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority.create(tmp_path, "kubelet")
    serving = ca.issue("kubelet-serving", server=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(serving.cert, serving.key)
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    kubelet = Kubelet(200, json.dumps(POD_LIST).encode(), tls=tls)
    async with kubelet as url:
        with pytest.raises(PodListError, match=r"certificate at https://127\.0\.0\.1:\d+/pods is not trusted.*"
                           r"--kubelet-ca-file.*--kubelet-insecure"):  # fmt: skip
            await KubeletPods(url, token_file=str(token)).list()
        verified = await KubeletPods(url, token_file=str(token), ca_file=str(ca.cert)).list()
        unverified = await KubeletPods(url, insecure=True).list()
    assert [p.pod.metadata.name for p in verified.pods] == [p.pod.metadata.name for p in unverified.pods] == ["web"]
    assert "Authorization: Bearer sa-token" in kubelet.heads[0]


async def test_kubelet_pods_errors_name_the_url_and_what_answered(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/pods"
    with pytest.raises(PodListError, match=rf"cannot reach the kubelet at {closed}: .*refused"):
        await KubeletPods(closed).list()
    async with Kubelet(200, json.dumps(POD_LIST).encode()) as url:
        with pytest.raises(PodListError, match=rf"cannot read the kubelet token file for {url}: .*No such file"):
            await KubeletPods(url, token_file=str(tmp_path / "missing-token")).list()
    async with Kubelet(200, b'{"kind": "Status"}') as url:
        with pytest.raises(PodListError, match=rf"^{url}: the kubelet's answer has no items list"):
            await KubeletPods(url).list()
    with pytest.raises(PodListError, match=r"cannot load the kubelet CA file '.*missing-ca' for https://n:10250/pods"):
        KubeletPods("https://n:10250/pods", ca_file=str(tmp_path / "missing-ca"))
