"""ISTHMUS_BACKENDS: validated at start-up in one line; each pool probed, its health shown (#14, 2-3)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gateway.pools.adapters import BackendConfigError
from gateway.pools.config import build, from_backends_json
from tests.dispatch.conftest import slurm_backend_options, wired_gateway
from tests.e2e.conftest import ISTHMUS, free_port


def parse_settings(config_json: str) -> dict:
    """Each ISTHMUS_BACKENDS pool's validated adapter settings, as the gateway reads them."""
    return {p.name: p.settings for p in from_backends_json(config_json)}


def build_backends(config_json: str) -> dict:
    return build(from_backends_json(config_json))


KEY = __file__  # any readable file stands in for a key where only its presence is checked


@pytest.mark.parametrize("config, message", [
    ({"slurm": {"rest_ulr": "http://127.0.0.1:16820", "jwt_key_path": KEY}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'rest_ulr': unknown setting (did you mean 'rest_url'?)"),
    ({"slurm": {"rest_url": "http://127.0.0.1:16820", "jwt_key_path": "/nonexistent/jwt.key"}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'jwt_key_path': no such file: /nonexistent/jwt.key"),
    ({"slurm": {"rest_url": "http://127.0.0.1:16820"}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'jwt_key_path': the REST transport needs the cluster's JWT key file"),
    ({"slurm": {"rest_url": "127.0.0.1:16820", "jwt_key_path": KEY}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'rest_url': needs an http(s)://host:port URL"),
    ({"slurm": {"rest_url": "http://127.0.0.1:16820", "jwt_key_path": KEY, "timeout_s": "ten"}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'timeout_s': Input should be a valid number"),
    ({"slurm": {"rest_url": "http://127.0.0.1:16820", "jwt_key_path": KEY, "transport": "ssh"}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'transport': Input should be 'rest', 'cli' or 'pyslurm'"),
    ({"slurm": {"rest_url": "http://127.0.0.1:16820", "jwt_key_path": KEY, "partition": "gpu; rm"}},
     "ISTHMUS_BACKENDS: pool 'slurm', field 'partition': not a Slurm partition name"),
    ({"kubernetes": {"kubeconfig": "/nonexistent/kubeconfig"}},
     "ISTHMUS_BACKENDS: pool 'kubernetes', field 'kubeconfig': no such file: /nonexistent/kubeconfig"),
    ({"kubernetes": {"kubeconfig": KEY, "cluster_queue": "GPU Queue"}},
     "ISTHMUS_BACKENDS: pool 'kubernetes', field 'cluster_queue': not a Kubernetes object name"),
    ({"kubernetes": {"kubeconfig": KEY, "namespace_template": "ns-{team}"}},
     "ISTHMUS_BACKENDS: pool 'kubernetes', field 'namespace_template': only {account} may be substituted"),
    ({"gpu-cluster": {}}, "ISTHMUS_BACKENDS: pool 'gpu-cluster': unknown pool; known: kubernetes, slurm"),
    ({"slurm": ["rest"]}, "ISTHMUS_BACKENDS: pool 'slurm': must be a JSON object of settings, not list"),
    (["slurm"], "ISTHMUS_BACKENDS must be a JSON object keyed by pool"),
])
def test_bad_settings_are_refused_in_one_line_naming_pool_and_field(config, message):
    with pytest.raises(BackendConfigError) as err:
        parse_settings(json.dumps(config))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_the_documented_examples_are_valid(tmp_path):
    """docs/slurm.md and docs/kubernetes.md carry a full ISTHMUS_BACKENDS example each."""
    import re

    from tests.conftest import REPO
    for doc, pool in (("slurm.md", "slurm"), ("kubernetes.md", "kubernetes")):
        text = (REPO / "docs" / doc).read_text()
        m = re.search(r"<!-- backends-example -->\n```json\n(.*?)```", text, flags=re.DOTALL)
        assert m, f"docs/{doc} has no marked ISTHMUS_BACKENDS example"
        config = json.loads(m.group(1))
        for field in ("jwt_key_path", "kubeconfig", "slurm_conf"):  # files of the reader's site
            if field in config[pool]:
                config[pool][field] = KEY
        settings = parse_settings(json.dumps(config))[pool]
        import dataclasses
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE))
        fields = {f.name for f in dataclasses.fields(settings)} - {"token"}
        assert fields <= documented, f"docs/{doc} does not document {sorted(fields - documented)}"


def test_isthmus_serve_exits_1_with_one_line_and_no_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    env.update(ISTHMUS_DATABASE_URL=f"sqlite:///{tmp_path}/x.db", ISTHMUS_DEV_MODE="true",
               ISTHMUS_DEV_KEY_PATH=str(tmp_path / "k.pem"),
               ISTHMUS_BACKENDS=json.dumps({"slurm": {"rest_ulr": "http://127.0.0.1:16820"}}))
    r = subprocess.run([ISTHMUS, "serve", "--port", str(free_port())], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "unexpected keyword" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [("Error: ISTHMUS_BACKENDS: pool 'slurm', field 'rest_ulr': unknown setting "
                      "(did you mean 'rest_url'?)")], r.stderr


@pytest.mark.parametrize("content, says", [
    ("clusters: [unclosed\n", "cannot be loaded"),
    ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n", "cannot be loaded"),
])
def test_an_invalid_kubeconfig_stops_serve_in_one_line_without_thread_tracebacks(tmp_path, content, says):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_") and k != "KUBECONFIG"}
    env.update(ISTHMUS_DATABASE_URL=f"sqlite:///{tmp_path}/x.db", ISTHMUS_DEV_MODE="true",
               ISTHMUS_DEV_KEY_PATH=str(tmp_path / "k.pem"),
               ISTHMUS_BACKENDS=json.dumps({"kubernetes": {"kubeconfig": str(kubeconfig)}}))
    r = subprocess.run([ISTHMUS, "serve", "--port", str(free_port())], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"Error: ISTHMUS_BACKENDS: pool 'kubernetes', field 'kubeconfig': {kubeconfig} "), errors
    assert says in errors[0]


@pytest.mark.slurm
@pytest.mark.parametrize("override, why", [
    ({"rest_url": "http://127.0.0.1:1"}, "slurmrestd unreachable at http://127.0.0.1:1"),
    ({"partition": "nosuch"}, "partition 'nosuch' does not exist on this cluster (partitions: gpu)"),
])
def test_a_pool_that_cannot_work_is_unhealthy_everywhere_and_never_idle(database_url, dev_key_path, slurm_cluster,
                                                                         override, why):
    options = {**slurm_backend_options(slurm_cluster), **override}
    with wired_gateway(database_url, dev_key_path, {"slurm": options}) as gw:
        ready = gw.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["pools"]["slurm"]["ok"] is False and why in ready.json()["pools"]["slurm"]["reason"]
        pools = gw.client.get("/v1/pools", headers=gw.headers()).json()["items"]
        assert [(p["name"], p["kind"], p["healthy"]) for p in pools] == [("slurm", "slurm", False)]
        assert why in pools[0]["reason"]
        body = {"name": "p", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 8}
        job = gw.client.post("/v1/jobs", json=body, headers=gw.headers()).json()["id"]
        for _ in range(3):
            gw.app.state.dispatcher.run_once()
        shown = gw.client.get(f"/v1/jobs/{job}", headers=gw.headers()).json()
        # Waits with the pool's real trouble; not "idle", not failed for good.
        assert shown["state"] == "pending", shown
        assert why in shown["state_reason"] and "idle" not in shown["state_reason"], shown["state_reason"]


@pytest.mark.slurm
def test_a_healthy_pool_is_shown_with_its_capacity(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        ready = gw.client.get("/readyz").json()
        assert ready["status"] == "ok" and ready["pools"]["slurm"]["ok"] is True
        (pool,) = gw.client.get("/v1/pools", headers=gw.headers()).json()["items"]
        assert pool["healthy"] and pool["total_nodes"] == 4 and pool["total_gpus"] == 32 and pool["gpus_per_node"] == 8


def test_build_backends_refuses_what_parse_refuses():
    with pytest.raises(BackendConfigError, match="rest_ulr"):
        build_backends(json.dumps({"slurm": {"rest_ulr": "x"}}))


@pytest.mark.slurm
@pytest.mark.parametrize("ask, why", [
    ({"memory_per_worker": "64Gi"}, "a worker asks 65536 MiB of memory; the largest node has 64000 MiB"),
    ({"cpus_per_worker": 16}, "a worker asks 16 CPUs; the largest node has 8"),
])
def test_a_job_bigger_than_any_node_is_refused_at_submit_with_the_numbers(database_url, dev_key_path, slurm_cluster,
                                                                          ask, why):
    """The README's old 64Gi job: Slurm said "Requested node configuration is not available"
    after routing said "4/4 nodes idle" (#14, 1 and 4)."""
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        gw.app.state.dispatcher.views(fresh=True)
        body = {"name": "big", "account": "team-a", "command": ["true"], "workers": 2, "gpus_per_worker": 8, **ask}
        r = gw.client.post("/v1/jobs", json=body, headers=gw.headers())
        assert r.status_code == 422, r.text
        assert why in r.json()["detail"]
        assert gw.client.get("/v1/jobs", headers=gw.headers()).json()["items"] == []
