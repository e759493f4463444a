"""The load-aware kube-scheduler extender inside `koordbus up` (issue 27): the LoadAwareService and HTTP app that
`koordbus service loadaware` runs, in the `up` process, its verbs served over mutual TLS on a local port with
credentials `up` makes itself.

kube-scheduler's extender client cannot send a bearer token but presents a client certificate, so the extender's
door is mutual TLS (docs/load-aware-scheduling.md#who-may-call-the-extender). `local_tls` writes, next to the API
token in the data dir (0700, each file 0600):

  extender-ca.crt                         the local CA both sides trust (its key is never written: nothing else can
                                          be issued from it; a new set replaces the whole set)
  extender.crt, extender.key              the extender's serving certificate (localhost, 127.0.0.1, ::1, --host)
  extender-client.crt, extender-client.key  the client certificate kube-scheduler (tlsConfig certFile/keyFile),
                                          curl or `koordbus scheduler explain` presents
  extender-tls.json                       what they were made for (hosts, expiry)

made with services.common.x509 (Ed25519, no openssl needed) on the first start, and again when a file is missing, the
hosts changed or they expire within RENEW_BEFORE_SECONDS. `start` writes the extender's URL to `extender-url`, where
`koordbus scheduler explain` run from the project directory finds it with the client certificate. Called by
koordbus.up; tests/e2e/test_up_extender.py runs it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

CA_FILE: Final = "extender-ca.crt"
CERT_FILE: Final = "extender.crt"
KEY_FILE: Final = "extender.key"
CLIENT_CERT_FILE: Final = "extender-client.crt"
CLIENT_KEY_FILE: Final = "extender-client.key"
MANIFEST_FILE: Final = "extender-tls.json"
URL_FILE: Final = "extender-url"
DEFAULT_PORT: Final = 9443
"""The port the chart's extender serves its verbs over TLS on; taken by something else, `up` picks a free one."""
VALID_SECONDS: Final = 365 * 86400
RENEW_BEFORE_SECONDS: Final = 30 * 86400
LOCAL_HOSTS: Final = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class LocalTls:
    """The files of `up`'s extender credentials."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def under(cls, data_dir: Path) -> LocalTls:
        return cls(
            ca=data_dir / CA_FILE,
            cert=data_dir / CERT_FILE,
            key=data_dir / KEY_FILE,
            client_cert=data_dir / CLIENT_CERT_FILE,
            client_key=data_dir / CLIENT_KEY_FILE,
        )

    def files(self) -> tuple[Path, ...]:
        return (self.ca, self.cert, self.key, self.client_cert, self.client_key)


def local_tls(
    data_dir: Path, *, hosts: Sequence[str], now: float, random: Callable[[int], bytes] = os.urandom
) -> LocalTls:
    """The extender's credentials in `data_dir`, made anew when missing, made for other hosts, or about to expire."""
    from services.common import x509

    tls = LocalTls.under(data_dir)
    names = sorted({*LOCAL_HOSTS, *hosts} - {"0.0.0.0", "::", ""})
    manifest = data_dir / MANIFEST_FILE
    try:
        made = json.loads(manifest.read_text())
        fresh = made["hosts"] == names and made["notAfter"] - RENEW_BEFORE_SECONDS > now
    except (OSError, ValueError, KeyError, TypeError):
        fresh = False
    if fresh and all(path.is_file() for path in tls.files()):
        for path in (*tls.files(), manifest):
            path.chmod(0o600)
        return tls
    ca = x509.Subject(name="koordbus up extender CA", seed=random(x509.SEED_BYTES))
    server = x509.Subject(name="koordbus up load-aware extender", seed=random(x509.SEED_BYTES), hosts=names)
    client = x509.Subject(name="kube-scheduler", seed=random(x509.SEED_BYTES))
    serials = [int.from_bytes(random(8), "big") | 1 for _ in range(3)]
    not_after = now + VALID_SECONDS
    validity = {  # 5 minutes of clock skew
        "not_before": datetime.fromtimestamp(now - 300, UTC),
        "not_after": datetime.fromtimestamp(not_after, UTC),
    }
    contents = {
        tls.ca: x509.certificate(ca, role="ca", issuer=ca, serial=serials[0], **validity),
        tls.cert: x509.certificate(server, role="server", issuer=ca, serial=serials[1], **validity),
        tls.key: x509.private_key_pem(server.seed),
        tls.client_cert: x509.certificate(client, role="client", issuer=ca, serial=serials[2], **validity),
        tls.client_key: x509.private_key_pem(client.seed),
        manifest: json.dumps({"hosts": names, "notAfter": not_after}) + "\n",
    }
    for path, text in contents.items():
        _write_private(path, text)
    log.info("extender: a new local CA, serving and client certificate written to %s", data_dir)
    return tls


