"""X.509 certificates made with PyNaCl alone: koordbus's own small certificate authorities.

Two callers make a CA and certificates it signs: `koordbus certs webhook` (koordbus.certs, the Helm chart's hook
Job) the admission webhook's CA and serving certificate for its Service's DNS names (`issue_serving_pair`), and
`koordbus up` (koordbus.extender) the load-aware extender's mutual TLS: a CA, a serving certificate for local DNS
names and IP addresses and a client certificate for kube-scheduler (`certificate` for each). Neither the image nor a
bare machine running `make up` is guaranteed `openssl`, and koordbus does not depend on `cryptography`, so the
certificates are Ed25519 (RFC 8410, signed by libsodium through PyNaCl, which the NATS keys already use: bus.nkeys)
and DER-encoded here, the few ASN.1 types a certificate needs. One profile (RFC 5280) for every certificate: a CA
(basicConstraints CA with pathlen 0, keyCertSign), a server (serverAuth, subjectAltName) or a client (clientAuth),
each with key identifiers, so that OpenSSL's strict checks and Go's crypto/x509 (kube-apiserver) accept them;
tests/unit/test_x509.py has OpenSSL verify them and shake hands with them, tests/deploy/test_webhook_certs.py Go.
services.k8s.webhook_certs reads caBundles with `pem_certificates`.

Pure: the times, the key seeds and the serial numbers are parameters.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

import nacl.signing

SEED_BYTES: Final = 32
CLOCK_SKEW: Final = timedelta(hours=1)
"""A serving pair's notBefore is this far before `now`: a node whose clock is a little behind still accepts it."""

Role = Literal["ca", "server", "client"]

_ED25519 = (1, 3, 101, 112)
_COMMON_NAME = (2, 5, 4, 3)
_SUBJECT_KEY_ID = (2, 5, 29, 14)
_KEY_USAGE = (2, 5, 29, 15)
_SUBJECT_ALT_NAME = (2, 5, 29, 17)
_BASIC_CONSTRAINTS = (2, 5, 29, 19)
_AUTHORITY_KEY_ID = (2, 5, 29, 35)
_EXT_KEY_USAGE = (2, 5, 29, 37)
_SERVER_AUTH = (1, 3, 6, 1, 5, 5, 7, 3, 1)
_CLIENT_AUTH = (1, 3, 6, 1, 5, 5, 7, 3, 2)
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
    """UTCTime from 1950 through 2049, GeneralizedTime otherwise (RFC 5280 4.1.2.5); whole seconds."""
    if moment.utcoffset() != timedelta(0):
        raise ValueError("certificate times are UTC")
    if 1950 <= moment.year < 2050:
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


def _general_name(host: str) -> bytes:
    """A subjectAltName entry: an iPAddress [7] for an IPv4 or IPv6 address, else a dNSName [2] (an IA5String: a
    name that is not ASCII raises UnicodeEncodeError)."""
    try:
        return _tlv(0x87, ipaddress.ip_address(host).packed)
    except ValueError:
        return _tlv(0x82, host.encode("ascii"))


# --- keys


