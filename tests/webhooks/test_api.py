"""Registering endpoints: the SSRF guard (422 naming body.url), the secret shown once, tenancy."""

from __future__ import annotations

import re

import pytest

from gateway.webhooks.address import Allowlist, Refused, resolve


@pytest.mark.parametrize("url, words", [
    ("https://127.0.0.1/hook", "loopback"),
    ("https://localhost/hook", "loopback"),
    ("https://[::1]/hook", "loopback"),
    ("https://169.254.169.254/latest/meta-data", "link-local"),
    ("https://[fe80::1]/hook", "link-local"),
    ("https://10.1.2.3/hook", "private"),
    ("https://192.168.0.10/hook", "private"),
    ("https://172.16.5.4/hook", "private"),
    ("https://[fd00::1]/hook", "private"),  # unique-local (Python counts fc00::/7 as private)
    ("https://224.0.0.1/hook", "multicast"),
    ("https://[ff02::1]/hook", "multicast"),
    ("https://0.0.0.0/hook", "unspecified"),
    ("https://[::ffff:127.0.0.1]/hook", "loopback"),  # IPv4-mapped IPv6
    ("https://100.64.0.1/hook", "not globally routable"),  # carrier-grade NAT
])
def test_non_public_addresses_are_refused_naming_the_field(hooks, url, words):
    gw = hooks.gw
    gw.app.state.settings = gw.app.state.settings.model_copy(update={"webhook_allowlist": ""})
    r = gw.client.post("/v1/accounts/team-a/webhooks", json={"url": url}, headers=gw.headers())
    assert r.status_code == 422, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["errors"][0]["field"] == "body.url"
    assert words in problem["errors"][0]["message"]
    assert gw.client.get("/v1/accounts/team-a/webhooks", headers=gw.headers()).json()["items"] == []


# IPv6 forms that embed an IPv4 address are judged as that IPv4 address (issue #27, finding 7).
EMBEDDED_IPV4 = [
    ("https://[64:ff9b::a9fe:a9fe]/hook", "link-local (the NAT64 form of 169.254.169.254)"),
    ("https://[64:ff9b:1::a00:1]/hook", "private (the NAT64 form of 10.0.0.1)"),
    ("https://[2002:7f00:1::]/hook", "loopback (the 6to4 form of 127.0.0.1)"),
    ("https://[2002:a9fe:a9fe::1]/hook", "link-local (the 6to4 form of 169.254.169.254)"),
    ("https://[::7f00:1]/hook", "loopback (the IPv4-compatible form of 127.0.0.1)"),
    ("https://[::a00:1]/hook", "private (the IPv4-compatible form of 10.0.0.1)"),
    ("https://[::ffff:a9fe:a9fe]/hook", "link-local (the IPv4-mapped form of 169.254.169.254)"),
    # Teredo: server 65.54.227.120 (public), client 127.0.0.1 XOR ffff:ffff = 80ff:fffe.
    ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook", "loopback (the Teredo client form of 127.0.0.1)"),
    # Teredo with a private server address (bits 32-63).
    ("https://[2001:0:a00:1:8000:63bf:3fff:fdd2]/hook", "private (the Teredo server form of 10.0.0.1)"),
]


@pytest.mark.parametrize("url, words", EMBEDDED_IPV4)
def test_ipv6_forms_embedding_ipv4_are_checked_as_that_address(url, words):
    with pytest.raises(Refused, match=re.escape(words)):
        resolve(url, Allowlist())


@pytest.mark.parametrize("url, words", EMBEDDED_IPV4[:5])
def test_ipv6_forms_embedding_ipv4_are_refused_by_the_api(hooks, url, words):
    gw = hooks.gw
    r = gw.client.post("/v1/accounts/team-a/webhooks", json={"url": url}, headers=gw.headers())
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "body.url" and words in r.json()["errors"][0]["message"]
    assert gw.client.get("/v1/accounts/team-a/webhooks", headers=gw.headers()).json()["items"] == []


def test_ipv6_forms_embedding_a_public_ipv4_are_judged_by_it():
    assert resolve("https://[64:ff9b::5db8:d70e]/hook", Allowlist()).address == "64:ff9b::5db8:d70e"  # 93.184.215.14
    assert resolve("https://[2002:5db8:d70e::1]/hook", Allowlist()).address == "2002:5db8:d70e::1"


def test_an_embedded_form_is_refused_again_at_delivery(hooks, receiver):
    """Registered while an admin allowed it, refused when delivering once that is withdrawn."""
    gw = hooks.gw
    gw.app.state.settings = gw.app.state.settings.model_copy(update={"webhook_allowlist": "2002::/16"})
    ep = hooks.register("https://[2002:7f00:1::]:9/hook")
    hooks.submit_and_cancel()
    hooks.worker(webhook_allowlist="").run_once()
    items = hooks.deliveries(ep["id"])
    tried = [d for d in items if d["attempts"]]  # the first failure backs the endpoint off
    assert tried and all("refused" in d["last_error"] and "the 6to4 form of 127.0.0.1" in d["last_error"]
                         for d in tried)


