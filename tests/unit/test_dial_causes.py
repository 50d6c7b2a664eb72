"""A failed dial reads the same whichever client dialled: aiohttp's connector (streams), the
pool's own dial, or an upgrade's."""

from __future__ import annotations

import socket
import ssl

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from watchproxy.upstream.connector import DialFailed
from watchproxy.upstream.transports import describe

HOST, PORT = "apiserver.example", 6443
KEY = ConnectionKey(HOST, PORT, True, True, None, None, None, None)


def _cert_error() -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate")
    error.verify_message = "self-signed certificate"
    return error


@pytest.mark.parametrize(
    ("from_aiohttp", "raw", "wording"),
    [
        (
            aiohttp.ClientConnectorCertificateError(KEY, _cert_error()),
            _cert_error(),
            "TLS certificate verification failed: self-signed certificate",
        ),
        (
            aiohttp.ClientConnectorSSLError(KEY, ssl.SSLError(1, "wrong version number")),
            ssl.SSLError(1, "wrong version number"),
            "TLS error: ",
        ),
        (
            aiohttp.ClientConnectorDNSError(KEY, OSError(None, "Name or service not known")),
            socket.gaierror(-2, "Name or service not known"),
            f"DNS lookup failed for {HOST}",
        ),
        (
            aiohttp.ClientConnectorError(KEY, ConnectionRefusedError(111, "Connection refused")),
            ConnectionRefusedError(111, "Connection refused"),
            f"cannot connect to {HOST}:{PORT}: Connection refused",
        ),
    ],
    ids=["certificate", "tls", "dns", "refused"],
)
def test_a_failed_dial_has_one_wording(
    from_aiohttp: aiohttp.ClientConnectorError, raw: OSError, wording: str
) -> None:
    said = describe(from_aiohttp)
    assert said.startswith(wording)
    assert said == describe(DialFailed(raw, HOST, PORT)) == str(DialFailed(raw, HOST, PORT))


def test_a_dial_that_timed_out_names_where_it_went() -> None:
    said = describe(DialFailed(TimeoutError(), HOST, PORT))
    assert said == f"cannot connect to {HOST}:{PORT}: timed out"
