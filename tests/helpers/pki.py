"""A throwaway certificate authority and the server and client certificates it signs, as
PEM files, for the TLS tests of both front ends."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(name: str, key, issuer_name=None, issuer_key=None, ca=False):
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_name or subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def write_pki(tmp: Path) -> dict[str, Path]:
    pem = serialization.Encoding.PEM
    files = {}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("decider test CA", ca_key, ca=True)
    files["ca"] = tmp / "ca.pem"
    files["ca"].write_bytes(ca.public_bytes(pem))
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(who, key, ca.subject, ca_key)
        files[f"{who}_cert"] = tmp / f"{who}.pem"
        files[f"{who}_cert"].write_bytes(cert.public_bytes(pem))
        files[f"{who}_key"] = tmp / f"{who}.key"
        files[f"{who}_key"].write_bytes(key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return files