def _write_private(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    with open(path, "x", encoding="ascii", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
        f.write(text)


def reserve_port(host: str, port: int | None) -> socket.socket:
    """The port to serve on, bound now and held until `start` listens on it: `port` as given (0: a free one); None:
    DEFAULT_PORT, or a free one when it is taken."""
    from koordbus import http_serve

    if port is None:
        if (held := http_serve.reserve(host, DEFAULT_PORT)) is not None:
            return held
        log.warning("extender: port %d on %s is in use; serving on a free port", DEFAULT_PORT, host)
        port = 0
    if (held := http_serve.reserve(host, port)) is None:
        raise SystemExit(
            f"koordbus up: port {port} on {host} is in use; pass --extender-port (0: a free one) or --no-extender"
        )
    return held


@dataclass(frozen=True)
class RunningExtender:
    url: str
    tls: LocalTls


async def start(
    stack: AsyncExitStack, bus: Any, registry: Any, *, data_dir: Path, host: str, reserved: socket.socket, now: float
) -> RunningExtender:
    """Start the extender service on `bus` (it replays KOORD_CLUSTER and KOORD_NODEMETRIC, then states its
    watermarks) and serve its verbs, explain, health and metrics over mutual TLS on the port `reserved` holds."""
    from koordbus import http_serve, runtime
    from koordbus.parts import loadaware_args
    from services.common import settings as settings_loader
    from services.loadaware.http import create_app
    from services.loadaware.service import LoadAwareService
    from services.loadaware.settings import LoadAwareSettings

    port = int(reserved.getsockname()[1])
    tls = local_tls(data_dir, hosts=[host], now=now)
    overrides = {"tls_cert_file": str(tls.cert), "tls_key_file": str(tls.key), "tls_client_ca_file": str(tls.ca)}
    try:
        settings = settings_loader.load(LoadAwareSettings, {**overrides, "extender_port": port})
    except settings_loader.SettingsError as e:
        raise SystemExit(f"koordbus up: loadaware: {e}") from None
    service = LoadAwareService(bus, settings, args=loadaware_args(settings.args_file), registry=registry)
    await service.start()
    stack.push_async_callback(service.stop)
    app = create_app(service, registry, liveness=runtime.bus_liveness(bus))
    mutual = http_serve.MutualTls(cert_file=str(tls.cert), key_file=str(tls.key), client_ca_file=str(tls.ca))
    await http_serve.serve_http(stack, app, host=host, port=port, tls=mutual, reserved=reserved)
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # a wildcard bind answers on loopback too
    url = f"https://{f'[{shown}]' if ':' in shown else shown}:{port}"
    _write_private(data_dir / URL_FILE, url + "\n")
    return RunningExtender(url=url, tls=tls)


def try_it(running: RunningExtender, *, node: str) -> str:
    """The banner's curl line: a filter request for a 1-core pod on `node`, with the client certificate."""
    tls = running.tls
    container = {"name": "c", "resources": {"requests": {"cpu": "1"}}}
    pod = {"metadata": {"name": "try", "namespace": "default"}, "spec": {"containers": [container]}}
    body = json.dumps({"Pod": pod, "NodeNames": [node]}, separators=(",", ":"))
    return f"curl --cacert {tls.ca} --cert {tls.client_cert} --key {tls.client_key} {running.url}/filter -d '{body}'"
