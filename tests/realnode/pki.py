"""Credentials for the real node's control plane, written in kubetestenv's state layout.

kubetestenv creates its CA, serving certificate, service-account key and token file on its first
start and reuses a state directory that already holds them (``ensureCredentials`` in
tests/realapi/kubetestenv/main.go). It keeps no CA key, so nothing could sign a certificate for
the node afterwards; and its token file is read once, when the apiserver starts. So the node
rig writes the whole set itself, before the first start: the same files kubetestenv would have
written, plus

- a static token for ``system:node:<node>`` (group ``system:nodes``) in the token file: the
  kubelet's identity under the Node authorizer and the NodeRestriction admission plugin;
- a static token for ``system:kube-proxy``, the user the apiserver's bootstrap policy binds to
  the ``system:node-proxier`` ClusterRole (read Services, EndpointSlices and Nodes, write
  Events): kube-proxy's identity, as kubeadm gives it;
- a client certificate for the apiserver's calls to the kubelet (exec, attach, port-forward,
  logs), signed by the same CA, which the kubelet trusts for x509 authentication;
- serving-certificate names for the addresses the rig uses (the node IP, the ``kubernetes``
  Service IP).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Credentials:
    """Paths and tokens of one control plane's credentials."""

    pki: Path
    admin_token: str
    node_token: str
    proxy_token: str

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def sa_key(self) -> Path:
        return self.pki / "sa.key"

    @property
    def kubelet_client_cert(self) -> Path:
        return self.pki / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.pki / "apiserver-kubelet-client.key"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # "EC PRIVATE KEY", as kubetestenv writes its keys (x509.MarshalECPrivateKey).
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def write_credentials(pki: Path, *, node_name: str, ip_addresses: tuple[str, ...]) -> Credentials:
    """Write a complete kubetestenv credential set into ``pki`` (``<state dir>/pki``)."""
    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)

    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "watchproxy-realnode-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def issue(
        common_name: str,
        usage: x509.ObjectIdentifier,
        *,
        organization: str | None = None,
        san: x509.SubjectAlternativeName | None = None,
    ) -> tuple[bytes, bytes]:
        key = _key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    names: list[x509.GeneralName] = [
        x509.DNSName(name)
        for name in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    ]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", *ip_addresses)]
    server_cert, server_key = issue(
        "kube-apiserver", ExtendedKeyUsageOID.SERVER_AUTH, san=x509.SubjectAlternativeName(names)
    )
    # system:masters: the kubelet authorizes every x509 client it trusts (AlwaysAllow); the
    # group matters only if the kubelet is switched to webhook authorization.
    client_cert, client_key = issue(
        "kube-apiserver-kubelet-client",
        ExtendedKeyUsageOID.CLIENT_AUTH,
        organization="system:masters",
    )
    creds = Credentials(
        pki,
        admin_token=secrets.token_hex(24),
        node_token=secrets.token_hex(24),
        proxy_token=secrets.token_hex(24),
    )
    _write(creds.ca_file, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(pki / "apiserver.crt", server_cert)
    _write(pki / "apiserver.key", server_key)
    _write(creds.kubelet_client_cert, client_cert)
    _write(creds.kubelet_client_key, client_key)
    _write(creds.sa_key, _key_pem(_key()))
    # token,user,uid,"group,...", as kubetestenv writes its admin's line.
    _write(
        pki / "tokens.csv",
        (
            f'{creds.admin_token},kubetestenv-admin,kubetestenv-admin,"system:masters"\n'
            f'{creds.node_token},system:node:{node_name},system:node:{node_name},"system:nodes"\n'
            f"{creds.proxy_token},system:kube-proxy,system:kube-proxy\n"
        ).encode(),
    )
    # Last, as kubetestenv does: its presence says the directory holds a complete set.
    _write(pki / "admin.token", f"{creds.admin_token}\n".encode())
    return creds
