"""/metrics: what an operator charts, computed from the registry (docs/operations.md).

In-process on SQLite and Postgres, then a real Prometheus server (Debian's package)
scraping a real `isthmus serve` with two uvicorn workers and a separate `isthmus worker`,
wired to the real Slurm 22.05 cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, missing_system, postgres_database, wait_for
from tests.dispatch.conftest import slurm_backend_options, slurm_env
from tests.e2e.conftest import ISTHMUS, free_port

JOB = {"name": "m", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1,
       "memory_per_worker": "1Gi", "time_limit": "10m"}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def test_metrics_count_jobs_by_state_pool_and_account(gw):
    h = gw.headers()
    ids = [gw.client.post("/v1/jobs", json=JOB, headers=h).json()["id"] for _ in range(3)]
    gw.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=h)
    gw.app.state.metrics_registry = None  # no cached read from an earlier test
    r = gw.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert value(r.text, "isthmus_jobs", state="pending", pool="none", account="team-a") == 2
    assert value(r.text, "isthmus_jobs_finished_total", state="cancelled", pool="none", account="team-a") == 1
    assert value(r.text, "isthmus_job_submissions_total", account="team-a") == 3
    assert value(r.text, "isthmus_account_fairshare_factor", account="team-a") == 1.0
    # bounded cardinality: no label names a user or a job
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            assert not {"user", "username", "job", "job_id"} & set(s.labels), s


METRICS_TOKEN = "s3cret-scraper-" + "t" * 16


def _production_env(tmp_path, **extra) -> dict:
    """`isthmus serve` outside dev mode: an OIDC issuer (never reached here), no dev issuer."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    env.update(ISTHMUS_DATABASE_URL=f"sqlite:///{tmp_path}/gw.db", ISTHMUS_DISPATCH_IN_SERVE="false",
               ISTHMUS_OIDC_ISSUERS=json.dumps([{"issuer": "https://sso.example/realms/x", "http_timeout_s": 1,
                                                 "jwks_uri": f"http://127.0.0.1:{dead}/certs"}]), **extra)
    return env


