"""The load-aware extender under `koordbus up` (koordbus.extender), without a bus: its credentials in the data dir
(0600, made once and kept, made anew when a file is missing, the hosts changed or they near their expiry), the port
it holds (9443, or a free one when that is taken; an explicit busy port stops `up`), the banner's curl line, and how
`koordbus scheduler explain` finds `up`'s extender and client certificate from the project directory."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordbus import extender, scheduler

NOW = 1_800_000_000.0


def counting_random() -> tuple[list[int], object]:
    calls: list[int] = []

    def random(n: int) -> bytes:
        calls.append(n)
        return bytes([len(calls)]) * n

    return calls, random


def test_the_credentials_are_private_kept_and_remade_when_they_must_be(tmp_path: Path) -> None:
    calls, random = counting_random()
    tls = extender.local_tls(tmp_path, hosts=["127.0.0.1"], now=NOW, random=random)  # type: ignore[arg-type]
    files = [*tls.files(), tmp_path / extender.MANIFEST_FILE]
    assert [p.name for p in files] == [
        "extender-ca.crt", "extender.crt", "extender.key", "extender-client.crt", "extender-client.key",
        "extender-tls.json",
    ]  # fmt: skip
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert json.loads((tmp_path / extender.MANIFEST_FILE).read_text()) == {
        "hosts": ["127.0.0.1", "::1", "localhost"],
        "notAfter": NOW + extender.VALID_SECONDS,
    }
    made = {p: p.read_text() for p in files}
    assert "PRIVATE KEY" in made[tls.key] and "CERTIFICATE" in made[tls.ca]
    first = len(calls)

    def again(**kwargs: object) -> None:
        args = {"hosts": ["127.0.0.1"], "now": NOW, "random": random, **kwargs}
        extender.local_tls(tmp_path, **args)  # type: ignore[arg-type]

    tls.key.chmod(0o644)
    again(now=NOW + 300 * 86400)  # a later start: the same files, private again
    assert len(calls) == first and {p: p.read_text() for p in files} == made
    assert stat.S_IMODE(tls.key.stat().st_mode) == 0o600
    again(hosts=["0.0.0.0"])  # a wildcard bind adds no name: still the same
    assert len(calls) == first
    again(hosts=["192.0.2.7"])  # another --host: a new set that names it
    assert len(calls) > first and "192.0.2.7" in (tmp_path / extender.MANIFEST_FILE).read_text()
    for remake in ({"now": NOW + extender.VALID_SECONDS - extender.RENEW_BEFORE_SECONDS}, {}):
        count = len(calls)
        if not remake:
            tls.client_key.unlink()
        again(hosts=["192.0.2.7"], **remake)
        assert len(calls) > count and tls.client_key.is_file()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_the_port_is_9443_or_a_free_one_and_an_explicit_busy_one_stops_up(
    busy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(extender, "DEFAULT_PORT", busy_port)
    with extender.reserve_port("127.0.0.1", None) as picked, extender.reserve_port("127.0.0.1", 0) as free:
        assert picked.getsockname()[1] not in (busy_port, 0)
        assert free.getsockname()[1] not in (busy_port, 0, picked.getsockname()[1])
    with pytest.raises(SystemExit, match=f"port {busy_port} on 127.0.0.1 is in use; pass --extender-port"):
        extender.reserve_port("127.0.0.1", busy_port)


def test_the_port_picked_is_held_until_served() -> None:
    """Between the pick and the extender's start `up` starts its nats-server and services, opening connections:
    a free port the pick had let go could be taken meanwhile (uvicorn then ended `up` with exit code 3)."""
    with extender.reserve_port("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError):
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))
            other.listen()


def test_the_banners_curl_line_is_a_filter_request_with_the_client_certificate(tmp_path: Path) -> None:
    running = extender.RunningExtender(url="https://127.0.0.1:9443", tls=extender.LocalTls.under(tmp_path))
    line = extender.try_it(running, node="sim-node-0001")
    assert line.startswith(f"curl --cacert {tmp_path}/extender-ca.crt --cert {tmp_path}/extender-client.crt ")
    body = json.loads(line.split(" -d ", 1)[1].strip("'"))
    assert body["NodeNames"] == ["sim-node-0001"] and body["Pod"]["spec"]["containers"][0]["resources"]


def explain_args(**given: str | None) -> argparse.Namespace:
    return argparse.Namespace(**{"url": None, "cacert": None, "cert": None, "key": None, **given})


def test_explain_finds_ups_extender_and_client_certificate_from_the_project_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KOORDBUS_LOADAWARE_URL", raising=False)
    assert scheduler._default_url() == scheduler.DEFAULT_URL  # no `up` here: the service's plain port
    assert scheduler._tls(explain_args(), scheduler.DEFAULT_URL) is True
    data = tmp_path / ".koordbus"
    data.mkdir()
    extender.local_tls(data, hosts=["127.0.0.1"], now=NOW)
    (data / extender.URL_FILE).write_text("https://127.0.0.1:9555\n")
    assert scheduler._default_url() == "https://127.0.0.1:9555"
    context = scheduler._tls(explain_args(), "https://127.0.0.1:9555")
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "koordbus up extender CA"),),)]
    monkeypatch.setenv("KOORDBUS_LOADAWARE_URL", "http://elsewhere:9090")
    assert scheduler._default_url() == "http://elsewhere:9090"
    with pytest.raises(FileNotFoundError):  # a file named on the command line that is not there is an error
        scheduler._tls(explain_args(cert="missing.crt"), "https://127.0.0.1:9555")
