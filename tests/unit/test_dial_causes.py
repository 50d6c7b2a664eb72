"""A failed dial reads the same in logs, the prober and Status messages, whatever request
(one-shot, stream, upgrade) dialed: there is one dial path (watchproxy/upstream/pool.py)."""

from __future__ import annotations

import socket
import ssl

import pytest

from watchproxy.upstream.client import describe
from watchproxy.upstream.pool import DialFailed

HOST, PORT = "apiserver.example", 6443


def _cert_error() -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate")
    error.verify_message = "self-signed certificate"
    return error


@pytest.mark.parametrize(
    ("raw", "wording"),
    [
        (_cert_error(), "TLS certificate verification failed: self-signed certificate"),
        (ssl.SSLError(1, "wrong version number"), "TLS error: "),
        (socket.gaierror(-2, "Name or service not known"), f"DNS lookup failed for {HOST}"),
        (
            ConnectionRefusedError(111, "Connection refused"),
            f"cannot connect to {HOST}:{PORT}: Connection refused",
        ),
        (TimeoutError(), f"cannot connect to {HOST}:{PORT}: timed out"),
    ],
    ids=["certificate", "tls", "dns", "refused", "timeout"],
)
def test_a_failed_dial_has_one_wording(raw: OSError, wording: str) -> None:
    said = describe(DialFailed(raw, HOST, PORT))
    assert said.startswith(wording)
    assert said == str(DialFailed(raw, HOST, PORT))
