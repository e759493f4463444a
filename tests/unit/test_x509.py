"""services.common.x509: the DER it writes (checked byte for byte on the ASN.1 primitives), certificates that are a
function of their inputs, and what OpenSSL makes of both chains it is used for — the admission webhook's CA and
serving certificate (`koordbus certs webhook`) and `koordbus up`'s extender CA with its server and client
certificates. OpenSSL reads and verifies them through Python's ssl (koordbus.certs' in-memory handshake: no socket)
and, when the command is there, `openssl verify -x509_strict`. Go's crypto/x509 (kube-apiserver's) is checked in
tests/deploy/test_webhook_certs.py."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from koordbus.certs import _handshake as certs_handshake
from services.common import x509

NOW = datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
NAMES = x509.service_dns_names("prod-koordbus-webhook", "koordbus")
UP_NOW = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
YEAR = timedelta(days=365)

openssl_command = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")


def seed(n: int) -> bytes:
    return bytes([n]) * x509.SEED_BYTES


CA = x509.Subject(name="test CA", seed=seed(1))
SERVER = x509.Subject(name="extender", seed=seed(2), hosts=("localhost", "127.0.0.1", "::1"))
CLIENT = x509.Subject(name="kube-scheduler", seed=seed(3))


def pair(**overrides: object) -> x509.ServingPair:
    """A webhook serving pair (as `koordbus certs webhook` makes one)."""
    arguments: dict[str, object] = {
        "dns_names": NAMES,
        "now": NOW,
        "days": 365,
        "ca_seed": bytes(32),
        "serving_seed": bytes([7]) * 32,
        "ca_serial": 2**127 + 1,  # the sign bit set: encoded with a leading zero
        "serving_serial": 1,
    }
    return x509.issue_serving_pair(**{**arguments, **overrides})  # type: ignore[arg-type]


def mutual_chain(
    directory: Path,
    *,
    ca: x509.Subject = CA,
    not_before: datetime = UP_NOW - timedelta(minutes=5),
    not_after: datetime = UP_NOW + YEAR,
) -> dict[str, Path]:
    """A CA, server and client certificate and keys as `koordbus up` makes them for its extender, as files."""
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


def test_the_der_primitives() -> None:
    assert x509._integer(0) == bytes.fromhex("020100")
    assert x509._integer(127) == bytes.fromhex("02017f")
    assert x509._integer(128) == bytes.fromhex("02020080")  # positive: a leading zero
    assert x509._integer(256) == bytes.fromhex("02020100")
    assert x509._oid((1, 2, 840, 113549)) == bytes.fromhex("06062a864886f70d")
    assert x509._oid((1, 3, 101, 112)) == bytes.fromhex("06032b6570")  # Ed25519
    assert x509._tlv(0x04, b"x" * 127)[:2] == bytes.fromhex("047f")
    assert x509._tlv(0x04, b"x" * 128)[:3] == bytes.fromhex("048180")
    assert x509._tlv(0x04, b"x" * 300)[:4] == bytes.fromhex("0482012c")
    assert x509._key_usage(0) == bytes.fromhex("03020780")  # digitalSignature
    assert x509._key_usage(0, 5, 6) == bytes.fromhex("03020186")  # + keyCertSign, cRLSign
    assert x509._key_usage(8) == bytes.fromhex("0303070080")  # decipherOnly, the ninth bit
    assert x509._time(datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC)) == b"\x17\x0d491231235959Z"
    assert x509._time(datetime(2050, 1, 1, tzinfo=UTC)) == b"\x18\x0f20500101000000Z"
    assert x509._time(datetime(1949, 12, 31, tzinfo=UTC)) == b"\x18\x0f19491231000000Z"
    assert x509._set(b"\x02\x01\x02", b"\x02\x01\x01") == bytes.fromhex("3106020101020102")  # DER sorts a SET OF
    assert x509._general_name("127.0.0.1") == bytes.fromhex("87047f000001")  # iPAddress
    assert x509._general_name("::1") == bytes.fromhex("8710" + "00" * 15 + "01")
    assert x509._general_name("localhost") == b"\x82\x09localhost"  # dNSName
    with pytest.raises(ValueError, match="UTC"):
        x509._time(datetime(2030, 1, 1, tzinfo=ZoneInfo("Europe/Paris")))


def test_the_same_inputs_make_the_same_certificates() -> None:
    """Ed25519 signatures are deterministic and every input is a parameter: nothing random or timed inside."""
    assert pair() == pair()
    assert pair(serving_serial=2).tls_crt != pair().tls_crt and pair(serving_serial=2).ca_crt == pair().ca_crt
    assert pair().tls_key == x509.private_key_pem(bytes([7]) * 32)
    assert pair().secret_data() == {"ca.crt": pair().ca_crt, "tls.crt": pair().tls_crt, "tls.key": pair().tls_key}
    validity = {"not_before": UP_NOW, "not_after": UP_NOW + timedelta(seconds=1)}
    made = [x509.certificate(SERVER, role="server", issuer=CA, serial=7, **validity) for _ in "ab"]
    assert made[0] == made[1] and made[0].startswith("-----BEGIN CERTIFICATE-----\n")
    assert all(len(line) <= 64 for line in made[0].splitlines())


def test_times_through_2049_are_utc_time_and_later_ones_generalized_time() -> None:
    later = datetime(2052, 5, 22, 14, 13, 20, tzinfo=UTC)
    pem = x509.certificate(CA, role="ca", issuer=CA, serial=1, not_before=UP_NOW, not_after=later)
    der = base64.b64decode("".join(pem.splitlines()[1:-1]))
    assert b"\x17\x0d270115080000Z" in der and b"\x18\x0f20520522141320Z" in der


def test_what_is_not_a_certificate_is_refused() -> None:
    for overrides, message in (
        ({"dns_names": []}, "at least one DNS name"),
        ({"days": 0}, "days must be at least 1"),
        ({"ca_serial": 0}, "serial numbers are positive"),
        ({"serving_serial": 2**159}, "serial numbers are positive"),
        ({"ca_seed": bytes(31)}, "seed is 32 bytes, got 31"),
    ):
        with pytest.raises(ValueError, match=message):
            pair(**overrides)
    with pytest.raises(UnicodeEncodeError):
        pair(dns_names=["webhook.bücher.svc"])
    validity = {"not_before": UP_NOW, "not_after": UP_NOW + YEAR}
    short = x509.Subject(name="x", seed=b"short")
    with pytest.raises(ValueError, match="seed is 32 bytes, got 5"):
        x509.certificate(short, role="ca", issuer=CA, serial=1, **validity)
    with pytest.raises(ValueError, match="seed is 32 bytes, got 5"):
        x509.private_key_pem(short.seed)
    with pytest.raises(ValueError, match="at least one DNS name or IP address"):
        x509.certificate(CLIENT, role="server", issuer=CA, serial=1, **validity)
    with pytest.raises(ValueError, match="notAfter is after its notBefore"):
        x509.certificate(CA, role="ca", issuer=CA, serial=1, not_before=UP_NOW, not_after=UP_NOW)


def _server(cert: Path, key: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context as `koordbus up`'s extender (mutual TLS: a client certificate from `client_ca` required) or
    the webhook (none asked for) serves with."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _client(trust: str, *, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client trusting the PEM CAs `trust` and checking them strictly, presenting `cert` when given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=trust)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """koordbus.certs' in-memory handshake: the server certificate the client saw, and the client certificate the
    server admitted ({} when it asked for none). ssl.SSLError when either side refuses the other."""
    admitted: list[dict[str, Any]] = []

    class Server(ssl.SSLObject):
        def do_handshake(self) -> None:
            super().do_handshake()
            admitted.append(self.getpeercert() or {})

    server.sslobject_class = Server
    seen = certs_handshake(server, client, name)
    return seen, admitted[-1]


def _serve_pair(chain: x509.ServingPair, tmp_path: Path, *, trust: str, name: str) -> dict[str, Any]:
    (tmp_path / "tls.crt").write_text(chain.tls_crt)
    (tmp_path / "tls.key").write_text(chain.tls_key)
    return _handshake(_server(tmp_path / "tls.crt", tmp_path / "tls.key"), _client(trust), name)[0]


def test_openssl_serves_the_webhook_pair_and_verifies_it_for_every_name_of_the_service(tmp_path: Path) -> None:
    chain = x509.issue_serving_pair(
        dns_names=NAMES,
        now=datetime.now(UTC),
        days=2,
        ca_seed=bytes(range(32)),
        serving_seed=bytes(range(32, 64)),
        ca_serial=3,
        serving_serial=4,
    )
    for name in NAMES:
        seen = _serve_pair(chain, tmp_path, trust=chain.ca_crt, name=name)
        assert ("DNS", name) in seen["subjectAltName"]
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _serve_pair(chain, tmp_path, trust=chain.ca_crt, name="other.koordbus.svc")
    other = x509.issue_serving_pair(
        dns_names=NAMES, now=datetime.now(UTC), days=2, ca_seed=bytes(32), serving_seed=bytes(32), ca_serial=5,
        serving_serial=6,
    )  # fmt: skip
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        _serve_pair(chain, tmp_path, trust=other.ca_crt, name=NAMES[2])
    # a bundle trusting both CAs (a caBundle while one replaces the other) verifies either
    _serve_pair(chain, tmp_path, trust=other.ca_crt + chain.ca_crt, name=NAMES[2])


def test_a_mutual_tls_handshake_admits_the_client_certificate_and_no_other(tmp_path: Path) -> None:
    always = {  # the handshake checks against the real clock
        "not_before": datetime.fromtimestamp(0, UTC),
        "not_after": datetime.fromtimestamp(4_000_000_000, UTC),
    }
    ours = mutual_chain(tmp_path / "ours", **always)
    trust = ours["ca"].read_text()

    def serve(chain: dict[str, Path]) -> ssl.SSLContext:
        return _server(chain["server"], chain["server-key"], client_ca=chain["ca"])

    for host in SERVER.hosts:
        seen, admitted = _handshake(serve(ours), _client(trust, cert=ours["client"], key=ours["client-key"]), host)
        assert dict(x[0] for x in seen["subject"]) == {"commonName": "extender"}
        assert dict(x[0] for x in admitted["subject"]) == {"commonName": "kube-scheduler"}
    with pytest.raises(ssl.SSLError, match="peer did not return a certificate"):
        _handshake(serve(ours), _client(trust), "localhost")
    theirs = mutual_chain(tmp_path / "theirs", ca=x509.Subject(name="another CA", seed=seed(9)), **always)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        _handshake(serve(ours), _client(trust, cert=theirs["client"], key=theirs["client-key"]), "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):  # nor does a client trusting only our CA accept their server
        _handshake(serve(theirs), _client(trust, cert=ours["client"], key=ours["client-key"]), "localhost")


def _openssl(*args: str, succeeds: bool = True) -> str:
    """What `openssl ARGS` writes to stdout (and stderr, for one expected to fail)."""
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode == 0) == succeeds, f"openssl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout if succeeds else done.stdout + done.stderr


@openssl_command
def test_openssl_verify_x509_strict_accepts_the_webhook_pair_and_reads_its_extensions(tmp_path: Path) -> None:
    chain = pair(now=datetime.now(UTC))
    for key, text in chain.secret_data().items():
        (tmp_path / key).write_text(text)
    strict = ["verify", "-x509_strict", "-CAfile", str(tmp_path / "ca.crt")]
    assert "OK" in _openssl(*strict, "-purpose", "sslserver", str(tmp_path / "tls.crt"))
    assert "OK" in _openssl(*strict, str(tmp_path / "ca.crt"))
    text = _openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-text")
    assert "CA:FALSE" in text and "TLS Web Server Authentication" in text and "Digital Signature" in text
    assert ", ".join(f"DNS:{n}" for n in NAMES) in text
    ca = _openssl("x509", "-in", str(tmp_path / "ca.crt"), "-noout", "-text")
    assert "CA:TRUE, pathlen:0" in ca and "Certificate Sign" in ca
    assert "ED25519" in _openssl("pkey", "-in", str(tmp_path / "tls.key"), "-noout", "-text")


@openssl_command
def test_openssl_verify_x509_strict_accepts_the_mutual_chain_for_each_purpose(tmp_path: Path) -> None:
    paths = mutual_chain(tmp_path)
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
    assert "TLS Web Client Authentication" in _openssl("x509", "-in", str(paths["client"]), "-noout", "-text")
    assert "CA:TRUE" in _openssl("x509", "-in", str(paths["ca"]), "-noout", "-text")
    strict = ["verify", "-x509_strict", "-attime", str(int(UP_NOW.timestamp())), "-CAfile", str(paths["ca"])]
    assert "OK" in _openssl(*strict, "-purpose", "sslserver", str(paths["server"]))
    assert "OK" in _openssl(*strict, "-purpose", "sslclient", str(paths["client"]))
    refused = _openssl(*strict, "-purpose", "sslserver", str(paths["client"]), succeeds=False)
    assert "unsuitable certificate purpose" in refused  # a client certificate is no server certificate
    # the key files are PKCS#8 Ed25519 keys whose public half is the certificate's
    for cert, key in (("server", "server-key"), ("client", "client-key")):
        public = _openssl("pkey", "-in", str(paths[key]), "-pubout")
        assert public == _openssl("x509", "-in", str(paths[cert]), "-noout", "-pubkey")


def test_validity_starts_a_little_before_now_and_lasts_the_days(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    chain = pair(now=now, days=30)
    seen = _serve_pair(chain, tmp_path, trust=chain.ca_crt, name=NAMES[0])
    not_before = datetime.fromtimestamp(ssl.cert_time_to_seconds(str(seen["notBefore"])), UTC)
    not_after = datetime.fromtimestamp(ssl.cert_time_to_seconds(str(seen["notAfter"])), UTC)
    assert not_before == (now - x509.CLOCK_SKEW).replace(microsecond=0)
    assert not_after == (now + timedelta(days=30)).replace(microsecond=0)


def test_pem_certificates_finds_each_certificate_however_it_is_wrapped() -> None:
    chain = pair()
    rewrapped = chain.ca_crt.replace("\n", "\r\n").replace("-----\r\n", "-----\r\n  ", 1)
    bundle = f"junk\n{rewrapped}\nmore junk\n{chain.tls_crt}-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"
    assert x509.pem_certificates(bundle) == [chain.ca_crt, chain.tls_crt]
    assert x509.pem_certificates(chain.tls_key) == []