def test_outside_dev_mode_serve_refuses_to_start_without_a_metrics_token_in_one_line(tmp_path):
    r = subprocess.run([ISTHMUS, "serve", "--port", str(free_port())], env=_production_env(tmp_path), cwd=tmp_path,
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "ISTHMUS_METRICS_TOKEN" in errors[0] and "ISTHMUS_METRICS_ACCESS" in errors[0], r.stderr


def test_outside_dev_mode_metrics_answer_only_the_scrapers_token(tmp_path):
    port = free_port()
    proc = subprocess.Popen([ISTHMUS, "serve", "--port", str(port)], cwd=tmp_path,
                            env=_production_env(tmp_path, ISTHMUS_METRICS_TOKEN=METRICS_TOKEN),
                            stdout=(tmp_path / "gateway.log").open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            try:
                return httpx.get(base + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(up, 60, "the gateway to start")
        none = httpx.get(base + "/metrics", timeout=10)
        assert none.status_code == 401 and none.headers["content-type"] == "application/problem+json"
        assert "isthmus_jobs" not in none.text
        wrong = httpx.get(base + "/metrics", headers={"Authorization": "Bearer " + METRICS_TOKEN[:-1]}, timeout=10)
        assert wrong.status_code == 401
        right = httpx.get(base + "/metrics", headers={"Authorization": "Bearer " + METRICS_TOKEN}, timeout=10)
        assert right.status_code == 200 and "isthmus_job_submissions_total" in right.text
    finally:
        proc.terminate()
        proc.wait(15)


def test_metrics_opened_or_turned_off_on_purpose(tmp_path):
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.cli import run_migrations
    from gateway.identity.errors import ConfigurationError
    from gateway.kit.settings import Settings

    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    env = _production_env(tmp_path)
    production = {"database_url": url, "oidc_issuers": env["ISTHMUS_OIDC_ISSUERS"], "dispatch_in_serve": False}
    with pytest.raises(ConfigurationError, match="ISTHMUS_METRICS_TOKEN"):
        create_app(Settings(**production))
    with pytest.raises(ConfigurationError, match="both set"):
        create_app(Settings(**production, metrics_access="open", metrics_token="x"))
    with TestClient(create_app(Settings(**production, metrics_access="open"))) as client:
        assert client.get("/metrics").status_code == 200
    with TestClient(create_app(Settings(**production, metrics_access="off"))) as client:
        assert client.get("/metrics").status_code == 404


def test_a_metrics_token_is_enforced_when_set(gw):
    gw.app.state.settings.metrics_token = "s3cret-scraper"
    try:
        assert gw.client.get("/metrics").status_code == 401
        assert gw.client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert gw.client.get("/metrics", headers={"Authorization": "Bearer s3cret-scraper"}).status_code == 200
    finally:
        gw.app.state.settings.metrics_token = ""


# ------------------------------------------------------- a real Prometheus server


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if not path:
        missing_system("prometheus not installed (stack/prometheus.sh installs Debian's package)")
    return path


def query(base: str, promql: str) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.mark.slurm
@pytest.mark.uses("prometheus")
@pytest.mark.postgres
def test_prometheus_scrapes_what_an_operator_charts(tmp_path, dev_key_path):
    prom = prometheus_binary()
    env22 = slurm_env("22.05")
    with postgres_database(migrated=True) as url:
        port, prom_port = free_port(), free_port()
        backends = {"slurm": slurm_backend_options(env22)}
        env = {**os.environ, "ISTHMUS_DATABASE_URL": url, "ISTHMUS_DEV_MODE": "true",
               "ISTHMUS_DEV_KEY_PATH": str(dev_key_path), "ISTHMUS_DEV_ACCOUNTS": "team-a,team-b",
               "ISTHMUS_BACKENDS": json.dumps(backends), "ISTHMUS_DISPATCH_IN_SERVE": "false",
               "ISTHMUS_METRICS_TTL_S": "0", "ISTHMUS_METRICS_TOKEN": METRICS_TOKEN}
        procs = []
        try:
            procs.append(subprocess.Popen([ISTHMUS, "serve", "--dev", "--port", str(port), "--workers", "2"],
                                          env=env, cwd=REPO, stdout=(tmp_path / "gateway.log").open("w"),
                                          stderr=subprocess.STDOUT))
            wait_for(lambda: _ready(port), 60, "the gateway to be ready")
            procs.append(subprocess.Popen([ISTHMUS, "worker"], env=env, cwd=REPO,
                                          stdout=(tmp_path / "worker.log").open("w"), stderr=subprocess.STDOUT))
            (tmp_path / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                "scrape_configs:\n"
                f"  - job_name: isthmus\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
                f"    authorization: {{credentials: '{METRICS_TOKEN}'}}\n")
            procs.append(subprocess.Popen(
                [prom, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=(tmp_path / "prometheus.log").open("w"), stderr=subprocess.STDOUT))
            base = f"http://127.0.0.1:{prom_port}"
            assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 401  # no token
            token = subprocess.run([ISTHMUS, "token", "--user", "alice", "--groups", "team-a"], env=env,
                                   capture_output=True, text=True, check=True, cwd=REPO).stdout.strip()
            h = {"Authorization": f"Bearer {token}"}
            ids = []
            for _ in range(2):
                r = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", json={**JOB, "command": ["sleep", "1"]},
                               headers=h, timeout=10)
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])

            def states():
                return [httpx.get(f"http://127.0.0.1:{port}/v1/jobs/{i}", headers=h, timeout=10).json()["state"]
                        for i in ids]

            def done():
                now = states()
                return all(s == "succeeded" for s in now) and now
            wait_for(done, 120, "both jobs to succeed on Slurm", diag=lambda: f"states: {states()}")
            finished = wait_for(lambda: query(base, 'isthmus_jobs_finished_total{state="succeeded",pool="slurm"}'),
                                60, "Prometheus to scrape the finished jobs")
            assert float(finished[0]["value"][1]) == 2
            assert finished[0]["metric"]["account"] == "team-a"
            waits = query(base, 'isthmus_job_queue_wait_seconds_count{pool="slurm"}')
            assert waits and float(waits[0]["value"][1]) == 2
            total = query(base, 'isthmus_pool_gpus{pool="slurm",state="total"}')
            assert total and float(total[0]["value"][1]) == 32  # 4 nodes x 8 fake GPUs
            charged = query(base, 'isthmus_account_gpu_seconds_charged_total{account="team-a",pool="slurm"}')
            assert charged and float(charged[0]["value"][1]) > 0
            up = query(base, 'up{job="isthmus"}')
            assert up and up[0]["value"][1] == "1"
        except BaseException:
            for name in ("gateway.log", "worker.log"):  # shown by pytest with the failure
                log = tmp_path / name
                print(f"--- {name} (last 60 lines)", *log.read_text(errors="replace").splitlines()[-60:], sep="\n")
            raise
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_the_grafana_dashboard_charts_only_series_the_gateway_exports(gw):
    import re

    gw.client.post("/v1/jobs", json=JOB, headers=gw.headers())
    gw.app.state.metrics_registry = None
    families = list(text_string_to_metric_families(gw.client.get("/metrics").text))
    exported = {s.name for fam in families for s in fam.samples}
    exported |= {f.name + ("_total" if f.type == "counter" else "") for f in families}  # declared, no sample yet
    dash = json.loads((REPO / "docs" / "grafana-isthmus.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"isthmus_[a-z_]+", t["expr"])}
    used |= {m for v in dash["templating"]["list"] for m in re.findall(r"isthmus_[a-z_]+", str(v.get("query", "")))}
    # pool series need a configured pool; the in-process gateway has none
    missing = {m for m in used if m not in exported and not m.startswith("isthmus_pool_")
               and not m.startswith("isthmus_job_queue_wait_seconds") and m != "isthmus_account_gpus_reserved"}
    assert used and not missing, missing
