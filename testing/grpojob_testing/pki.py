"""Certificates for a loopback control plane: one CA, the apiserver's serving cert, an admin client
cert, and the service-account signing key. Everything is written as PEM files into one directory."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files a control plane needs."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _sign(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool, extensions=()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # Key identifiers: Python >= 3.13 verifies with VERIFY_X509_STRICT, which refuses a certificate
        # without an Authority Key Identifier (the pods of our Python 3.13 images talk to this API server).
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path, service_cluster_ip: str, dns_names: list[str], extra_ips: tuple[str, ...] = ()) -> Pki:
    """Write a fresh CA, serving cert (loopback, the `kubernetes` Service IP, ``extra_ips`` and DNS
    names), admin client cert (group system:masters) and service-account key pair into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)

    ca_key = _key()
    ca_name = _name("grpojob-test-ca")
    ca_cert = _sign(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write_key(pki.ca_key, ca_key)
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    serving_key = _key()
    alt_names = [x509.DNSName(name) for name in ["localhost", *dns_names]]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_cluster_ip, *extra_ips)]
    serving = _sign(
        _name("kube-apiserver"),
        serving_key,
        ca_name,
        ca_key,
        ca=False,
        extensions=[
            x509.SubjectAlternativeName(alt_names),
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
        ],
    )
    _write_key(pki.serving_key, serving_key)
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))

    admin_key = _key()
    admin = _sign(
        _name("grpojob-admin", "system:masters"),
        admin_key,
        ca_name,
        ca_key,
        ca=False,
        extensions=[x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])],
    )
    _write_key(pki.admin_key, admin_key)
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def client_cert(pki: Pki, name: str, common_name: str, organization: str | None = None) -> tuple[Path, Path]:
    """Sign a client certificate for ``common_name`` (in group ``organization``) with the CA of
    ``pki``; write ``<name>.crt`` and ``<name>.key`` beside it and return their paths."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_name = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    key = _key()
    cert = _sign(
        _name(common_name, organization),
        key,
        ca_name,
        ca_key,
        ca=False,
        extensions=[x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])],
    )
    cert_path, key_path = pki.directory / f"{name}.crt", pki.directory / f"{name}.key"
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
