"""NATS nkeys: ed25519 keys written the way nats-server reads them (a type prefix byte, the key, a CRC-16, in base32
without padding: `A…` an account's public key, `SA…` its seed, `U…` a user, `N…` a server).

The auth callout signs its answers with an account key (bus.natsjwt) and `koordbus creds ensure-cluster-secret` makes
that key; both go through here. Pure: randomness comes in as the 32 seed bytes.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from enum import IntEnum

import nacl.exceptions
import nacl.signing

SEED_BYTES = 32


class Prefix(IntEnum):
    """The first byte of an encoded key names its kind (the letter a key starts with)."""

    SEED = 18 << 3  # S
    SERVER = 13 << 3  # N
    OPERATOR = 14 << 3  # O
    ACCOUNT = 0  # A
    USER = 20 << 3  # U


class NkeyError(ValueError):
    """Not a well-formed nkey of the expected kind."""


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum nkeys append."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> str:
    checked = raw + _crc16(raw).to_bytes(2, "little")
    return base64.b32encode(checked).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        checked = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as e:
        raise NkeyError(f"not an nkey (base32): {e}") from None
    if len(checked) < 4:
        raise NkeyError("not an nkey: too short")
    raw, crc = checked[:-2], int.from_bytes(checked[-2:], "little")
    if _crc16(raw) != crc:
        raise NkeyError("not an nkey: checksum mismatch")
    return raw


def encode_public(prefix: Prefix, key: bytes) -> str:
    return _encode(bytes([prefix]) + key)


def decode_public(text: str, prefix: Prefix) -> bytes:
    """The 32 key bytes of a public nkey of kind `prefix`; NkeyError otherwise."""
    raw = _decode(text)
    if len(raw) != 33 or raw[0] != prefix:
        raise NkeyError(f"not a public {prefix.name.lower()} nkey: {text[:8]}…")
    return raw[1:]


def is_public(text: str, prefix: Prefix) -> bool:
    try:
        decode_public(text, prefix)
    except NkeyError:
        return False
    return True


@dataclass(frozen=True)
class KeyPair:
    """A signing key of one kind; `seed` is its secret (`S` + kind letter + …), `public_key` what others verify with."""

    prefix: Prefix
    raw_seed: bytes

    @property
    def seed(self) -> str:
        first = Prefix.SEED | (self.prefix >> 5)
        second = (self.prefix & 31) << 3
        return _encode(bytes([first, second]) + self.raw_seed)

    @property
    def public_key(self) -> str:
        return encode_public(self.prefix, bytes(nacl.signing.SigningKey(self.raw_seed).verify_key))

    def sign(self, data: bytes) -> bytes:
        return nacl.signing.SigningKey(self.raw_seed).sign(data).signature


def from_random(prefix: Prefix, random_bytes: bytes) -> KeyPair:
    """A key pair from 32 random bytes (secrets.token_bytes(32) at the caller)."""
    if len(random_bytes) != SEED_BYTES:
        raise NkeyError(f"a seed is {SEED_BYTES} bytes, got {len(random_bytes)}")
    return KeyPair(prefix, bytes(random_bytes))


def from_seed(seed: str) -> KeyPair:
    """The key pair an encoded seed (`SA…`, `SU…`, …) holds; NkeyError naming what is wrong otherwise."""
    raw = _decode(seed.strip())
    if len(raw) != 2 + SEED_BYTES or (raw[0] & 0xF8) != Prefix.SEED:
        raise NkeyError("not an nkey seed")
    kind = ((raw[0] & 7) << 5) | (raw[1] >> 3)
    try:
        prefix = Prefix(kind)
    except ValueError:
        raise NkeyError(f"unknown nkey seed kind {kind}") from None
    return KeyPair(prefix, raw[2:])


def verify(public_key: str, prefix: Prefix, data: bytes, signature: bytes) -> bool:
    """Whether `signature` over `data` is by `public_key` (a public nkey of kind `prefix`)."""
    try:
        key = nacl.signing.VerifyKey(decode_public(public_key, prefix))
        key.verify(data, signature)
    except (NkeyError, nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError):
        return False
    return True
