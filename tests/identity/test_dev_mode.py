"""Dev mode and start-up refusal (no provider needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.identity.setup import (
    ConfigurationError,
    build_authenticator,
    build_dev_issuer,
)
from gateway.kit.settings import Settings
from tests.identity.conftest import REPO, bearer, submit

ISTHMUS = str(Path(sys.executable).parent / "isthmus")  # the installed console script, as users run it


def test_no_issuer_and_no_dev_mode_refuses_to_build(tmp_path):
    with pytest.raises(ConfigurationError, match="ISTHMUS_OIDC_ISSUERS"):
        build_authenticator(Settings(database_url=f"sqlite:///{tmp_path}/x.db"))


def test_isthmus_serve_exits_non_zero_without_an_issuer(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    env.update(ISTHMUS_DATABASE_URL=f"sqlite:///{tmp_path}/serve.db", ISTHMUS_OIDC_ISSUERS="[]")
    r = subprocess.run([ISTHMUS, "serve", "--port", "1"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "no trusted token issuer" in r.stderr and "ISTHMUS_OIDC_ISSUERS" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value, message", [
    ("{not json", "not valid JSON"),
    ('{"issuer": "https://idp.example"}', "JSON list"),
    ('[{"issuer": "https://idp.example", "algorithms": ["HS256"]}]', "only asymmetric algorithms"),
    ('[{"issuer": "https://idp.example", "algorithms": ["none"]}]', "only asymmetric algorithms"),
    ('[{"issuer": "https://idp.example", "audiences": "isthmus"}]', "audiences"),
    ('[{"issuer": "http://idp.example/realms/x"}]', "http:// is only accepted for loopback"),
    ('[{"issuer": "ftp://idp.example"}]', "not an https:// URL"),
    ('[{"issuer": "https://idp.example", "claims": {"group_claim": "g"}}]', "claims.group_claim"),
    ('[{"issuer": "https://a.example"}, {"issuer": "https://a.example"}]', "configured twice"),
])
def test_bad_issuer_configuration_is_refused_with_a_clear_message(value, message):
    with pytest.raises(ConfigurationError, match=message):
        build_authenticator(Settings(oidc_issuers=value))


def test_dev_issuer_tokens_work_in_dev_mode(make_client, tmp_path):
    client = make_client(dev_mode=True)
    dev = build_dev_issuer(client.app.state.settings)
    alice = dev.mint(user="alice", groups=["team-a"])
    assert submit(client, alice, "team-a").status_code == 202
    assert submit(client, alice, "team-b").status_code == 403
    assert client.get("/v1/admin/accounts", headers=bearer(alice)).status_code == 403
    admin = dev.mint(user="ops", admin=True)
    assert client.get("/v1/admin/accounts", headers=bearer(admin)).status_code == 200
    expired = dev.mint(user="alice", groups=["team-a"], lifetime_s=-120)
    r = submit(client, expired, "team-a")
    assert r.status_code == 401 and r.json()["detail"].startswith("token expired: ")
    label = next(iter(client.get("/readyz").json()["identity"]))
    assert "development issuer" in label


def test_dev_tokens_are_refused_outside_dev_mode(make_client, tmp_path):
    from tests.identity.conftest import LOCAL_ISSUER, JwksServer, LocalSigner

    signer = LocalSigner()
    server = JwksServer(signer.public_jwks())
    try:
        client = make_client(issuers=[{"issuer": LOCAL_ISSUER, "jwks_uri": server.url}])
        dev = build_dev_issuer(Settings(dev_key_path=tmp_path / "dev-key.pem"))
        r = submit(client, dev.mint(user="alice", groups=["team-a"]))
        assert r.status_code == 401 and r.json()["detail"].startswith("untrusted issuer: ")
    finally:
        server.close()


def test_isthmus_token_command_mints_a_token_the_dev_gateway_accepts(make_client, tmp_path):
    key = tmp_path / "dev-key.pem"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")},
           "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": str(key)}
    r = subprocess.run([ISTHMUS, "token", "--user", "alice", "--groups", "team-a"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    client = make_client(dev_mode=True)  # same key path: tmp_path / "dev-key.pem"
    assert submit(client, token, "team-a").status_code == 202
    env.pop("ISTHMUS_DEV_MODE")
    r = subprocess.run([ISTHMUS, "token", "--user", "alice"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "ISTHMUS_DEV_MODE" in r.stderr


def test_importing_identity_emits_no_deprecation_warning():
    code = "import gateway.identity.authn, gateway.identity.dev, gateway.identity.oidc"
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.dumps(r.stderr) == '""'


def test_isthmus_token_uses_one_documented_key_whatever_the_directory(tmp_path, monkeypatch):
    """Run from two directories, `isthmus token` signs with the same key, kept in the user's
    config directory; the gateway's default settings find that key (#14, 6)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_") and k != "XDG_CONFIG_HOME"}
    env.update(HOME=str(home), ISTHMUS_DEV_MODE="true")
    runs = []
    for where in ("clone", "elsewhere"):
        (tmp_path / where).mkdir()
        runs.append(subprocess.run([ISTHMUS, "token", "--user", "alice", "--groups", "team-a"], env=env,
                                   cwd=tmp_path / where, capture_output=True, text=True, timeout=60))
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    key = home / ".config" / "isthmus" / "dev-issuer-key.pem"
    assert key.exists() and oct(key.stat().st_mode & 0o777) == "0o600"
    assert f"created a development key at {key}" in runs[0].stderr and "created" not in runs[1].stderr
    assert not (tmp_path / "clone" / ".isthmus").exists() and not (tmp_path / "elsewhere" / ".isthmus").exists()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("ISTHMUS_DEV_KEY_PATH", raising=False)
    settings = Settings(dev_mode=True, database_url=f"sqlite:///{tmp_path}/x.db")
    assert settings.dev_key_path == key
    authenticator = build_authenticator(settings)
    for r in runs:
        assert authenticator.authenticate(r.stdout.strip()).username == "alice"


