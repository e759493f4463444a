"""Ed25519 X.509 certificates and PKCS#8 keys for `koordbus up`'s local mutual TLS (the load-aware extender), made
without openssl or the cryptography package, which a bare machine running `make up` may not have: a DER encoder for
the few ASN.1 types a certificate needs and `certificate`, which builds and signs one (RFC 5280 profile; Ed25519 keys
and signatures as RFC 8410 names them, signed with PyNaCl, already a dependency for NATS keys).

Pure: keys are 32-byte seeds, validity times and serial numbers are parameters. Called by koordbus.extender;
tests/unit/test_x509.py checks the output with `openssl verify` and a mutual-TLS handshake through Python's ssl.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

import nacl.signing

ED25519: Final = "1.3.101.112"
_COMMON_NAME: Final = "2.5.4.3"
_SUBJECT_KEY_ID: Final = "2.5.29.14"
_KEY_USAGE: Final = "2.5.29.15"
_SUBJECT_ALT_NAME: Final = "2.5.29.17"
_BASIC_CONSTRAINTS: Final = "2.5.29.19"
_AUTHORITY_KEY_ID: Final = "2.5.29.35"
_EXT_KEY_USAGE: Final = "2.5.29.37"
_SERVER_AUTH: Final = "1.3.6.1.5.5.7.3.1"
_CLIENT_AUTH: Final = "1.3.6.1.5.5.7.3.2"

Role = Literal["ca", "server", "client"]


# --- DER (X.690): tag, length, content


def _tlv(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes((tag, size)) + content
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(length))) + length + content


def _sequence(*items: bytes) -> bytes:
    return _tlv(0x30, b"".join(items))


def _integer(value: int) -> bytes:
    if value < 0:
        raise ValueError("only non-negative integers are encoded here")
    return _tlv(0x02, value.to_bytes(value.bit_length() // 8 + 1, "big"))  # a leading 0 keeps the sign bit clear


def _oid(dotted: str) -> bytes:
    first, second, *rest = (int(part) for part in dotted.split("."))
    out = bytearray((40 * first + second,))
    for arc in rest:
        chunk = [arc & 0x7F]
        while arc := arc >> 7:
            chunk.append(0x80 | (arc & 0x7F))
        out += bytes(reversed(chunk))
    return _tlv(0x06, bytes(out))


def _time(at: float) -> bytes:
    when = dt.datetime.fromtimestamp(int(at), dt.UTC)
    if 1950 <= when.year < 2050:  # RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime after
        return _tlv(0x17, when.strftime("%y%m%d%H%M%SZ").encode())
    return _tlv(0x18, when.strftime("%Y%m%d%H%M%SZ").encode())


def _bits(data: bytes, unused: int = 0) -> bytes:
    return _tlv(0x03, bytes((unused,)) + data)


def _octets(data: bytes) -> bytes:
    return _tlv(0x04, data)


def _name(common_name: str) -> bytes:
    return _sequence(_tlv(0x31, _sequence(_oid(_COMMON_NAME), _tlv(0x0C, common_name.encode()))))


def _extension(oid: str, value: bytes, *, critical: bool = False) -> bytes:
    flag = _tlv(0x01, b"\xff") if critical else b""
    return _sequence(_oid(oid), flag, _octets(value))


_ALGORITHM: Final = _sequence(_oid(ED25519))


# --- keys


def public_key(seed: bytes) -> bytes:
    """The Ed25519 public key of a 32-byte seed."""
    return bytes(nacl.signing.SigningKey(seed).verify_key)


def private_key_pem(seed: bytes) -> str:
    """The seed as a PKCS#8 PEM private key (RFC 8410 §7), as `openssl genpkey -algorithm ed25519` writes one."""
    der = _sequence(_integer(0), _ALGORITHM, _octets(_octets(seed)))
    return _pem("PRIVATE KEY", der)


def _spki(seed: bytes) -> bytes:
    return _sequence(_ALGORITHM, _bits(public_key(seed)))


def key_id(seed: bytes) -> bytes:
    """The key identifier of RFC 5280 §4.2.1.2 method 1: SHA-1 of the public key's bits."""
    return hashlib.sha1(public_key(seed), usedforsecurity=False).digest()


# --- certificates


@dataclass(frozen=True, kw_only=True)
class Subject:
    """Who a certificate is for: its common name, key seed, and (for a server) the names it answers to."""

    name: str
    seed: bytes
    hosts: Sequence[str] = ()
    """DNS names and IP addresses for the subjectAltName (a server's)."""


def certificate(
    subject: Subject, *, role: Role, issuer: Subject, serial: int, not_before: float, not_after: float
) -> str:
    """A PEM certificate for `subject` signed by `issuer` (the subject itself for a CA's self-signed one): a CA
    (basicConstraints CA, keyCertSign), a server (serverAuth, subjectAltName from its hosts) or a client
    (clientAuth)."""
    if len(subject.seed) != 32 or len(issuer.seed) != 32:
        raise ValueError("an Ed25519 key seed is 32 bytes")
    if role == "ca":
        extensions = [
            _extension(_BASIC_CONSTRAINTS, _sequence(_tlv(0x01, b"\xff")), critical=True),
            _extension(_KEY_USAGE, _bits(b"\x06", unused=1), critical=True),  # keyCertSign, cRLSign
            _extension(_SUBJECT_KEY_ID, _octets(key_id(subject.seed))),
        ]
    else:
        usage = _SERVER_AUTH if role == "server" else _CLIENT_AUTH
        extensions = [
            _extension(_BASIC_CONSTRAINTS, _sequence(), critical=True),
            _extension(_KEY_USAGE, _bits(b"\x80", unused=7), critical=True),  # digitalSignature
            _extension(_EXT_KEY_USAGE, _sequence(_oid(usage))),
            _extension(_SUBJECT_KEY_ID, _octets(key_id(subject.seed))),
            _extension(_AUTHORITY_KEY_ID, _sequence(_tlv(0x80, key_id(issuer.seed)))),
        ]
        if role == "server":
            extensions.append(_extension(_SUBJECT_ALT_NAME, _sequence(*map(_general_name, subject.hosts))))
    tbs = _sequence(
        _tlv(0xA0, _integer(2)),  # v3
        _integer(serial),
        _ALGORITHM,
        _name(issuer.name),
        _sequence(_time(not_before), _time(not_after)),
        _name(subject.name),
        _spki(subject.seed),
        _tlv(0xA3, _sequence(*extensions)),
    )
    signature = nacl.signing.SigningKey(issuer.seed).sign(tbs).signature
    return _pem("CERTIFICATE", _sequence(tbs, _ALGORITHM, _bits(signature)))


def _general_name(host: str) -> bytes:
    try:
        return _tlv(0x87, ipaddress.ip_address(host).packed)  # iPAddress [7]
    except ValueError:
        return _tlv(0x82, host.encode("ascii"))  # dNSName [2]


def _pem(label: str, der: bytes) -> str:
    text = base64.b64encode(der).decode()
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----", ""])
