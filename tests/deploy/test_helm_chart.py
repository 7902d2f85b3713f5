"""The Helm chart (deploy/helm/isthmus, issue #47 item 3), checked with the real Helm v4.

Helm is built from the Go module proxy by stack/kube/helm.sh into the stack's cache (once;
the script prints the cached binary's path at once afterwards). ``helm lint --strict`` and
``helm template`` run on the chart as a user would run them; the rendered YAML is parsed
and checked for what a user expects of the release: replica counts, the migration as a
pre-install/pre-upgrade hook, probes on routes the gateway really serves, settings the
gateway really reads, the pools file the gateway really parses, secrets referenced and not
copied, and the values schema refusing bad values with a message that names them.
Nothing here needs a cluster; tests/deploy/test_helm_install.py installs the chart on the stack's.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, missing_system

CHART = REPO / "deploy" / "helm" / "isthmus"
DB_URL = "postgresql+psycopg://isthmus:s3cret-pw@db.example.org:5432/isthmus"
RELEASE = "gw"


@pytest.fixture(scope="module")
def helm() -> Path:
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        missing_system("the Go toolchain (stack/kube/helm.sh builds Helm with it)")
    proc = subprocess.run(["bash", str(REPO / "stack/kube/helm.sh")], capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        missing_system(f"stack/kube/helm.sh could not build Helm: {proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def render(helm: Path, *sets: str, values: dict | None = None, tmp_path: Path | None = None) -> list[dict]:
    """The objects ``helm template`` renders (hooks included), with the given --set values."""
    args = ["template", RELEASE, str(CHART), "--namespace", "isthmus"]
    for s in sets:
        args += ["--set", s]
    if values is not None:
        assert tmp_path is not None
        f = tmp_path / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["-f", str(f)]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def refused(helm: Path, *sets: str) -> str:
    """The error of a ``helm template`` that must fail."""
    args = ["template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode != 0, f"helm template accepted {sets}"
    return proc.stderr


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered; have {[(o['kind'], o['metadata']['name']) for o in objs]}"
    return found[0]


def container(obj: dict) -> dict:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict) -> dict:
    return {e["name"]: e for e in c.get("env", [])}


def test_lint_strict_passes(helm):
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--set", f"database.url={DB_URL}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_lint_strict_with_every_optional_part_on(helm):
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--set", "database.existingSecret=pg-app",
                    "--set", "secrets.existingSecret=isthmus-secrets", "--set", "metrics.serviceMonitor.enabled=true",
                    "--set", "outputKeep.existingClaim=isthmus-output")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_release_has_the_expected_objects(helm):
    objs = render(helm, f"database.url={DB_URL}")
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == sorted([
        ("ConfigMap", "gw-isthmus"), ("Secret", "gw-isthmus"), ("ServiceAccount", "gw-isthmus"),
        ("Service", "gw-isthmus"), ("Deployment", "gw-isthmus-api"), ("Deployment", "gw-isthmus-worker"),
        ("PodDisruptionBudget", "gw-isthmus-api"), ("PodDisruptionBudget", "gw-isthmus-worker"),
        ("NetworkPolicy", "gw-isthmus-api"), ("NetworkPolicy", "gw-isthmus-worker"),
        ("NetworkPolicy", "gw-isthmus-migrate"), ("Secret", "gw-isthmus-migrate"), ("Job", "gw-isthmus-migrate"),
    ])  # no ServiceMonitor by default: it needs the Prometheus Operator's CRDs
    api, worker = one(objs, "Deployment", "gw-isthmus-api"), one(objs, "Deployment", "gw-isthmus-worker")
    assert api["spec"]["replicas"] == 2 and worker["spec"]["replicas"] == 2
    # The API serves without dispatching and without migrating; the workers dispatch.
    a = container(api)
    assert a["command"][:2] == ["isthmus", "serve"] and "--no-migrate" in a["command"]
    assert env_of(a)["ISTHMUS_DISPATCH_IN_SERVE"]["value"] == "false"
    assert container(worker)["command"] == ["isthmus", "worker"]
    assert "ISTHMUS_DISPATCH_IN_SERVE" not in env_of(container(worker))
    # The Service reaches the API pods only, on the port the API listens on.
    svc = one(objs, "Service", "gw-isthmus")
    assert svc["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    assert not svc["spec"]["selector"].items() <= worker["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert a["ports"][0] == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    assert "--port" in a["command"] and a["command"][a["command"].index("--port") + 1] == "8080"
    for c in (a, container(worker)):
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]


def test_replica_counts_follow_the_values(helm):
    objs = render(helm, f"database.url={DB_URL}", "api.replicas=5", "worker.replicas=3", "api.webWorkers=4")
    api = one(objs, "Deployment", "gw-isthmus-api")
    assert api["spec"]["replicas"] == 5
    assert one(objs, "Deployment", "gw-isthmus-worker")["spec"]["replicas"] == 3
    cmd = container(api)["command"]
    assert cmd[cmd.index("--workers") + 1] == "4"


def test_migration_is_a_pre_install_and_pre_upgrade_hook(helm):
    objs = render(helm, f"database.url={DB_URL}")
    job = one(objs, "Job", "gw-isthmus-migrate")
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
    assert container(job)["command"] == ["isthmus", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # The hook runs before the release's own Secret exists: its URL comes from a hook Secret
    # created just before it (a lower weight), which holds the same URL.
    ref = env_of(container(job))["ISTHMUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    hook_secret = one(objs, "Secret", ref["name"])
    sann = hook_secret["metadata"]["annotations"]
    assert sann["helm.sh/hook"] == ann["helm.sh/hook"]
    assert int(sann["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])
    assert base64.b64decode(hook_secret["data"][ref["key"]]).decode() == DB_URL
    # Nor the release's ServiceAccount: the Job runs as the namespace's default one.
    assert "serviceAccountName" not in job["spec"]["template"]["spec"]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    own_sa = render(helm, f"database.url={DB_URL}", "serviceAccount.create=false", "serviceAccount.name=ops")
    assert one(own_sa, "Job", "gw-isthmus-migrate")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    # No other object is a hook: the Deployments change only after the migration succeeded.
    hooks = {o["metadata"]["name"] for o in objs if "helm.sh/hook" in (o["metadata"].get("annotations") or {})}
    assert hooks == {"gw-isthmus-migrate"}


def test_migration_can_be_turned_off(helm):
    objs = render(helm, f"database.url={DB_URL}", "migration.enabled=false")
    assert not [o for o in objs if o["kind"] == "Job"]
    assert not [o for o in objs if o["metadata"]["name"] == "gw-isthmus-migrate" and o["kind"] == "Secret"]


def test_probe_paths_are_real_routes_of_the_gateway(helm, tmp_path):
    from gateway.app import create_app
    from gateway.kit.settings import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/probe.db", dev_mode=True,
                              dev_key_path=tmp_path / "dev.pem"))
    paths = app.openapi()["paths"]
    objs = render(helm, f"database.url={DB_URL}")
    c = container(one(objs, "Deployment", "gw-isthmus-api"))
    probes = {k: c[k]["httpGet"] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    for kind, probe in probes.items():
        assert "get" in paths.get(probe["path"], {}), f"{kind} {probe['path']} is not a GET route of the gateway"
        assert probe["port"] == "http"
    # The ServiceMonitor scrapes a real route as well.
    objs = render(helm, f"database.url={DB_URL}", "metrics.serviceMonitor.enabled=true")
    sm = one(objs, "ServiceMonitor", "gw-isthmus")
    assert "get" in paths.get(sm["spec"]["endpoints"][0]["path"], {})


def test_the_workers_liveness_probe_is_the_workers_own_health_port(helm):
    """`isthmus worker --health-port` (gateway/dispatch/health.py, tests/dispatch/test_worker_health.py)."""
    from click.testing import CliRunner

    from gateway.cli import main

    objs = render(helm, f"database.url={DB_URL}")
    c = container(one(objs, "Deployment", "gw-isthmus-worker"))
    assert c["command"] == ["isthmus", "worker"] and c["args"] == ["--health-port", "8461"], c
    assert c["ports"] == [{"name": "health", "containerPort": 8461}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--health-port" in CliRunner().invoke(main, ["worker", "--help"]).output
    off = container(one(render(helm, f"database.url={DB_URL}", "worker.healthPort=0"), "Deployment", "gw-isthmus-worker"))
    assert "livenessProbe" not in off and "args" not in off
    err = refused(helm, f"database.url={DB_URL}", "worker.healthPort=70000")
    assert "healthPort" in err, err


def test_every_setting_the_chart_sets_is_one_the_gateway_reads(helm, tmp_path):
    from gateway.kit.settings import Settings

    known = {f"ISTHMUS_{name.upper()}" for name in Settings.model_fields}
    objs = render(helm, values={"database": {"url": DB_URL}, "secrets": {"metricsToken": "t"},
                                "settings": {"LOG_LEVEL": "debug", "DISPATCH_LEASE_S": 60, "DEV_MODE": False}},
                  tmp_path=tmp_path)
    cm = one(objs, "ConfigMap", "gw-isthmus")
    names = {k for k in cm["data"] if k.startswith("ISTHMUS_")}
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            names |= {n for n in env_of(container(o)) if n.startswith("ISTHMUS_")}
    assert names - known == set(), "settings the gateway does not read"
    assert cm["data"]["ISTHMUS_LOG_LEVEL"] == "debug" and cm["data"]["ISTHMUS_DISPATCH_LEASE_S"] == "60"
    assert cm["data"]["ISTHMUS_DEV_MODE"] == "false"
    # The values really parse as the gateway's settings (types and cross-field checks).
    env = {k: v for k, v in cm["data"].items() if k.startswith("ISTHMUS_")}
    env["ISTHMUS_DATABASE_URL"] = DB_URL
    settings = Settings(**{k.removeprefix("ISTHMUS_").lower(): v for k, v in env.items()})
    assert settings.dispatch_lease_s == 60 and settings.log_level == "debug" and settings.metrics_access == "token"
    assert json.loads(settings.oidc_issuers) == []


def test_pools_file_is_one_the_gateway_parses(helm, tmp_path):
    from gateway.pools.config import from_file

    # The parser checks that key files exist: here they are in tmp_path, in a pod they would
    # be the extraVolumes mounted from a Secret.
    key = tmp_path / "slurm.key"
    key.write_bytes(b"k" * 32)
    pools = [{"name": "slurm-a100", "kind": "slurm", "cost": 2.0,
              "settings": {"rest_url": "http://slurm-a100.example.org:6820", "jwt_key_path": str(key),
                           "partition": "gpu"}},
             {"name": "slurm-h100", "kind": "slurm", "state": "draining",
              "settings": {"rest_url": "http://slurm-h100.example.org:6820", "jwt_key_path": str(key)}}]
    objs = render(helm, values={"database": {"url": DB_URL}, "pools": pools}, tmp_path=tmp_path)
    cm = one(objs, "ConfigMap", "gw-isthmus")
    f = tmp_path / "pools.yaml"
    f.write_text(cm["data"]["pools.yaml"])
    parsed = from_file(f)
    assert [(p.name, p.kind) for p in parsed] == [("slurm-a100", "slurm"), ("slurm-h100", "slurm")]
    # Mounted where ISTHMUS_POOLS_FILE says, in both workloads.
    for name in ("gw-isthmus-api", "gw-isthmus-worker"):
        mounts = {m["mountPath"]: m for m in container(one(objs, "Deployment", name))["volumeMounts"]}
        assert mounts[cm["data"]["ISTHMUS_POOLS_FILE"]]["subPath"] == "pools.yaml"
    # An empty pools list is a file the gateway reads as "no pool" (it starts; jobs wait).
    objs = render(helm, f"database.url={DB_URL}")
    f.write_text(one(objs, "ConfigMap", "gw-isthmus")["data"]["pools.yaml"])
    assert from_file(f) == []


def test_database_url_is_only_in_a_secret(helm):
    objs = render(helm, f"database.url={DB_URL}")
    for o in objs:
        if o["kind"] != "Secret":
            assert "s3cret-pw" not in yaml.safe_dump(o), f"{o['kind']}/{o['metadata']['name']} holds the password"
    secret = one(objs, "Secret", "gw-isthmus")
    assert base64.b64decode(secret["data"]["database-url"]).decode() == DB_URL
    for name in ("gw-isthmus-api", "gw-isthmus-worker"):
        ref = env_of(container(one(objs, "Deployment", name)))["ISTHMUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "gw-isthmus", "key": "database-url"}


def test_existing_secrets_are_referenced_not_inlined(helm):
    objs = render(helm, "database.existingSecret=pg-app", "database.existingSecretKey=uri",
                  "secrets.existingSecret=isthmus-secrets")
    # Nothing secret is rendered at all: the chart makes no Secret, the hook none either.
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Secret"] == []
    for name, kind in (("gw-isthmus-api", "Deployment"), ("gw-isthmus-worker", "Deployment"),
                       ("gw-isthmus-migrate", "Job")):
        env = env_of(container(one(objs, kind, name)))
        assert env["ISTHMUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pg-app", "key": "uri"}
        if kind == "Deployment":
            ref = env["ISTHMUS_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "isthmus-secrets" and ref["key"] == "metrics-token"
            assert env["ISTHMUS_UI_SESSION_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "isthmus-secrets"


def test_inline_secrets_go_to_the_chart_secret(helm):
    objs = render(helm, "database.existingSecret=pg-app", "secrets.metricsToken=scrape-me",
                  "secrets.uiSessionSecret=cookie-key")
    secret = one(objs, "Secret", "gw-isthmus")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"metrics-token": "scrape-me", "ui-session-secret": "cookie-key"}


def test_pods_run_as_non_root_with_a_read_only_root(helm):
    objs = render(helm, f"database.url={DB_URL}")
    for o in objs:
        if o["kind"] not in ("Deployment", "Job"):
            continue
        pod = o["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        c = container(o)
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        # What the process writes has a volume: /tmp, and the kept job output.
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/tmp" in mounts
        if o["kind"] == "Deployment":
            cm = one(objs, "ConfigMap", "gw-isthmus")
            assert cm["data"]["ISTHMUS_OUTPUT_KEEP_DIR"] in mounts


def test_pdb_and_network_policy(helm):
    objs = render(helm, f"database.url={DB_URL}", "networkPolicy.ingressFrom[0].podSelector.matchLabels.role=lb")
    api = one(objs, "Deployment", "gw-isthmus-api")
    for comp in ("api", "worker"):
        pdb = one(objs, "PodDisruptionBudget", f"gw-isthmus-{comp}")
        dep = one(objs, "Deployment", f"gw-isthmus-{comp}")
        assert pdb["spec"]["minAvailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    np_api = one(objs, "NetworkPolicy", "gw-isthmus-api")
    assert np_api["spec"]["podSelector"]["matchLabels"] == api["spec"]["selector"]["matchLabels"]
    (rule,) = np_api["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"role": "lb"}}}]
    assert one(objs, "NetworkPolicy", "gw-isthmus-worker")["spec"]["ingress"] == []
    off = render(helm, f"database.url={DB_URL}", "networkPolicy.enabled=false", "api.podDisruptionBudget.enabled=false")
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]
    assert [o["metadata"]["name"] for o in off if o["kind"] == "PodDisruptionBudget"] == ["gw-isthmus-worker"]


def test_service_monitor_is_optional_and_sends_the_token(helm):
    objs = render(helm, "database.existingSecret=pg-app", "secrets.existingSecret=isthmus-secrets",
                  "metrics.serviceMonitor.enabled=true")
    sm = one(objs, "ServiceMonitor", "gw-isthmus")
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == "http" and ep["path"] == "/metrics"
    assert ep["authorization"]["credentials"] == {"name": "isthmus-secrets", "key": "metrics-token"}
    svc = one(objs, "Service", "gw-isthmus")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    open_sm = one(render(helm, "database.existingSecret=pg-app", "metrics.serviceMonitor.enabled=true",
                         "metrics.access=open"), "ServiceMonitor", "gw-isthmus")
    assert "authorization" not in open_sm["spec"]["endpoints"][0]


def test_config_change_rolls_the_pods(helm):
    def checksum(*sets):
        api = one(render(helm, f"database.url={DB_URL}", *sets), "Deployment", "gw-isthmus-api")
        return api["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum() == checksum()
    assert checksum() != checksum("settings.LOG_LEVEL=debug")


def test_schema_refuses_negative_replicas(helm):
    err = refused(helm, f"database.url={DB_URL}", "api.replicas=-1")
    assert "replicas" in err and "minimum" in err, err


def test_schema_refuses_an_unknown_top_level_key(helm):
    err = refused(helm, f"database.url={DB_URL}", "replica=3")
    assert "replica" in err and "additional" in err.lower(), err


def test_schema_refuses_a_setting_the_chart_owns(helm):
    err = refused(helm, f"database.url={DB_URL}", "settings.DATABASE_URL=sqlite:///x")
    assert "settings.DATABASE_URL is set by the chart; use database.url or database.existingSecret" in err, err
    err = refused(helm, f"database.url={DB_URL}", "settings.DISPATCH_IN_SERVE=true")
    assert "settings.DISPATCH_IN_SERVE is set by the chart" in err, err
    # The names are upper case. (Helm v4.3.2 reports a propertyNames error at a wrong,
    # varying location, so only the name and the rule are checked.)
    err = refused(helm, f"database.url={DB_URL}", "settings.log_level=debug")
    assert "invalid propertyName 'log_level'" in err and "^[A-Z][A-Z0-9_]*$" in err, err


def test_schema_refuses_a_url_of_another_database_or_driver(helm):
    for url in ("mysql://isthmus:pw@db:3306/isthmus", "postgresql+psycopg2://isthmus:pw@db:5432/isthmus"):
        err = refused(helm, f"database.url={url}")
        assert "database" in err and "url" in err, err


def test_an_operators_plain_uri_is_taken_as_it_is(helm):
    """What CloudNativePG and managed services hand out: the gateway reads it as psycopg's
    (gateway/kit/settings.py; tests/ops/test_database_url.py)."""
    for url in ("postgresql://isthmus:pw@db:5432/isthmus", "postgres://isthmus:pw@db:5432/isthmus"):
        objs = render(helm, f"database.url={url}")
        secret = one(objs, "Secret", f"{RELEASE}-isthmus")
        assert base64.b64decode(secret["data"]["database-url"]).decode() == url


def test_a_release_without_a_database_is_refused_with_what_to_set(helm):
    err = refused(helm)
    assert "database.url" in err and "database.existingSecret" in err, err
    err = refused(helm, f"database.url={DB_URL}", "database.existingSecret=pg-app")
    assert "not both" in err, err


def test_host_network_and_placement(helm, tmp_path):
    tol = [{"key": "isthmus.io/real-node", "operator": "Exists", "effect": "NoSchedule"}]
    objs = render(helm, values={"database": {"url": DB_URL}, "hostNetwork": True,
                                "api": {"replicas": 1, "listenAddress": "10.246.0.1", "tolerations": tol},
                                "worker": {"replicas": 1, "tolerations": tol},
                                "migration": {"tolerations": tol, "nodeSelector": {"kubernetes.io/hostname": "n1"}}},
                  tmp_path=tmp_path)
    for kind, name in (("Deployment", "gw-isthmus-api"), ("Deployment", "gw-isthmus-worker"), ("Job", "gw-isthmus-migrate")):
        pod = one(objs, kind, name)["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert pod["tolerations"] == tol
    assert one(objs, "Job", "gw-isthmus-migrate")["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    cmd = container(one(objs, "Deployment", "gw-isthmus-api"))["command"]
    assert cmd[cmd.index("--host") + 1] == "10.246.0.1"
    # Off by default: the pods get the cluster's pod network.
    objs = render(helm, f"database.url={DB_URL}")
    assert "hostNetwork" not in one(objs, "Deployment", "gw-isthmus-api")["spec"]["template"]["spec"]


def test_pods_on_the_nodes_network_roll_old_first(helm, tmp_path):
    """A pod that takes a port of its node cannot start beside the one it replaces on that node:
    with hostNetwork the API (and a worker with a health port) roll old-first, else new-first
    (an upgrade with maxSurge 1 on the node's network stalled: tests/deploy/test_helm_upgrade.py)."""
    def strategies(values: dict) -> tuple[dict, dict]:
        objs = render(helm, values={"database": {"url": DB_URL}, **values}, tmp_path=tmp_path)
        return tuple(one(objs, "Deployment", f"gw-isthmus-{part}")["spec"]["strategy"]["rollingUpdate"]
                     for part in ("api", "worker"))

    old_first, new_first = {"maxUnavailable": 1, "maxSurge": 0}, {"maxUnavailable": 0, "maxSurge": 1}
    assert strategies({"hostNetwork": True}) == (old_first, old_first)
    assert strategies({"hostNetwork": False}) == (new_first, new_first)
    # The API in the pod network while the workers stay on the node's (the failover test's layout).
    assert strategies({"hostNetwork": True, "api": {"hostNetwork": False}}) == (new_first, old_first)
    assert strategies({"hostNetwork": True, "worker": {"healthPort": 0}}) == (old_first, new_first)
