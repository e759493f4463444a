"""X.509 certificates made with PyNaCl alone: the CA and serving certificate of the admission webhook's Service.

kube-apiserver calls a webhook over HTTPS only, and checks the serving certificate against the caBundle of the webhook
configuration. `koordbus certs webhook` (the Helm chart's hook Job, koordbus.certs) makes that pair where neither
cert-manager nor a certificate of the user's is there. The image has no `openssl` guaranteed and koordbus does not
depend on `cryptography`, so the certificates are Ed25519 (RFC 8410, signed by libsodium through PyNaCl, which the
NATS keys already use: bus.nkeys) and DER-encoded here, the few ASN.1 types a certificate needs: a self-signed CA
(basicConstraints CA, keyCertSign) and a serving certificate it signs (serverAuth, the Service's DNS names as
subjectAltName), both with key identifiers, so that OpenSSL's strict checks and Go's crypto/x509 (kube-apiserver)
accept them; tests/unit/test_x509.py has both verify them.

Pure: the time, the key seeds and the serial numbers are parameters.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import nacl.signing

SEED_BYTES = 32
CLOCK_SKEW = timedelta(hours=1)
"""notBefore is this far before `now`: a node whose clock is a little behind still accepts a new certificate."""

_ED25519 = (1, 3, 101, 112)
_COMMON_NAME = (2, 5, 4, 3)
_SUBJECT_KEY_ID = (2, 5, 29, 14)
_KEY_USAGE = (2, 5, 29, 15)
_SUBJECT_ALT_NAME = (2, 5, 29, 17)
_BASIC_CONSTRAINTS = (2, 5, 29, 19)
_AUTHORITY_KEY_ID = (2, 5, 29, 35)
_EXT_KEY_USAGE = (2, 5, 29, 37)
_SERVER_AUTH = (1, 3, 6, 1, 5, 5, 7, 3, 1)
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


# --- DER (X.690), the types a certificate uses


def _tlv(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length)]) + length + content


def _sequence(*items: bytes) -> bytes:
    return _tlv(0x30, b"".join(items))


def _set(*items: bytes) -> bytes:
    return _tlv(0x31, b"".join(sorted(items)))


def _integer(value: int) -> bytes:
    if value < 0:
        raise ValueError("only non-negative integers are encoded here")
    return _tlv(0x02, value.to_bytes(value.bit_length() // 8 + 1, "big"))  # a leading 0 keeps the sign bit clear


def _boolean(value: bool) -> bytes:
    return _tlv(0x01, b"\xff" if value else b"\x00")


def _oid(arcs: tuple[int, ...]) -> bytes:
    body = bytearray([40 * arcs[0] + arcs[1]])
    for arc in arcs[2:]:
        chunk = [arc & 0x7F]
        while arc := arc >> 7:
            chunk.append(0x80 | (arc & 0x7F))
        body.extend(reversed(chunk))
    return _tlv(0x06, bytes(body))


def _octets(value: bytes) -> bytes:
    return _tlv(0x04, value)


def _bits(value: bytes, *, unused: int = 0) -> bytes:
    return _tlv(0x03, bytes([unused]) + value)


def _explicit(number: int, content: bytes) -> bytes:
    return _tlv(0xA0 | number, content)


def _time(moment: datetime) -> bytes:
    """UTCTime until 2049, GeneralizedTime from 2050 (RFC 5280 4.1.2.5)."""
    if moment.utcoffset() != timedelta(0):
        raise ValueError("certificate times are UTC")
    if moment.year < 2050:
        return _tlv(0x17, moment.strftime("%y%m%d%H%M%SZ").encode())
    return _tlv(0x18, moment.strftime("%Y%m%d%H%M%SZ").encode())


def _name(common_name: str) -> bytes:
    return _sequence(_set(_sequence(_oid(_COMMON_NAME), _tlv(0x0C, common_name.encode()))))


def _extension(arcs: tuple[int, ...], value: bytes, *, critical: bool = False) -> bytes:
    return _sequence(_oid(arcs), *([_boolean(True)] if critical else []), _octets(value))


def _key_usage(*bits: int) -> bytes:
    """A KeyUsage BIT STRING with the named bits set (0 digitalSignature … 5 keyCertSign, 6 cRLSign), trailing zero
    bits left out as DER requires."""
    highest = max(bits)
    value = bytearray(highest // 8 + 1)
    for bit in bits:
        value[bit // 8] |= 0x80 >> bit % 8
    return _bits(bytes(value), unused=7 - highest % 8)


def _dns_name(name: str) -> bytes:
    name.encode("ascii")  # an IA5String: a name that is not ASCII raises here
    return _tlv(0x82, name.encode())  # [2] IMPLICIT IA5String


# --- certificates


def _key_id(public_key: bytes) -> bytes:
    return hashlib.sha1(public_key).digest()  # RFC 5280 4.2.1.2 method (1): an identifier, not a security check


def _certificate(
    *,
    subject: str,
    issuer: str,
    public_key: bytes,
    signer: nacl.signing.SigningKey,
    serial: int,
    not_before: datetime,
    not_after: datetime,
    extensions: Sequence[bytes],
) -> bytes:
    algorithm = _sequence(_oid(_ED25519))
    issuer_key = bytes(signer.verify_key)
    tbs = _sequence(
        _explicit(0, _integer(2)),  # v3
        _integer(serial),
        algorithm,
        _name(issuer),
        _sequence(_time(not_before), _time(not_after)),
        _name(subject),
        _sequence(algorithm, _bits(public_key)),
        _explicit(
            3,
            _sequence(
                *extensions,
                _extension(_SUBJECT_KEY_ID, _octets(_key_id(public_key))),
                _extension(_AUTHORITY_KEY_ID, _sequence(_tlv(0x80, _key_id(issuer_key)))),
            ),
        ),
    )
    return _sequence(tbs, algorithm, _bits(signer.sign(tbs).signature))


def pem(label: str, der: bytes) -> str:
    text = base64.b64encode(der).decode()
    lines = "\n".join(text[i : i + 64] for i in range(0, len(text), 64))
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----\n"


def private_key_pem(seed: bytes) -> str:
    """The Ed25519 key of `seed` as an unencrypted PKCS#8 PEM ("PRIVATE KEY", RFC 8410), as OpenSSL and Go read it."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 seed is {SEED_BYTES} bytes, got {len(seed)}")
    return pem("PRIVATE KEY", _sequence(_integer(0), _sequence(_oid(_ED25519)), _octets(_octets(seed))))


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by in the cluster; kube-apiserver calls a webhook's Service by the third."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


