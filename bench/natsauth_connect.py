"""NATS auth callout latency: what a connect costs when `koordbus service natsauth` answers it.

Run as `python bench/natsauth_connect.py [--connects N]` from the repository root. It starts a nats-server
configured as the Helm chart configures it (bus.auth.render_callout_authorization: accounts AUTH and KOORD, the
callout for everyone but the service users), the callout service in this process (services.natsauth, the real
TokenReview client against the fake Kubernetes API server of the tests, over loopback HTTP), and times N connects
one after the other, each a fresh client sending CONNECT + PING and waiting for PONG: once as an agent with a
pod-bound token (the callout decides: request JWT decoded, TokenReview, user JWT signed, server registers the
user), once as a service user the server checks itself. Exactly one JSON line goes to stdout: p50/p99/mean of
both and the difference, the callout's cost per connect. A real API server's TokenReview adds its own round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bus import auth, nkeys  # noqa: E402
from bus.jetstream import JetStreamBus  # noqa: E402
from bus.server import EmbeddedNatsServer  # noqa: E402
from services.common.metrics import new_registry  # noqa: E402
from services.k8s.client import api_client  # noqa: E402
from services.k8s.settings import K8sSettings  # noqa: E402
from services.k8s.token_review import KubeTokenReviewer  # noqa: E402
from services.natsauth.service import NatsAuthService  # noqa: E402
from services.natsauth.settings import NatsAuthSettings  # noqa: E402
from tests.fakes.kube_api import FakeKubeApi  # noqa: E402

AUDIENCE = "koordbus-nats"


async def connect_once(url: str, options: dict[str, str]) -> float:
    """Seconds from opening a connection to the server's PONG after CONNECT (authentication included)."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()  # INFO
        connect = json.dumps({"verbose": False, "pedantic": False, "name": "bench", **options})
        writer.write(f"CONNECT {connect}\r\nPING\r\n".encode())
        await writer.drain()
        answer = (await asyncio.wait_for(reader.readline(), 10)).decode()
        if not answer.startswith("PONG"):
            raise RuntimeError(f"connect refused: {answer.strip()}")
        return time.perf_counter() - started
    finally:
        writer.close()
        await writer.wait_closed()


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


async def run(connects: int) -> dict[str, object]:
    issuer = nkeys.from_random(nkeys.Prefix.ACCOUNT, secrets.token_bytes(32))
    callout_user, service = auth.issue_service("natsauth"), auth.issue_service("bench")
    kube = await FakeKubeApi().start()
    kube.tokens["agent-token"] = ("system:serviceaccount:koordbus:agent", ["system:serviceaccounts"])
    kube.token_audiences["agent-token"] = [AUDIENCE]
    kube.token_extra["agent-token"] = {"authentication.kubernetes.io/node-name": ["node-1"]}
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = kube.kubeconfig(Path(tmp) / "kubeconfig")
        server = EmbeddedNatsServer(
            store_dir=Path(tmp) / "nats",
            authorization=auth.render_callout_authorization(
                issuer_public_key=issuer.public_key, callout_user=callout_user, service_users=[service]
            ),
        )
        await server.start()
        client = await api_client(K8sSettings(kubeconfig=str(kubeconfig)))
        bus = await JetStreamBus.connect(
            server.url, name="natsauth", user=callout_user.user, password=callout_user.password
        )
        callout = NatsAuthService(
            bus,
            KubeTokenReviewer(client, audiences=[AUDIENCE]),
            issuer=issuer,
            settings=NatsAuthSettings(agent_service_account="koordbus:agent", token_audience=AUDIENCE),
            registry=new_registry(),
        )
        await callout.start()
        try:
            for _ in range(20):  # warm-up: connections, caches
                await connect_once(server.url, {"auth_token": "agent-token"})
                await connect_once(server.url, {"user": service.user, "pass": service.password})
            agent = [await connect_once(server.url, {"auth_token": "agent-token"}) for _ in range(connects)]
            static = [await connect_once(server.url, {"user": service.user, "pass": service.password})
                      for _ in range(connects)]  # fmt: skip
        finally:
            await callout.stop()
            await bus.close()
            await client.close()
            await server.stop()
            await kube.stop()
    agent_s, static_s = summary(agent), summary(static)
    return {
        "connects": connects,
        "agent_via_callout": agent_s,
        "service_user": static_s,
        "callout_cost_p50_ms": round(agent_s["p50_ms"] - static_s["p50_ms"], 3),
        "callout_cost_mean_ms": round(agent_s["mean_ms"] - static_s["mean_ms"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connects", type=int, default=500, help="connects of each kind (default 500)")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.connects))), flush=True)


if __name__ == "__main__":
    main()
