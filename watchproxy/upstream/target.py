"""What watchproxy presents to the apiserver: its address, TLS settings and credential.

An :class:`UpstreamTarget` gives each request its ``Authorization`` header: a bearer token (a
:class:`TokenSource`), basic auth, or an exec plugin's credential (which may also bring a client
certificate). Token files are re-read periodically because projected ServiceAccount tokens
rotate; the last good token is kept when a read fails, and a 401 forces an early re-read.
Building a target from the pod or a kubeconfig: :mod:`watchproxy.upstream.credentials`.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from watchproxy.upstream.execplugin import ExecCredentialSource, ExecPluginError

log = logging.getLogger("watchproxy.credentials")


class CredentialsError(Exception):
    """The upstream cannot be configured (missing file, bad kubeconfig, unsupported auth)."""


class TokenSource:
    """A bearer token: fixed, or read from a file and refreshed every ``reload_seconds``.

    ``token()`` never raises after the first successful read: if the file vanishes or cannot
    be read, the last good token is kept until a read succeeds again.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        path: str | None = None,
        reload_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (token is None) == (path is None):
            raise ValueError("give exactly one of token or path")
        self._token = token
        self._path = path
        self._reload = reload_seconds
        self._clock = clock
        self._read_at: float | None = None
        self.read_failures = 0
        if path is not None:
            self._read(initial=True)

    @property
    def path(self) -> str | None:
        return self._path

    def _read(self, *, initial: bool = False) -> None:
        assert self._path is not None
        self._read_at = self._clock()
        try:
            with open(self._path, encoding="utf-8") as handle:
                value = handle.read().strip()
        except OSError as exc:
            self.read_failures += 1
            if initial:
                raise CredentialsError(
                    f"cannot read token file {self._path}: {exc.strerror}"
                ) from None
            return
        if value:
            self._token = value
        elif initial:
            raise CredentialsError(f"token file {self._path} is empty")
        else:
            self.read_failures += 1

    def token(self) -> str:
        if self._path is not None and (
            self._read_at is None or self._clock() - self._read_at >= self._reload
        ):
            self._read()
        assert self._token is not None
        return self._token

    def invalidate(self) -> None:
        """Called on a 401: the next ``token()`` re-reads the file at once."""
        if self._path is not None:
            self._read_at = None


@dataclass
class UpstreamTarget:
    """The apiserver's address, the TLS settings to reach it, and the credential to send."""

    server: str
    ssl_context: ssl.SSLContext | None
    token: TokenSource | None = None
    basic_auth: tuple[str, str] | None = None
    namespace: str = "default"
    source: str = ""
    exec_source: ExecCredentialSource | None = None
    _tempdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)
    _ssl_factory: Callable[[], ssl.SSLContext] | None = field(default=None, repr=False)

    def auth_header(self) -> str | None:
        if self.exec_source is not None and self.exec_source.token is not None:
            return f"Bearer {self.exec_source.token}"
        if self.token is not None:
            return f"Bearer {self.token.token()}"
        if self.basic_auth is not None:
            raw = f"{self.basic_auth[0]}:{self.basic_auth[1]}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    async def refresh(self, *, strict: bool = False) -> None:
        """Make the credential current before a request: runs the exec plugin when its
        credential is missing, expired or refused. ``strict`` (start-up) raises
        CredentialsError if the plugin fails; otherwise the last credential stays in use."""
        if self.exec_source is None:
            return
        try:
            changed = await self.exec_source.refresh(strict=strict)
        except ExecPluginError as error:
            raise CredentialsError(f"{self.source}: {error}") from None
        credential = self.exec_source.credential
        if changed and credential is not None and credential.client_certificate_pem:
            self._use_client_certificate(
                credential.client_certificate_pem, credential.client_key_pem or "", strict=strict
            )

    def _use_client_certificate(self, cert_pem: str, key_pem: str, *, strict: bool) -> None:
        # A new context rather than the old one reloaded: requests name their SSL context, and
        # the connection pool keys on it, so the new certificate goes out on new connections
        # while the old ones drain.
        if self._ssl_factory is None:
            return  # plain http: no TLS to present a certificate on
        if self._tempdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="watchproxy-")
        cert_file = os.path.join(self._tempdir.name, "exec-client.crt")
        key_file = os.path.join(self._tempdir.name, "exec-client.key")
        try:
            for file, pem in ((cert_file, cert_pem), (key_file, key_pem)):
                fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w", encoding="ascii") as handle:
                    handle.write(pem)
            context = self._ssl_factory()
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ValueError, ssl.SSLError, CredentialsError) as error:
            message = f"{self.source}: exec plugin client certificate unusable: {error}"
            if strict:
                raise CredentialsError(message) from None
            log.warning("%s; keeping the last one", message)
            return
        finally:
            for file in (cert_file, key_file):
                with contextlib.suppress(OSError):
                    os.unlink(file)  # the key stays on disk only while it is loaded
        self.ssl_context = context

    def invalidate(self, sent_auth: str | None) -> bool:
        """The apiserver answered 401 to a request sent with ``sent_auth``: arrange for a fresh
        credential. True if a retry can bring a different one (exec plugin, token file)."""
        if self.exec_source is not None:
            sent = (
                sent_auth[len("Bearer ") :]
                if sent_auth and sent_auth.startswith("Bearer ")
                else None
            )
            self.exec_source.invalidate(sent)
            return True
        if self.token is not None and self.token.path is not None:
            self.token.invalidate()
            return True
        return False

    def close(self) -> None:
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None
