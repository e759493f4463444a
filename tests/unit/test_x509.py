"""services.common.x509: the DER it writes (checked byte for byte on the ASN.1 primitives), and certificates that
OpenSSL accepts as a CA and a serving certificate for the Service's names, through Python's ssl and, when the
command is there, `openssl verify -x509_strict`. Go's crypto/x509 (kube-apiserver's) is checked in
tests/deploy/test_webhook_certs.py."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from services.common import x509

NOW = datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
NAMES = x509.service_dns_names("prod-koordbus-webhook", "koordbus")


def pair(**overrides: object) -> x509.ServingPair:
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
    assert x509._set(b"\x02\x01\x02", b"\x02\x01\x01") == bytes.fromhex("3106020101020102")  # DER sorts a SET OF
    with pytest.raises(ValueError, match="UTC"):
        x509._time(datetime(2030, 1, 1, tzinfo=ZoneInfo("Europe/Paris")))


def test_a_pair_is_a_function_of_its_inputs() -> None:
    assert pair() == pair()
    assert pair(serving_serial=2).tls_crt != pair().tls_crt and pair(serving_serial=2).ca_crt == pair().ca_crt
    assert pair().tls_key == x509.private_key_pem(bytes([7]) * 32)
    assert pair().secret_data() == {"ca.crt": pair().ca_crt, "tls.crt": pair().tls_crt, "tls.key": pair().tls_key}


def test_what_is_not_a_certificate_is_refused() -> None:
    for overrides, message in (
        ({"dns_names": []}, "at least one DNS name"),
        ({"days": 0}, "days must be at least 1"),
        ({"ca_serial": 0}, "serial numbers are positive"),
        ({"serving_serial": 2**159}, "serial numbers are positive"),
        ({"ca_seed": bytes(31)}, "seeds are 32 bytes"),
    ):
        with pytest.raises(ValueError, match=message):
            pair(**overrides)
    with pytest.raises(UnicodeEncodeError):
        pair(dns_names=["webhook.bücher.svc"])


def _handshake(chain: x509.ServingPair, tmp_path: Path, *, trust: str, name: str) -> dict[str, object]:
    from koordbus.certs import _handshake as handshake

    (tmp_path / "tls.crt").write_text(chain.tls_crt)
    (tmp_path / "tls.key").write_text(chain.tls_key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cadata=trust)
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    return handshake(server, client, name)


def test_openssl_serves_it_and_verifies_it_for_every_name_of_the_service(tmp_path: Path) -> None:
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
        seen = _handshake(chain, tmp_path, trust=chain.ca_crt, name=name)
        assert ("DNS", name) in seen["subjectAltName"]  # type: ignore[operator]
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(chain, tmp_path, trust=chain.ca_crt, name="other.koordbus.svc")
    other = x509.issue_serving_pair(
        dns_names=NAMES, now=datetime.now(UTC), days=2, ca_seed=bytes(32), serving_seed=bytes(32), ca_serial=5,
        serving_serial=6,
    )  # fmt: skip
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        _handshake(chain, tmp_path, trust=other.ca_crt, name=NAMES[2])
    # a bundle trusting both CAs (a caBundle while one replaces the other) verifies either
    _handshake(chain, tmp_path, trust=other.ca_crt + chain.ca_crt, name=NAMES[2])


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
def test_openssl_verify_x509_strict_accepts_the_chain_and_reads_its_extensions(tmp_path: Path) -> None:
    chain = pair(now=datetime.now(UTC))
    for key, text in chain.secret_data().items():
        (tmp_path / key).write_text(text)

    def openssl(*args: str) -> str:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    strict = ["verify", "-x509_strict", "-CAfile", str(tmp_path / "ca.crt")]
    assert "OK" in openssl(*strict, "-purpose", "sslserver", str(tmp_path / "tls.crt"))
    assert "OK" in openssl(*strict, str(tmp_path / "ca.crt"))
    text = openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-text")
    assert "CA:FALSE" in text and "TLS Web Server Authentication" in text and "Digital Signature" in text
    assert ", ".join(f"DNS:{n}" for n in NAMES) in text
    ca = openssl("x509", "-in", str(tmp_path / "ca.crt"), "-noout", "-text")
    assert "CA:TRUE, pathlen:0" in ca and "Certificate Sign" in ca
    assert "ED25519" in openssl("pkey", "-in", str(tmp_path / "tls.key"), "-noout", "-text")


def test_validity_starts_a_little_before_now_and_lasts_the_days(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    chain = pair(now=now, days=30)
    seen = _handshake(chain, tmp_path, trust=chain.ca_crt, name=NAMES[0])
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
