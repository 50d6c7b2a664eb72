"""Kubeconfig exec plugins (``client.authentication.k8s.io/v1`` and ``v1beta1``), run as kubectl
runs them: GKE's gke-gcloud-auth-plugin, ``aws eks get-token``, kubelogin, and the like.

The plugin gets the kubeconfig's ``args`` and ``env`` on top of the proxy's environment, and
``KUBERNETES_EXEC_INFO`` with ``spec.interactive`` and, when ``provideClusterInfo`` is set, the
cluster. Its standard input is the proxy's only when it may be interactive; its standard error
passes through. Its answer (an ``ExecCredential``) holds a token and/or a client certificate and
key, kept until ``expirationTimestamp`` (for ever without one) or until the apiserver answers 401.
The token is never logged, and the plugin's output never appears in an error message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger("watchproxy.credentials")

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")
# A plugin may open a browser and wait for a login; none should take longer than this.
RUN_TIMEOUT_SECONDS = 120.0
# After a failed run, requests keep the last credential and the plugin is not run again sooner.
RETRY_AFTER_FAILURE_SECONDS = 5.0
CLUSTER_EXTENSION = "client.authentication.k8s.io/exec"


class ExecPluginError(Exception):
    """The exec plugin is misconfigured, failed, or answered something unusable (one line)."""


@dataclass(frozen=True)
class ExecSpec:
    """The ``users[].user.exec`` block of a kubeconfig, checked."""

    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    interactive_mode: str = "IfAvailable"
    install_hint: str | None = None
    cluster: Mapping[str, Any] | None = None  # sent only with provideClusterInfo


@dataclass(frozen=True)
class ExecCredential:
    token: str | None
    client_certificate_pem: str | None
    client_key_pem: str | None
    expires_at: float | None  # seconds since the epoch; None: until a 401


def parse_exec_spec(
    block: Any, *, base_dir: str, cluster: Mapping[str, Any], ca_data: bytes | None
) -> ExecSpec:
    """Check an exec block as client-go does. A relative command with a ``/`` is relative to the
    kubeconfig's directory; a bare name is looked up on PATH when it runs."""
    if not isinstance(block, Mapping):
        raise ExecPluginError("exec: expected a mapping")
    api_version = block.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ExecPluginError(
            f"exec: apiVersion {api_version!r} is not supported (use {' or '.join(API_VERSIONS)})"
        )
    command = block.get("command")
    if not isinstance(command, str) or not command:
        raise ExecPluginError("exec: command is required")
    if "/" in command and not os.path.isabs(command):
        command = os.path.join(base_dir, command)
    args = block.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ExecPluginError("exec: args must be a list of strings")
    env: list[tuple[str, str]] = []
    for item in block.get("env") or []:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ExecPluginError("exec: env entries need a name and a value")
        env.append((item["name"], str(item.get("value", ""))))
    mode = block.get("interactiveMode")
    if mode is None:
        if api_version.endswith("/v1"):
            raise ExecPluginError("exec: interactiveMode is required for apiVersion v1")
        mode = "IfAvailable"
    if mode not in INTERACTIVE_MODES:
        raise ExecPluginError(
            f"exec: interactiveMode must be one of {', '.join(INTERACTIVE_MODES)}, got {mode!r}"
        )
    info: dict[str, Any] | None = None
    if block.get("provideClusterInfo"):
        info = {"server": cluster.get("server")}
        for field in ("tls-server-name", "insecure-skip-tls-verify", "proxy-url"):
            if cluster.get(field):
                info[field] = cluster[field]
        if ca_data is not None:
            info["certificate-authority-data"] = base64.b64encode(ca_data).decode()
        for extension in cluster.get("extensions") or []:
            if isinstance(extension, Mapping) and extension.get("name") == CLUSTER_EXTENSION:
                info["config"] = extension.get("extension")
    hint = block.get("installHint")
    return ExecSpec(
        api_version=str(api_version),
        command=command,
        args=tuple(args),
        env=tuple(env),
        interactive_mode=str(mode),
        install_hint=str(hint).strip() if hint else None,
        cluster=info,
    )


def parse_exec_output(output: bytes, api_version: str) -> ExecCredential:
    """Check a plugin's answer. Error messages never quote the output: it holds the token."""
    try:
        doc = json.loads(output)
    except ValueError:
        raise ExecPluginError("its output is not a JSON ExecCredential") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ExecPluginError("its output is not an ExecCredential")
    if doc.get("apiVersion") != api_version:
        raise ExecPluginError(
            f"it answered apiVersion {doc.get('apiVersion')!r}, the kubeconfig asks for "
            f"{api_version!r}"
        )
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ExecPluginError("its ExecCredential has no status")
    token = status.get("token") or None
    cert = status.get("clientCertificateData") or None
    key = status.get("clientKeyData") or None
    if (cert is None) != (key is None):
        raise ExecPluginError("it gave clientCertificateData without clientKeyData, or the reverse")
    if token is None and cert is None:
        raise ExecPluginError("its ExecCredential has neither a token nor a client certificate")
    if not all(v is None or isinstance(v, str) for v in (token, cert, key)):
        raise ExecPluginError("its ExecCredential status fields must be strings")
    expires_at: float | None = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expires_at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ExecPluginError(f"expirationTimestamp {stamp!r} is not RFC 3339") from None
    return ExecCredential(token, cert, key, expires_at)


