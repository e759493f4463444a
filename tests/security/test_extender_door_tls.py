"""Issue #19 point 5: `koordbus service loadaware` with a serving certificate and a client CA (the Helm chart's
loadaware.tls) serves the scheduling verbs over HTTPS only to clients whose certificate that CA signed, as
kube-scheduler presents one with `enableHTTPS: true` and `tlsConfig: {certFile, keyFile, caFile}`: no certificate
or one from another CA is refused in the handshake; the plain port keeps health and metrics and no verb."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx
import pytest

from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from schemas.cluster import NodeObserved
from tests.faults.service_process import ServiceProcess
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, pod_json, report
from tests.support.tls import CertificateAuthority, Issued
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


def client_context(trust: Path, identity: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(trust))
    if identity is not None:
        context.load_cert_chain(str(identity.cert), str(identity.key))
    return context


async def test_only_a_client_certificate_from_the_configured_ca_reaches_the_verbs(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, tmp_path: Path
) -> None:
    cluster_ca = CertificateAuthority.create(tmp_path, "cluster")
    serving = cluster_ca.issue("extender", server=True)
    scheduler = cluster_ca.issue("kube-scheduler", server=False)
    stranger = CertificateAuthority.create(tmp_path, "stranger").issue("stranger", server=False)
    now = time.time()
    await publish_events(
        koordbus_bus,
        NodeObserved(name="n-a", observed_at=now, node=node("n-a")),
        report("n-a", at=now, cpu=1000, memory=GI),
    )
    port = free_port()
    service = ServiceProcess(
        "loadaware",
        "--nats-url",
        koordbus_nats_url,
        log_dir=tmp_path,
        env={
            "KOORDBUS_TLS_CERT_FILE": str(serving.cert),
            "KOORDBUS_TLS_KEY_FILE": str(serving.key),
            "KOORDBUS_TLS_CLIENT_CA_FILE": str(cluster_ca.cert),
            "KOORDBUS_EXTENDER_PORT": str(port),
        },
    )
    service.start()
    try:
        async with httpx.AsyncClient(timeout=10) as plain:
            await eventually(lambda: _ready(service, plain), timeout=30)
            # the plain port: probes and metrics, no verb
            assert (await plain.get(f"{service.base_url}/healthz")).status_code == 200
            body = {"Pod": pod_json("web", cpu="1"), "NodeNames": ["n-a"]}
            for verb in ("filter", "prioritize", "assume", "bind"):
                assert (await plain.post(f"{service.base_url}/{verb}", json=body)).status_code == 404, verb
        url = f"https://127.0.0.1:{port}/filter"
        for who, identity in (("no certificate", None), ("another CA's certificate", stranger)):
            async with httpx.AsyncClient(verify=client_context(cluster_ca.cert, identity), timeout=10) as client:
                with pytest.raises(httpx.TransportError):
                    await client.post(url, json=body)
                    pytest.fail(f"a client with {who} was served")
        async with httpx.AsyncClient(verify=client_context(cluster_ca.cert, scheduler), timeout=10) as client:
            response = await client.post(url, json=body)
        assert response.status_code == 200, service.describe()
        assert response.json()["NodeNames"] == ["n-a"]
    finally:
        await service.stop()


async def _ready(service: ServiceProcess, client: httpx.AsyncClient) -> bool:
    assert service.running, service.describe()
    return (await service.readyz(client))[0] == 200
