"""A self-signed certificate for 127.0.0.1 and the server context that serves it, for https stand-ins."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path


def self_signed(root: Path) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)`` under ``root``: a certificate for 127.0.0.1 that is its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmpack stand-in")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    root.mkdir(parents=True, exist_ok=True)
    (root / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (root / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    return root / "cert.pem", root / "key.pem"


def server_tls(cert: tuple[Path, Path]) -> ssl.SSLContext:
    """The server side of ``cert``: what a stand-in's ``tls=`` takes."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx
