"""TLS for the fake apiserver: a throwaway trustme CA and a server certificate for loopback."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerTLS:
    """The server's SSL context and the path of the CA's PEM file that clients should trust."""

    context: ssl.SSLContext
    ca_path: str


def make_server_tls(directory: str) -> ServerTLS:
    """A new CA (written to ``directory``/ca.pem) and a cert valid for 127.0.0.1 and localhost."""
    import trustme  # optional dependency (the "demo"/"test" extras)

    ca = trustme.CA(organization_name="watchproxy fake apiserver")
    cert = ca.issue_cert("127.0.0.1", "localhost", "::1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_path = os.path.join(directory, "ca.pem")
    ca.cert_pem.write_to_path(ca_path)
    return ServerTLS(context, ca_path)


def client_context(ca_path: str) -> ssl.SSLContext:
    """An SSL context that trusts only the fake's CA (for tests and the demo)."""
    return ssl.create_default_context(cafile=ca_path)
