"""Throwaway certificate authorities and certificates for TLS tests, made with the `openssl` command-line tool.

`CertificateAuthority.create(dir, name)` makes a self-signed CA; `.issue(name, server=…)` a key and a certificate
it signs, for a server (serverAuth, SAN localhost and 127.0.0.1) or a client (clientAuth). Used by
tests/security/test_extender_door_tls.py.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    directory: Path
    name: str

    @property
    def cert(self) -> Path:
        return self.directory / f"{self.name}-ca.crt"

    @property
    def key(self) -> Path:
        return self.directory / f"{self.name}-ca.key"

    @classmethod
    def create(cls, directory: Path, name: str) -> CertificateAuthority:
        ca = cls(directory, name)
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(ca.key), "-out", str(ca.cert), "-days", "2", "-subj", f"/CN={name} test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return ca

    def issue(self, name: str, *, server: bool) -> Issued:
        key, csr, cert = (self.directory / f"{name}.{suffix}" for suffix in ("key", "csr", "crt"))
        extensions = self.directory / f"{name}.ext"
        usage = "serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1" if server else "clientAuth"
        extensions.write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
            f"extendedKeyUsage={usage}\n"
        )
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(extensions),
        )  # fmt: skip
        return Issued(cert=cert, key=key)
