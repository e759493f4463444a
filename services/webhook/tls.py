"""The webhook's serving certificate, reloaded when its files change, without a restart or a dropped connection.

kube-apiserver reaches the webhook over HTTPS with the certificate a Secret holds (cert-manager renews it, kubelet
updates the mounted files by swapping a symlink). `ServingCertificate` loads the pair into an SSLContext and serves
it through `server_context`, the one context the HTTP server is given: its SNI callback, which OpenSSL calls for
every handshake (with or without a server name), hands the connection the newest context. `check` compares each
file's (inode, size, mtime) with what was loaded (os.stat follows the symlink, so kubelet's swap is seen) and, when
one changed, loads the pair into a new context; a pair that does not load (a half-written file, a key that is not
the certificate's) keeps the one in use, is logged once and retried at every check. Established connections keep the
certificate they shook hands with. Used by koordbus.webhook; tested with two CAs by tests/integration/
test_webhook_service.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from typing import Final

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int, int], ...]


class ServingCertificate:
    """The certificate and key (PEM files) a server presents, optionally requiring client certificates from a CA."""

    def __init__(self, cert_file: str, key_file: str, *, client_ca_file: str = "") -> None:
        """Loads the pair at once: ssl.SSLError or OSError when it does not load (the process must not start)."""
        self._files: Final = tuple(f for f in (cert_file, key_file, client_ca_file) if f)
        self._cert_file, self._key_file, self._client_ca_file = cert_file, key_file, client_ca_file
        self._stamp = self._stat()
        self._current = self._load()
        self.server_context: Final = self._current
        """The context to serve with; every handshake switches to the newest loaded context."""
        self.server_context.sni_callback = self._choose
        self._refused: Stamp | None = None
        """The changed files' stamp that did not load (warned once; retried quietly while it stays so)."""
        self.reloads = 0
        self.failures = 0

    def _stat(self) -> Stamp:
        stamps = []
        for path in self._files:
            found = os.stat(path)
            stamps.append((found.st_ino, found.st_size, found.st_mtime_ns))
        return tuple(stamps)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert_file, self._key_file)
        if self._client_ca_file:
            context.load_verify_locations(self._client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _choose(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        if self._current is not self.server_context:
            connection.context = self._current

    def check(self) -> bool | None:
        """Reload when a file changed: True reloaded, False a changed pair that does not load (the old one stays),
        None nothing changed."""
        try:
            stamp = self._stat()
        except OSError as err:
            return self._failed(f"cannot read the files: {err}")
        if stamp == self._stamp:
            return None
        try:
            loaded = self._load()
        except (OSError, ssl.SSLError) as err:
            if stamp == self._refused:
                return False
            self._refused = stamp
            return self._failed(f"the changed pair does not load: {err}")
        self._current, self._stamp, self._refused = loaded, stamp, None
        self.reloads += 1
        log.info("webhook: serving the certificate from %s anew (it changed)", self._cert_file)
        return True

    def _failed(self, why: str) -> bool:
        self.failures += 1
        log.warning("webhook: %s; still serving the certificate loaded before (%s)", why, self._cert_file)
        return False

    async def watch(self, every_seconds: float) -> None:
        """`check` every `every_seconds`, until cancelled."""
        while True:
            await asyncio.sleep(every_seconds)
            self.check()
