"""Where the apiserver is and how to authenticate to it: in-cluster or from a kubeconfig.

Builds an :class:`UpstreamTarget` (server URL, TLS context, credential source). Token files
are re-read periodically because projected ServiceAccount tokens rotate; the last good token is
kept when a read fails, and a 401 forces an early re-read.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


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
    _tempdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def auth_header(self) -> str | None:
        if self.token is not None:
            return f"Bearer {self.token.token()}"
        if self.basic_auth is not None:
            raw = f"{self.basic_auth[0]}:{self.basic_auth[1]}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    def close(self) -> None:
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None


def in_cluster(
    env: Mapping[str, str],
    *,
    reload_seconds: float = 60.0,
    sa_dir: str = SERVICE_ACCOUNT_DIR,
) -> UpstreamTarget:
    host = env.get("KUBERNETES_SERVICE_HOST")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise CredentialsError("in-cluster mode needs KUBERNETES_SERVICE_HOST")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    ca_path = os.path.join(sa_dir, "ca.crt")
    try:
        context = ssl.create_default_context(cafile=ca_path)
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"cannot load the ServiceAccount CA {ca_path}: {exc}") from None
    namespace = "default"
    try:
        with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as handle:
            namespace = handle.read().strip() or "default"
    except OSError:
        pass
    token = TokenSource(path=os.path.join(sa_dir, "token"), reload_seconds=reload_seconds)
    return UpstreamTarget(
        server=f"https://{host}:{port}",
        ssl_context=context,
        token=token,
        namespace=namespace,
        source="in-cluster",
    )


def _named(entries: Any, name: str, what: str, path: str) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(what)
            if isinstance(body, dict):
                return body
    raise CredentialsError(f"kubeconfig {path}: no {what} named {name!r}")


def _resolve(base_dir: str, value: str) -> str:
    return value if os.path.isabs(value) else os.path.join(base_dir, value)


def from_kubeconfig(
    path: str, *, context: str | None = None, reload_seconds: float = 60.0
) -> UpstreamTarget:
    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
    except OSError as exc:
        raise CredentialsError(f"cannot read kubeconfig {path}: {exc.strerror}") from None
    except yaml.YAMLError:
        raise CredentialsError(f"kubeconfig {path}: invalid YAML") from None
    if not isinstance(doc, dict):
        raise CredentialsError(f"kubeconfig {path}: not a kubeconfig")
    name = context or doc.get("current-context")
    if not name:
        raise CredentialsError(f"kubeconfig {path}: no current-context and no --context given")
    ctx = _named(doc.get("contexts"), name, "context", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user: dict[str, Any] = {}
    if ctx.get("user"):
        user = _named(doc.get("users"), str(ctx["user"]), "user", path)
    base_dir = os.path.dirname(os.path.abspath(path))
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise CredentialsError(f"kubeconfig {path}: cluster of context {name!r} has no server")
    server = server.rstrip("/")

    tempdir: tempfile.TemporaryDirectory[str] | None = None

    def materialize(data_b64: str, filename: str, what: str) -> str:
        nonlocal tempdir
        try:
            data = base64.b64decode(data_b64)
        except ValueError:
            if tempdir is not None:
                tempdir.cleanup()
            raise CredentialsError(f"kubeconfig {path}: {what}: not valid base64") from None
        if tempdir is None:
            tempdir = tempfile.TemporaryDirectory(prefix="watchproxy-")
        target = os.path.join(tempdir.name, filename)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return target

    def load(what: str, file: str, action: Callable[[], None]) -> None:
        """Run one TLS loading step; a failure names the kubeconfig field and its file."""
        try:
            action()
        except OSError as exc:
            reason = exc.strerror or str(exc)
        except (ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or str(exc)
        else:
            return
        if tempdir is not None:
            tempdir.cleanup()
        raise CredentialsError(f"kubeconfig {path}: {what} {file}: {reason}")

    def readable(file: str) -> None:
        with open(file, "rb"):
            pass

    context_ssl: ssl.SSLContext | None = None
    if server.startswith("https://"):
        context_ssl = ssl.create_default_context()
        verify = context_ssl
        if cluster.get("certificate-authority-data"):
            ca_data = str(cluster["certificate-authority-data"])
            load(
                "certificate-authority-data",
                "(inline)",
                lambda: verify.load_verify_locations(cadata=base64.b64decode(ca_data).decode()),
            )
        elif cluster.get("certificate-authority"):
            ca_file = _resolve(base_dir, str(cluster["certificate-authority"]))
            load(
                "certificate-authority",
                ca_file,
                lambda: verify.load_verify_locations(cafile=ca_file),
            )
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        cert = user.get("client-certificate")
        key = user.get("client-key")
        if user.get("client-certificate-data"):
            cert = materialize(
                str(user["client-certificate-data"]), "client.crt", "client-certificate-data"
            )
        if user.get("client-key-data"):
            key = materialize(str(user["client-key-data"]), "client.key", "client-key-data")
        if cert:
            cert_file = _resolve(base_dir, str(cert))
            key_file = _resolve(base_dir, str(key)) if key else None
            load("client-certificate", cert_file, lambda: readable(cert_file))
            if key_file is not None:
                load("client-key", key_file, lambda: readable(key_file))
            inline = bool(user.get("client-certificate-data") or user.get("client-key-data"))
            load(
                "client-certificate-data" if inline else "client-certificate",
                "(inline)" if inline else cert_file,
                lambda: verify.load_cert_chain(cert_file, key_file),
            )

    if user.get("exec") or user.get("auth-provider"):
        raise CredentialsError(
            f"kubeconfig {path}: user of context {name!r} uses an exec/auth-provider plugin, "
            "which watchproxy does not run; use a token, token file or client certificate"
        )
    token: TokenSource | None = None
    if user.get("token"):
        token = TokenSource(token=str(user["token"]))
    elif user.get("tokenFile"):
        token = TokenSource(
            path=_resolve(base_dir, str(user["tokenFile"])), reload_seconds=reload_seconds
        )
    basic = None
    if user.get("username") and user.get("password"):
        basic = (str(user["username"]), str(user["password"]))
    return UpstreamTarget(
        server=server,
        ssl_context=context_ssl,
        token=token,
        basic_auth=basic,
        namespace=str(ctx.get("namespace") or "default"),
        source=f"kubeconfig {path} context {name}",
        _tempdir=tempdir,
    )


def resolve_target(
    mode: str,
    *,
    kubeconfig: str | None,
    context: str | None,
    env: Mapping[str, str],
    reload_seconds: float = 60.0,
) -> UpstreamTarget:
    """Pick in-cluster or kubeconfig as ``mode`` says ("auto": in-cluster when it is there)."""
    if mode == "in-cluster" or (
        mode == "auto" and env.get("KUBERNETES_SERVICE_HOST") and not kubeconfig
    ):
        return in_cluster(env, reload_seconds=reload_seconds)
    path = kubeconfig or (env.get("KUBECONFIG", "").split(os.pathsep)[0] or None)
    if path is None:
        path = os.path.join(os.path.expanduser("~"), ".kube", "config")
    return from_kubeconfig(path, context=context, reload_seconds=reload_seconds)