def describe(credential: ExecCredential) -> str:
    """What a credential holds and until when, without any of its secrets (for the log)."""
    kinds = [
        k
        for k, v in (
            ("a token", credential.token),
            ("a client certificate", credential.client_certificate_pem),
        )
        if v
    ]
    until = (
        "no expiry"
        if credential.expires_at is None
        else "expires " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(credential.expires_at))
    )
    return f"{' and '.join(kinds)} ({until})"


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


class ExecCredentialSource:
    """The credential of one exec plugin, cached until it expires or a 401 invalidates it.

    ``refresh()`` runs the plugin when there is no credential, when it has expired, or after
    ``invalidate()``; concurrent callers wait for the one run. A failed run keeps the last
    credential (the apiserver decides whether it still works) and is not retried for a few
    seconds; ``refresh(strict=True)`` raises instead (for start-up).
    """

    def __init__(
        self,
        spec: ExecSpec,
        *,
        clock: Callable[[], float] = time.time,
        stdin_is_terminal: Callable[[], bool] = _stdin_is_terminal,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.credential: ExecCredential | None = None
        self.runs = 0
        self._clock = clock
        self._stdin_is_terminal = stdin_is_terminal
        self._environ = environ
        self._stale = False
        self._failed_at: float | None = None
        self._lock = asyncio.Lock()

    @property
    def token(self) -> str | None:
        return self.credential.token if self.credential is not None else None

    def _needs_run(self) -> bool:
        if self.credential is None or self._stale:
            return True
        expires = self.credential.expires_at
        return expires is not None and self._clock() >= expires

    def invalidate(self, sent_token: str | None) -> None:
        """The apiserver refused ``sent_token`` (401): the next refresh re-runs the plugin,
        unless another request already replaced that credential."""
        if sent_token == self.token:
            self._stale = True
            self._failed_at = None

    async def refresh(self, *, strict: bool = False) -> bool:
        """Make the credential current; True if the plugin ran and gave a new one."""
        if not self._needs_run():
            return False
        async with self._lock:
            if not self._needs_run():
                return False  # another request ran it meanwhile
            if (
                not strict
                and self._failed_at is not None
                and self._clock() - self._failed_at < RETRY_AFTER_FAILURE_SECONDS
            ):
                return False
            try:
                credential = await self._run()
            except ExecPluginError as error:
                self._failed_at = self._clock()
                if strict:
                    raise
                log.warning("%s; keeping the last credential", error)
                return False
            self.credential = credential
            self._stale = False
            self._failed_at = None
            log.info("exec plugin %s gave %s", self.spec.command, describe(credential))
            return True

    def _interactive(self) -> bool:
        mode = self.spec.interactive_mode
        if mode == "Never":
            return False
        terminal = self._stdin_is_terminal()
        if mode == "Always" and not terminal:
            raise ExecPluginError(
                f"exec plugin {self.spec.command}: interactiveMode is Always but standard input "
                "is not a terminal"
            )
        return terminal

    async def _run(self) -> ExecCredential:
        spec = self.spec
        interactive = self._interactive()
        info: dict[str, Any] = {"interactive": interactive}
        if spec.cluster is not None:
            info["cluster"] = dict(spec.cluster)
        env = dict(os.environ if self._environ is None else self._environ)
        env.update(spec.env)
        env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {"apiVersion": spec.api_version, "kind": "ExecCredential", "spec": info}
        )
        self.runs += 1
        try:
            process = await asyncio.create_subprocess_exec(
                spec.command,
                *spec.args,
                stdin=None if interactive else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as error:
            hint = f" ({spec.install_hint})" if spec.install_hint else ""
            raise ExecPluginError(
                f"exec plugin {spec.command}: cannot run it: {error.strerror or error}{hint}"
            ) from None
        try:
            output, _ = await asyncio.wait_for(process.communicate(), RUN_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise ExecPluginError(
                f"exec plugin {spec.command}: no answer within {RUN_TIMEOUT_SECONDS:g} s"
            ) from None
        except BaseException:
            # Cancelled (shutdown): the plugin must not outlive us.
            if process.returncode is None:
                process.kill()
                await process.wait()
            raise
        if process.returncode != 0:
            raise ExecPluginError(
                f"exec plugin {spec.command}: exited with code {process.returncode}"
            )
        try:
            return parse_exec_output(output, spec.api_version)
        except ExecPluginError as error:
            raise ExecPluginError(f"exec plugin {spec.command}: {error}") from None
