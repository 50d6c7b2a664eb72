"""Where the apiserver is and how to authenticate to it: in-cluster or from a kubeconfig.

Builds an :class:`UpstreamTarget` (server URL, TLS context, credential source; defined with
its token rotation in :mod:`watchproxy.upstream.target`, and importable from here too).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from watchproxy.upstream.execplugin import (
    ExecCredentialSource,
    ExecPluginError,
    parse_exec_spec,
)
from watchproxy.upstream.target import CredentialsError, TokenSource, UpstreamTarget

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "CredentialsError",
    "TokenSource",
    "UpstreamTarget",
    "from_kubeconfig",
    "in_cluster",
    "resolve_target",
]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


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
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(what)
            if isinstance(body, dict):
                return body
    raise CredentialsError(f"kubeconfig {path}: no {what} named {name!r}")


def _resolve(base_dir: str, value: str) -> str:
    return value if os.path.isabs(value) else os.path.join(base_dir, value)


def _ca_bytes(cluster: Mapping[str, Any], base_dir: str) -> bytes | None:
    """The cluster's CA as PEM bytes, for an exec plugin's cluster info (best effort)."""
    try:
        if cluster.get("certificate-authority-data"):
            return base64.b64decode(str(cluster["certificate-authority-data"]))
        if cluster.get("certificate-authority"):
            with open(_resolve(base_dir, str(cluster["certificate-authority"])), "rb") as handle:
                return handle.read()
    except (OSError, ValueError):
        pass  # the TLS set-up reports the same problem with its name
    return None


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
    except (ValueError, RecursionError) as exc:  # not UTF-8, a timestamp that is no date, nesting
        raise CredentialsError(f"kubeconfig {path}: invalid YAML ({type(exc).__name__})") from None
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

    cert = user.get("client-certificate")
    key = user.get("client-key")
    if user.get("client-certificate-data"):
        cert = materialize(
            str(user["client-certificate-data"]), "client.crt", "client-certificate-data"
        )
    if user.get("client-key-data"):
        key = materialize(str(user["client-key-data"]), "client.key", "client-key-data")
    cert_file = _resolve(base_dir, str(cert)) if cert else None
    key_file = _resolve(base_dir, str(key)) if key else None
    inline_cert = bool(user.get("client-certificate-data") or user.get("client-key-data"))

    def make_context() -> ssl.SSLContext:
        """The TLS settings of the kubeconfig; called again when an exec plugin gives a new
        client certificate, to hold it in a context of its own."""
        context = ssl.create_default_context()
        if cluster.get("certificate-authority-data"):
            ca_data = str(cluster["certificate-authority-data"])
            load(
                "certificate-authority-data",
                "(inline)",
                lambda: context.load_verify_locations(cadata=base64.b64decode(ca_data).decode()),
            )
        elif cluster.get("certificate-authority"):
            ca_file = _resolve(base_dir, str(cluster["certificate-authority"]))
            load(
                "certificate-authority",
                ca_file,
                lambda: context.load_verify_locations(cafile=ca_file),
            )
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert_file is not None:
            load("client-certificate", cert_file, lambda: readable(cert_file))
            if key_file is not None:
                load("client-key", key_file, lambda: readable(key_file))
            load(
                "client-certificate-data" if inline_cert else "client-certificate",
                "(inline)" if inline_cert else cert_file,
                lambda: context.load_cert_chain(cert_file, key_file),
            )
        return context

    https = server.startswith("https://")
    context_ssl = make_context() if https else None

    if user.get("auth-provider"):
        if tempdir is not None:
            tempdir.cleanup()
        raise CredentialsError(
            f"kubeconfig {path}: user of context {name!r} uses an auth-provider plugin (removed "
            "from kubectl in 1.26), which watchproxy does not run; use an exec plugin, a token, "
            "a token file or a client certificate"
        )
    exec_source: ExecCredentialSource | None = None
    if user.get("exec"):
        try:
            spec = parse_exec_spec(
                user["exec"],
                base_dir=base_dir,
                cluster=cluster,
                ca_data=_ca_bytes(cluster, base_dir),
            )
        except ExecPluginError as error:
            if tempdir is not None:
                tempdir.cleanup()
            raise CredentialsError(
                f"kubeconfig {path}: user of context {name!r}: {error}"
            ) from None
        exec_source = ExecCredentialSource(spec)
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
        exec_source=exec_source,
        _tempdir=tempdir,
        _ssl_factory=make_context if https else None,
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
