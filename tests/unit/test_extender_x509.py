"""koordbus.x509, the certificates of `koordbus up`'s extender made without openssl: what openssl reads in them
(version, names, validity, extensions, Ed25519 keys and signatures), that `openssl verify -x509_strict` accepts the
chain for its purpose, and that Python's ssl completes a mutual-TLS handshake with them and refuses a client without
a certificate or with one from another CA (the handshake runs in memory: no socket)."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from koordbus import x509

NOW = 1_800_000_000.0  # 2027-01-15
YEAR = 365 * 86400


def seed(n: int) -> bytes:
    return bytes([n]) * 32


CA = x509.Subject(name="test CA", seed=seed(1))
SERVER = x509.Subject(name="extender", seed=seed(2), hosts=("localhost", "127.0.0.1", "::1"))
CLIENT = x509.Subject(name="kube-scheduler", seed=seed(3))


def write_chain(
    directory: Path, *, ca: x509.Subject = CA, not_before: float = NOW - 300, not_after: float = NOW + YEAR
) -> dict[str, Path]:
    directory.mkdir(exist_ok=True)
    validity = {"not_before": not_before, "not_after": not_after}
    files = {
        "ca": x509.certificate(ca, role="ca", issuer=ca, serial=1, **validity),
        "server": x509.certificate(SERVER, role="server", issuer=ca, serial=2, **validity),
        "server-key": x509.private_key_pem(SERVER.seed),
        "client": x509.certificate(CLIENT, role="client", issuer=ca, serial=3, **validity),
        "client-key": x509.private_key_pem(CLIENT.seed),
    }
    paths = {}
    for name, text in files.items():
        paths[name] = directory / f"{name}.pem"
        paths[name].write_text(text)
    return paths


def test_the_same_inputs_make_the_same_certificate() -> None:
    """Ed25519 signatures are deterministic and every input is a parameter: nothing random or timed inside."""
    made = [
        x509.certificate(SERVER, role="server", issuer=CA, serial=7, not_before=NOW, not_after=NOW + 1) for _ in "ab"
    ]
    assert made[0] == made[1] and made[0].startswith("-----BEGIN CERTIFICATE-----\n")
    assert all(len(line) <= 64 for line in made[0].splitlines())
    with pytest.raises(ValueError, match="32 bytes"):
        x509.certificate(
            x509.Subject(name="x", seed=b"short"), role="ca", issuer=CA, serial=1, not_before=0, not_after=1
        )


def test_times_through_2049_are_utc_time_and_later_ones_generalized_time() -> None:
    pem = x509.certificate(CA, role="ca", issuer=CA, serial=1, not_before=NOW, not_after=2_600_000_000.0)
    der = base64.b64decode("".join(pem.splitlines()[1:-1]))
    assert b"\x17\x0d270115080000Z" in der and b"\x18\x0f20520522141320Z" in der


openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True).stdout


@openssl
def test_openssl_reads_the_certificates_and_verifies_the_chain_strictly(tmp_path: Path) -> None:
    paths = write_chain(tmp_path)
    text = _openssl("x509", "-in", str(paths["server"]), "-noout", "-text")
    for expected in (
        "Version: 3 (0x2)",
        "Signature Algorithm: ED25519",
        "Issuer: CN = test CA",
        "Subject: CN = extender",
        "Not After : Jan 15 08:00:00 2028 GMT",
        "TLS Web Server Authentication",
        "DNS:localhost, IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1",
        "X509v3 Authority Key Identifier",
    ):
        assert expected in text, text
    assert "CA:TRUE" in _openssl("x509", "-in", str(paths["ca"]), "-noout", "-text")
    at = ["-attime", str(int(NOW))]
    ca = ["-CAfile", str(paths["ca"])]
    assert "OK" in _openssl("verify", "-x509_strict", *at, *ca, "-purpose", "sslserver", str(paths["server"]))
    assert "OK" in _openssl("verify", "-x509_strict", *at, *ca, "-purpose", "sslclient", str(paths["client"]))
    with pytest.raises(subprocess.CalledProcessError):  # a client certificate is no server certificate
        _openssl("verify", "-x509_strict", *at, *ca, "-purpose", "sslserver", str(paths["client"]))
    # the key files are PKCS#8 Ed25519 keys whose public half is the certificate's
    public = _openssl("pkey", "-in", str(paths["server-key"]), "-pubout")
    assert public == _openssl("x509", "-in", str(paths["server"]), "-noout", "-pubkey")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> dict[str, object] | None:
    """A TLS handshake between the two contexts over memory BIOs; the client certificate the server saw."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    client_side = client.wrap_bio(to_client, to_server, server_hostname="localhost")
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        if all(done.values()):
            break
    # TLS 1.3: the server checks the client's certificate after the client thinks it is done; reading surfaces it
    client_side.write(b"ping")
    assert server_side.read(4) == b"ping"
    return server_side.getpeercert()


def _server(paths: dict[str, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["server"], paths["server-key"])
    context.load_verify_locations(paths["ca"])
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _client(trust: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(trust))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def test_a_mutual_tls_handshake_admits_the_client_certificate_and_no_other(tmp_path: Path) -> None:
    always = {"not_before": 0.0, "not_after": 4_000_000_000.0}  # the handshake checks against the real clock
    ours = write_chain(tmp_path / "ours", **always)
    seen = _handshake(_server(ours), _client(ours["ca"], ours["client"], ours["client-key"]))
    assert seen is not None and dict(x[0] for x in seen["subject"]) == {"commonName": "kube-scheduler"}  # type: ignore[misc]
    with pytest.raises(ssl.SSLError):
        _handshake(_server(ours), _client(ours["ca"]))  # no client certificate
    theirs = write_chain(tmp_path / "theirs", ca=x509.Subject(name="another CA", seed=seed(9)), **always)
    with pytest.raises(ssl.SSLError):
        _handshake(_server(ours), _client(ours["ca"], theirs["client"], theirs["client-key"]))
    with pytest.raises(ssl.SSLError):  # nor does a client trusting only our CA accept their server
        _handshake(_server(theirs), _client(ours["ca"], ours["client"], ours["client-key"]))
