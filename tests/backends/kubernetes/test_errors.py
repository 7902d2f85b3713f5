"""Library errors become the contract's typed errors (real API server, real refusals)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest

from adapters.base import BackendForbidden, BackendUnavailable, SubmissionRejected
from adapters.kubernetes import KubernetesBackend

from .conftest import request

pytestmark = [pytest.mark.kubernetes]


def _kubeconfig(tmp_path, settings, *, server=None, cert=None, key=None) -> str:
    import yaml

    cfg = yaml.safe_load(Path(settings.kubeconfig).read_text())
    if server:
        cfg["clusters"][0]["cluster"]["server"] = server
    if cert:
        cfg["users"][0]["user"] = {"client-certificate": cert, "client-key": key}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_unreachable_api_server_is_backend_unavailable(tmp_path, settings):
    import dataclasses

    cfg = _kubeconfig(tmp_path, settings, server="https://127.0.0.1:1")
    b = KubernetesBackend(dataclasses.replace(settings, kubeconfig=cfg, request_timeout_s=2))
    with pytest.raises(BackendUnavailable) as exc:
        b.status("isthmus-team-a/isthmus-anything")
    assert exc.value.retryable and exc.value.__cause__ is not None
    with pytest.raises(BackendUnavailable):
        b.capacity()


def test_identity_without_rbac_is_backend_forbidden(tmp_path, settings, kube_env):
    """A client certificate from the cluster CA for a user no RBAC rule mentions."""
    import dataclasses

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    state = kube_env["ISTHMUS_KUBE_STATE_DIR"]
    ca_cert = x509.load_pem_x509_certificate(Path(f"{state}/certs/ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key(Path(f"{state}/certs/ca.key").read_bytes(), None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nobody-" + uuid.uuid4().hex[:6])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
            .sign(ca_key, hashes.SHA256()))
    (tmp_path / "u.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "u.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                                       serialization.NoEncryption()))
    cfg = _kubeconfig(tmp_path, settings, cert=str(tmp_path / "u.crt"), key=str(tmp_path / "u.key"))
    b = KubernetesBackend(dataclasses.replace(settings, kubeconfig=cfg))
    with pytest.raises(BackendForbidden) as exc:
        b.submit(request(f"forbidden-{uuid.uuid4().hex[:6]}", gpus=1))
    assert "forbidden" in exc.value.message.lower()


@pytest.mark.usefixtures("clean")
def test_invalid_object_is_rejected_with_the_servers_message(backend):
    bad = request(f"invalid-{uuid.uuid4().hex[:6]}", gpus=1, labels={"example.com/bad": "not a valid value!"})
    with pytest.raises(SubmissionRejected) as exc:
        backend.submit(bad)
    assert "invalid" in exc.value.message.lower(), exc.value.message