@dataclass(frozen=True, kw_only=True)
class ServingPair:
    """A Secret's worth (the keys cert-manager writes too): the CA, and the serving certificate and key it signed."""

    ca_crt: str
    tls_crt: str
    tls_key: str

    def secret_data(self) -> dict[str, str]:
        return {"ca.crt": self.ca_crt, "tls.crt": self.tls_crt, "tls.key": self.tls_key}


def issue_serving_pair(
    *,
    dns_names: Sequence[str],
    now: datetime,
    days: int,
    ca_seed: bytes,
    serving_seed: bytes,
    ca_serial: int,
    serving_serial: int,
) -> ServingPair:
    """A new CA (its key is used for this one signature and never kept) and a serving certificate for `dns_names`
    (the first is also its subject's common name), both valid from `now` − CLOCK_SKEW for `days` days. `now` is an
    aware UTC datetime; the seeds are 32 random bytes each, the serials random positive integers below 2**159."""
    if not dns_names:
        raise ValueError("a serving certificate needs at least one DNS name")
    if days < 1:
        raise ValueError("days must be at least 1")
    for serial in (ca_serial, serving_serial):
        if not 0 < serial < 2**159:
            raise ValueError("serial numbers are positive and at most 20 octets (RFC 5280 4.1.2.2)")
    if len(ca_seed) != SEED_BYTES or len(serving_seed) != SEED_BYTES:
        raise ValueError(f"the seeds are {SEED_BYTES} bytes")
    not_before = (now - CLOCK_SKEW).replace(microsecond=0)
    not_after = (now + timedelta(days=days)).replace(microsecond=0)
    ca_key = nacl.signing.SigningKey(ca_seed)
    ca_name = f"koordbus webhook CA {now:%Y%m%dT%H%M%SZ}"  # a new name per CA: a caBundle may hold two
    ca = _certificate(
        subject=ca_name,
        issuer=ca_name,
        public_key=bytes(ca_key.verify_key),
        signer=ca_key,
        serial=ca_serial,
        not_before=not_before,
        not_after=not_after,
        extensions=[
            _extension(_BASIC_CONSTRAINTS, _sequence(_boolean(True), _integer(0)), critical=True),
            _extension(_KEY_USAGE, _key_usage(0, 5, 6), critical=True),
        ],
    )
    serving = _certificate(
        subject=dns_names[0][:64],  # ub-common-name; the names that count are the subjectAltName's
        issuer=ca_name,
        public_key=bytes(nacl.signing.SigningKey(serving_seed).verify_key),
        signer=ca_key,
        serial=serving_serial,
        not_before=not_before,
        not_after=not_after,
        extensions=[
            _extension(_BASIC_CONSTRAINTS, _sequence(), critical=True),
            _extension(_KEY_USAGE, _key_usage(0), critical=True),
            _extension(_EXT_KEY_USAGE, _sequence(_oid(_SERVER_AUTH))),
            _extension(_SUBJECT_ALT_NAME, _sequence(*(_dns_name(n) for n in dns_names)), critical=False),
        ],
    )
    return ServingPair(
        ca_crt=pem("CERTIFICATE", ca), tls_crt=pem("CERTIFICATE", serving), tls_key=private_key_pem(serving_seed)
    )


def pem_certificates(bundle: str) -> list[str]:
    """The PEM certificates in `bundle` (a caBundle, a ca.crt), each normalised to `pem()`'s layout so that the
    same certificate compares equal however it was wrapped; anything between them is ignored."""
    found = []
    for block in _PEM_CERTIFICATE.findall(bundle):
        body = "".join(block.split("-----")[2].split())
        try:
            found.append(pem("CERTIFICATE", base64.b64decode(body, validate=True)))
        except ValueError:
            continue
    return found