def _check_seed(seed: bytes) -> None:
    if len(seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 key seed is {SEED_BYTES} bytes, got {len(seed)}")


def _key_id(public_key: bytes) -> bytes:
    return hashlib.sha1(public_key, usedforsecurity=False).digest()  # RFC 5280 4.2.1.2 method (1): an identifier


def pem(label: str, der: bytes) -> str:
    text = base64.b64encode(der).decode()
    lines = "\n".join(text[i : i + 64] for i in range(0, len(text), 64))
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----\n"


def private_key_pem(seed: bytes) -> str:
    """The Ed25519 key of `seed` as an unencrypted PKCS#8 PEM ("PRIVATE KEY", RFC 8410), as OpenSSL and Go read it."""
    _check_seed(seed)
    return pem("PRIVATE KEY", _sequence(_integer(0), _sequence(_oid(_ED25519)), _octets(_octets(seed))))


# --- certificates


@dataclass(frozen=True, kw_only=True)
class Subject:
    """Who a certificate is for: its common name (at most 64 characters), its key's seed and, for a server, the DNS
    names and IP addresses it answers to (its subjectAltName)."""

    name: str
    seed: bytes
    hosts: Sequence[str] = ()


def certificate(
    subject: Subject, *, role: Role, issuer: Subject, serial: int, not_before: datetime, not_after: datetime
) -> str:
    """A PEM certificate for `subject` signed by `issuer` (the subject itself for a CA's self-signed one), valid
    from `not_before` to `not_after` (aware UTC datetimes, whole seconds): a CA (basicConstraints CA, pathlen 0:
    it signs leaves only; keyCertSign, cRLSign), a server (serverAuth, subjectAltName from its hosts, at least one)
    or a client (clientAuth). `serial` is a positive integer below 2**159 (at most 20 octets, RFC 5280 4.1.2.2)."""
    _check_seed(subject.seed)
    _check_seed(issuer.seed)
    if not 0 < serial < 2**159:
        raise ValueError("serial numbers are positive and at most 20 octets (RFC 5280 4.1.2.2)")
    if not_after <= not_before:
        raise ValueError("a certificate's notAfter is after its notBefore")
    if role == "ca":
        extensions = [
            _extension(_BASIC_CONSTRAINTS, _sequence(_boolean(True), _integer(0)), critical=True),
            _extension(_KEY_USAGE, _key_usage(0, 5, 6), critical=True),
        ]
    else:
        extensions = [
            _extension(_BASIC_CONSTRAINTS, _sequence(), critical=True),
            _extension(_KEY_USAGE, _key_usage(0), critical=True),
            _extension(_EXT_KEY_USAGE, _sequence(_oid(_SERVER_AUTH if role == "server" else _CLIENT_AUTH))),
        ]
    if role == "server":
        if not subject.hosts:
            raise ValueError("a server certificate needs at least one DNS name or IP address")
        extensions.append(_extension(_SUBJECT_ALT_NAME, _sequence(*map(_general_name, subject.hosts))))
    signer = nacl.signing.SigningKey(issuer.seed)
    public_key = bytes(nacl.signing.SigningKey(subject.seed).verify_key)
    algorithm = _sequence(_oid(_ED25519))
    tbs = _sequence(
        _explicit(0, _integer(2)),  # v3
        _integer(serial),
        algorithm,
        _name(issuer.name),
        _sequence(_time(not_before), _time(not_after)),
        _name(subject.name),
        _sequence(algorithm, _bits(public_key)),
        _explicit(
            3,
            _sequence(
                *extensions,
                _extension(_SUBJECT_KEY_ID, _octets(_key_id(public_key))),
                _extension(_AUTHORITY_KEY_ID, _sequence(_tlv(0x80, _key_id(bytes(signer.verify_key))))),
            ),
        ),
    )
    return pem("CERTIFICATE", _sequence(tbs, algorithm, _bits(signer.sign(tbs).signature)))


# --- the admission webhook's serving pair


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
    aware UTC datetime; the seeds are SEED_BYTES random bytes each, the serials random positive integers below
    2**159."""
    if days < 1:
        raise ValueError("days must be at least 1")
    validity = {
        "not_before": (now - CLOCK_SKEW).replace(microsecond=0),
        "not_after": (now + timedelta(days=days)).replace(microsecond=0),
    }
    ca_name = f"koordbus webhook CA {now:%Y%m%dT%H%M%SZ}"  # a new name per CA: a caBundle may hold two
    ca = Subject(name=ca_name, seed=ca_seed)
    common_name = dns_names[0][:64] if dns_names else ""  # ub-common-name; the names that count are the SAN's
    serving = Subject(name=common_name, seed=serving_seed, hosts=dns_names)  # no name: `certificate` refuses it
    return ServingPair(
        ca_crt=certificate(ca, role="ca", issuer=ca, serial=ca_serial, **validity),
        tls_crt=certificate(serving, role="server", issuer=ca, serial=serving_serial, **validity),
        tls_key=private_key_pem(serving_seed),
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