@pytest.mark.parametrize("url, words", [
    ("http://93.184.215.14/hook", "https"),
    ("ftp://example.org/hook", "https"),
    ("https://user:pw@93.184.215.14/hook", "credentials"),
    ("https://no-such-host.invalid/hook", "does not resolve"),
    ("https:///hook", "no host"),
    ("https://[::1/hook", "not a valid URL"),
    ("https://93.184.215.14:99999/hook", "invalid port"),
    ("https://93.184.215.14/ho ok", "spaces"),
    ("https://exa_mple.org/hook", "invalid host name"),
])
def test_bad_urls_are_refused(hooks, url, words):
    r = hooks.gw.client.post("/v1/accounts/team-a/webhooks", json={"url": url}, headers=hooks.gw.headers())
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "body.url" and words in r.json()["errors"][0]["message"]


def test_allowlist_admits_listed_networks_and_hosts_only():
    allow = Allowlist.parse("127.0.0.1/32, hooks.internal")
    assert resolve("https://127.0.0.1:8443/x?y=1", allow).address == "127.0.0.1"
    assert resolve("http://127.0.0.1/x", allow).scheme == "http"  # plain http only for allow-listed hosts
    with pytest.raises(Refused, match="loopback"):
        resolve("https://127.0.0.2/x", allow)
    with pytest.raises(Refused, match="https"):
        resolve("http://93.184.215.14/x", allow)
    with pytest.raises(ValueError, match="neither a CIDR nor a host name"):
        Allowlist.parse("10.0.0.0/8, not a host")


def test_a_public_address_is_accepted_and_the_secret_is_shown_once(hooks):
    gw = hooks.gw
    r = gw.client.post("/v1/accounts/team-a/webhooks", json={"url": "https://93.184.215.14/hook",
                                                             "description": "bot"}, headers=gw.headers())
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert created["enabled"] is True and created["account"] == "team-a"
    listed = gw.client.get("/v1/accounts/team-a/webhooks", headers=gw.headers()).json()["items"]
    assert [e["id"] for e in listed] == [created["id"]]
    assert "secret" not in listed[0]
    one = gw.client.get(f"/v1/accounts/team-a/webhooks/{created['id']}", headers=gw.headers()).json()
    assert "secret" not in one and one["url"] == "https://93.184.215.14/hook"


def test_unknown_fields_are_refused(hooks):
    r = hooks.gw.client.post("/v1/accounts/team-a/webhooks", json={"url": "https://93.184.215.14/", "secret": "x"},
                             headers=hooks.gw.headers())
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.secret"


def test_another_account_cannot_list_read_change_or_delete_your_endpoints(hooks, receiver):
    gw = hooks.gw
    ep = hooks.register(receiver.url)
    bob = gw.headers("bob", ("team-b",))
    base = "/v1/accounts/team-a/webhooks"
    assert gw.client.get(base, headers=bob).status_code == 404
    assert gw.client.post(base, json={"url": receiver.url}, headers=bob).status_code == 404
    assert gw.client.get(f"{base}/{ep['id']}", headers=bob).status_code == 404
    assert gw.client.get(f"{base}/{ep['id']}/deliveries", headers=bob).status_code == 404
    assert gw.client.patch(f"{base}/{ep['id']}", json={"enabled": False}, headers=bob).status_code == 404
    assert gw.client.delete(f"{base}/{ep['id']}", headers=bob).status_code == 404
    # Nor through its own account's path: the id belongs to team-a.
    assert gw.client.get(f"/v1/accounts/team-b/webhooks/{ep['id']}", headers=bob).status_code == 404
    assert gw.client.get("/v1/accounts/team-b/webhooks", headers=bob).json()["items"] == []
    # The admin routes need the admin role, and an account's endpoint is not an admin one.
    assert gw.client.get("/v1/admin/webhooks", headers=bob).status_code == 403
    admin = gw.headers("root-admin", (), admin=True)
    assert gw.client.get(f"/v1/admin/webhooks/{ep['id']}", headers=admin).status_code == 404
    # ...while the owner still sees it, unchanged.
    assert hooks.endpoint(ep["id"])["enabled"] is True
    assert gw.client.delete(f"{base}/{ep['id']}", headers=gw.headers()).status_code == 204
    assert gw.client.get(base, headers=gw.headers()).json()["items"] == []


def test_admin_endpoints(hooks, receiver):
    gw = hooks.gw
    admin = gw.headers("root-admin", (), admin=True)
    r = gw.client.post("/v1/admin/webhooks", json={"url": receiver.url}, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["account"] is None and r.json()["secret"].startswith("whsec_")
    assert [e["id"] for e in gw.client.get("/v1/admin/webhooks", headers=admin).json()["items"]] == [r.json()["id"]]
    assert gw.client.get("/v1/accounts/team-a/webhooks", headers=gw.headers()).json()["items"] == []
    r2 = gw.client.post("/v1/admin/webhooks", json={"url": "https://10.0.0.1/"}, headers=admin)
    assert r2.status_code == 422 and r2.json()["errors"][0]["field"] == "body.url"


def test_a_typo_in_the_allowlist_stops_start_up_in_one_line(tmp_path):
    # Checked by the app factory (not by Settings, which lives below the webhooks package).
    import pytest

    from gateway.app import create_app
    from gateway.identity.errors import ConfigurationError
    from gateway.kit.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path}/x.db", dev_mode=True, dev_key_path=tmp_path / "k.pem",
                        webhook_allowlist="10.0.0.0/8, not a host!")
    with pytest.raises(ConfigurationError, match=r"^ISTHMUS_WEBHOOK_ALLOWLIST: .*'not a host!'"):
        create_app(settings)