def test_token_help_says_dev_mode_is_needed_and_where_the_key_is():
    r = subprocess.run([ISTHMUS, "token", "--help"], capture_output=True, text=True, timeout=60)
    assert "ISTHMUS_DEV_MODE=true" in r.stdout and "~/.config/isthmus/dev-issuer-key.pem" in r.stdout


def test_identity_errors_show_the_values_they_compared(make_client, tmp_path):
    """Issuer, audience, expiry and signature refusals name both sides (#14, 5 and 7)."""
    from tests.identity.conftest import LOCAL_ISSUER, JwksServer, LocalSigner

    signer = LocalSigner()
    server = JwksServer(signer.public_jwks())
    try:
        client = make_client(issuers=[{"issuer": LOCAL_ISSUER, "jwks_uri": server.url}])
        dev = build_dev_issuer(Settings(dev_key_path=tmp_path / "dev-key.pem"))
        r = submit(client, dev.mint(user="alice", groups=["team-a"]))
        assert r.json()["detail"] == (f"untrusted issuer: the token's iss is 'urn:isthmus:dev-issuer'; "
                                      f"this gateway trusts {LOCAL_ISSUER!r}")
    finally:
        server.close()


def test_dev_issuer_errors_show_audience_expiry_and_key(make_client, tmp_path):
    settings = {"dev_mode": True}
    client = make_client(issuers=[], **settings)
    dev = client.app.state.authenticator.issuers["urn:isthmus:dev-issuer"]
    issuer = build_dev_issuer(client.app.state.settings)
    r = submit(client, issuer.mint(user="alice", groups=["team-a"], extra={"aud": "other-service"}))
    assert r.json()["detail"] == "wrong audience: the token's aud is 'other-service'; this gateway accepts [\"isthmus\"]"
    r = submit(client, issuer.mint(user="alice", groups=["team-a"], extra={"exp": 1_000_000_000}))
    assert r.json()["detail"].startswith("token expired: exp 2001-09-09T01:46:40Z, now 20")
    assert r.json()["detail"].endswith(f"(leeway {dev.leeway_s} s)")
    other_key = build_dev_issuer(Settings(dev_key_path=tmp_path / "another-clone.pem"))
    r = submit(client, other_key.mint(user="alice", groups=["team-a"]))
    key_path = client.app.state.settings.dev_key_path
    assert r.json()["detail"] == ("bad signature: not made by the key 'isthmus-dev-1' of development issuer "
                                  f"(dev mode) that this gateway holds; this gateway's dev key is {key_path} "
                                  "(ISTHMUS_DEV_KEY_PATH); mint tokens with `isthmus token` using the same file")
    assert str(key_path) != str(tmp_path / "another-clone.pem")
