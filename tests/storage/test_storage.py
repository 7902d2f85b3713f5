"""Storage across pools (#29) on the real systems: the five pools of the test stack, the
Slurm clusters' one shared file system (``.stack/shared``, bind-mounted at the same path
into the chroot clusters, stack/slurm/up.sh) and claims bound on the real API server.

What a user notices: a file one job writes on one Slurm cluster is read by the next on
another; a job with mounts goes only where its storage is; refusals name the field and write
nothing; another account cannot read an account's checkpoints (tried on the Slurm nodes, as
the other account's POSIX user); a job resuming another sees the same checkpoint directory on
another cluster; the Job the Kubernetes adapter creates mounts each claim at its path with
the account's sub-path; and on a sixth pool, the control plane's one real node
(stack/kube/node.sh), a real container reads through the claim what two Slurm clusters wrote,
and another account can read a container's checkpoint neither in a container nor on Slurm.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from adapters.envfile import read_env_file
from gateway.pools.adapters import BackendConfigError
from stack.backends_json import kube_node_settings
from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    job_state,
    kube_env,
    wired_gateway,
)
from tests.e2e.conftest import ISTHMUS
from tests.pools.test_five_pools import FINAL, five_pools  # noqa: F401  (five_pools: a fixture)
from tests.ui.test_pages import (
    SECRET as UI_SECRET,  # the /ui session cookies of tests/ui
)
from tests.ui.test_pages import page_as

pytestmark = [pytest.mark.slurm("22.05", "24.11", "26.05"), pytest.mark.kubernetes, pytest.mark.postgres]

SHARED = REPO / ".stack" / "shared"
RUN = secrets.token_hex(4)  # this run's directories and claims: a rerun never meets an earlier one's files
NAMESPACES = ("team-a", "team-b")


NODE_ENV = REPO / ".stack" / "kube" / "node.env"
NODE_POOL = "kube-node"  # the control plane's one real node (stack/kube/node.sh): real containers


@pytest.fixture(scope="module")
def pools(five_pools) -> list[dict]:
    """The stack's five pools and a sixth: the real node's ClusterQueue, whose containers run
    the local Debian image as the stack's users at their Slurm uids."""
    if not SHARED.is_dir():
        missing_system(f"{SHARED} missing: the test stack is not up (stack/up.sh)")
    if not NODE_ENV.is_file():
        missing_system(f"{NODE_ENV} missing: the real node is not up (stack/kube/node.sh)")
    node = read_env_file(NODE_ENV)
    return [*five_pools, {"name": NODE_POOL, "kind": "kubernetes", "gpu_types": [node["ISTHMUS_KUBE_NODE_GPU_TYPE"]],
                          "settings": kube_node_settings(kube_env(), node)}]


@pytest.fixture(scope="module")
def root() -> Path:
    base = SHARED / f"t-{RUN}"
    for name in ("data", "ckpt", "secret", "refdata"):
        (base / name).mkdir(parents=True)
        (base / name).chmod(0o1777)  # like /tmp: each job's user makes (and owns) its directories
    (base / "refdata" / "vocab.txt").write_text("the reference vocabulary\n")
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture(scope="module")
def k8s():
    from kubernetes import client, config

    env = kube_env()
    cfg = client.Configuration()
    config.load_kube_config(config_file=env["KUBECONFIG"], client_configuration=cfg)
    api = client.ApiClient(cfg)
    yield env, client.CoreV1Api(api), client.BatchV1Api(api)
    api.close()


def _namespace(env, account: str) -> str:
    return env.get("ISTHMUS_KUBE_NS_PREFIX", "isthmus-") + account


@contextlib.contextmanager
def claims(k8s, root: Path, specs: dict[str, tuple[str, str | None]]):
    """``claim name -> (access mode, directory or None)`` in each test account's namespace:
    bound to a hostPath volume of its own when a directory is given, else left Pending."""
    env, core, _ = k8s
    made: list[tuple[str, str | None]] = []
    try:
        for account in NAMESPACES:
            ns = _namespace(env, account)
            for claim, (mode, directory) in specs.items():
                pv = f"isthmus-{RUN}-{account}-{claim}"[:63]
                if directory is not None:
                    core.create_persistent_volume({
                        "metadata": {"name": pv}, "spec": {
                            "capacity": {"storage": "1Gi"}, "accessModes": [mode], "storageClassName": "",
                            "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": directory}}})
                core.create_namespaced_persistent_volume_claim(ns, {
                    "metadata": {"name": claim}, "spec": {
                        "accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}},
                        "storageClassName": "" if directory is not None else f"isthmus-none-{RUN}",
                        **({"volumeName": pv} if directory is not None else {})}})
                made.append((ns, claim))
                if directory is not None:
                    made.append(("", pv))
        deadline = time.monotonic() + 60
        for ns, claim in made:
            if not ns or specs[claim][1] is None:
                continue
            while core.read_namespaced_persistent_volume_claim(claim, ns).status.phase != "Bound":
                assert time.monotonic() < deadline, f"claim {ns}/{claim} not bound in 60 s"
                time.sleep(0.5)
        yield
    finally:
        for ns, name in made:
            with contextlib.suppress(Exception):
                if ns:
                    core.delete_namespaced_persistent_volume_claim(name, ns)
                else:
                    core.delete_persistent_volume(name)


DATA_CLAIM, CKPT_CLAIM = f"data-{RUN}", f"ckpt-{RUN}"  # a claim being deleted keeps its name a while


def pools_file(tmp_path: Path, pools: list[dict], root: Path, *, data_claim: str = DATA_CLAIM,
               ckpt_claim: str = CKPT_CLAIM) -> Path:
    storage = [
        {"name": "data", "path": f"{root}/data", "mode": "read-write", "tenancy": "shared",
         "pools": {"slurm-22": {}, "slurm-24": {}, "kube-a100": {"pvc": data_claim}, NODE_POOL: {"pvc": data_claim}}},
        {"name": "ckpt", "path": f"{root}/ckpt", "mode": "read-write",
         "pools": {"slurm-22": {}, "slurm-24": {}, "slurm-26": {}, "kube-a100": {"pvc": ckpt_claim},
                   NODE_POOL: {"pvc": ckpt_claim}}},
        {"name": "secret", "path": f"{root}/secret", "mode": "read-write", "accounts": ["team-a"],
         "pools": {"slurm-22": {}}},
        {"name": "refdata", "path": f"{root}/refdata", "mode": "read-only", "pools": {"slurm-22": {}, "slurm-24": {}}},
    ]
    path = tmp_path / f"pools-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump({"pools": pools, "storage": storage}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def pg_url(pools):
    with postgres_database(migrated=True) as url:
        yield url


@pytest.fixture(scope="module")
def gw(pg_url, dev_key_path, pools, root, k8s, tmp_path_factory):
    with claims(k8s, root, {DATA_CLAIM: ("ReadWriteMany", f"{root}/data"),
                            CKPT_CLAIM: ("ReadWriteMany", f"{root}/ckpt")}):
        path = pools_file(tmp_path_factory.mktemp("storage"), pools, root)
        with wired_gateway(pg_url, dev_key_path, {}, pools_file=str(path), ui_session_secret=UI_SECRET) as gw:
            gw.admin = gw.headers("root", admin=True)
            gw.pools_path = path
            yield gw


def user(gw, account: str) -> dict:
    return gw.headers("alice" if account == "team-a" else "bob", (account,))


def submit(gw, account="team-a", expect=202, **spec) -> dict:
    body = {"name": "storage", "account": account, "workers": 1, "gpus_per_worker": 8, "time_limit": "2m",
            "labels": {KWOK_RUN_FOR: "2s"}, **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=user(gw, account))
    assert r.status_code == expect, r.text
    return r.json()


def finish(gw, *job_ids: str) -> dict[str, dict]:
    drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in job_ids), timeout_s=120)
    return {j: gw.client.get(f"/v1/jobs/{j}", headers=gw.admin).json() for j in job_ids}


def output(gw, job_id: str, account="team-a") -> str:
    r = gw.client.get(f"/v1/jobs/{job_id}/logs", params={"worker": 0}, headers=user(gw, account))
    assert r.status_code == 200, r.text
    return r.text


def page(gw, job_id: str, account="team-a") -> str:
    """The job's dashboard page, as its owner sees it."""
    return page_as(gw, user(gw, account), f"/ui/jobs/{job_id}")


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def _count_jobs(gw) -> int:
    return len(gw.client.get("/v1/jobs", params={"limit": 500}, headers=gw.admin).json()["items"])


# ------------------------------------------------------------------ refusals and routing


def test_a_mount_the_job_cannot_have_is_refused_naming_the_field_and_nothing_is_written(gw):
    before = _count_jobs(gw)
    cases = [
        ({"pool": "slurm-26", "mounts": [{"storage": "data"}]}, "team-a",
         "body.mounts[0].storage", "slurm-26 has no storage 'data'"),
        ({"pool": "slurm-22", "mounts": [{"storage": "data", "path": "/data"}]}, "team-a",
         "body.mounts[0].path", "slurm-22: a Slurm job sees storage where the nodes' shared file system has it"),
        ({"mounts": [{"storage": "secret"}]}, "team-b", "body.mounts[0].storage",
         "account 'team-b' may not use storage 'secret'"),
        ({"mounts": [{"storage": "refdata", "read_only": False}]}, "team-a", "body.mounts[0].read_only",
         "storage 'refdata' is read-only"),
        ({"mounts": [{"storage": "nope"}]}, "team-a", "body.mounts[0].storage", "no storage named 'nope'"),
        ({"checkpoint": {"storage": "refdata"}}, "team-a", "body.checkpoint.storage", "read-only"),
        ({"pool": "kube-h100", "checkpoint": {"storage": "ckpt"}}, "team-a", "body.checkpoint.storage",
         "kube-h100 has no storage 'ckpt'"),
        ({"checkpoint": {"storage": "ckpt"}, "resume_from": "00000000-0000-4000-8000-000000000000"}, "team-a",
         "body.resume_from", "no job 00000000-0000-4000-8000-000000000000 of account 'team-a'"),
    ]
    for extra, account, field, message in cases:
        r = gw.client.post("/v1/jobs", json={"name": "bad", "account": account, "command": ["true"], **extra},
                           headers=user(gw, account))
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
        errors = r.json()["errors"]
        assert any(e["field"] == field and message in e["message"] for e in errors), (extra, errors)
    assert _count_jobs(gw) == before


def test_jobs_with_mounts_go_only_to_pools_that_have_the_storage(gw):
    ids = [submit(gw, command=["true"], mounts=[{"storage": "data"}])["id"] for _ in range(3)]
    done = finish(gw, *ids)
    for job in done.values():
        assert job["state"] == "succeeded", job
        assert job["assigned_pool"] in ("slurm-22", "slurm-24", "kube-a100"), job["routing_reason"]
        for other in ("slurm-26", "kube-h100"):
            assert f"{other}: cannot run this job (no storage 'data')" in job["routing_reason"]
        assert job["mounts"] == [{"storage": "data", "path": None, "read_only": None}]


def test_list_storage_shows_each_user_what_they_may_mount_and_admins_its_health(gw):
    bob = gw.client.get("/v1/storage", headers=user(gw, "team-b")).json()["items"]
    assert [s["name"] for s in bob] == ["ckpt", "data", "refdata"]
    ckpt = next(s for s in bob if s["name"] == "ckpt")
    assert ckpt["directories"] == {"team-b": ckpt["path"] + "/team-b"} and ckpt["tenancy"] == "account"
    assert all(p["healthy"] is None for s in bob for p in s["pools"])  # health is for admins
    admin = gw.client.get("/v1/storage", headers=gw.admin).json()["items"]
    assert [s["name"] for s in admin] == ["ckpt", "data", "refdata", "secret"]
    kube = next(p for s in admin if s["name"] == "data" for p in s["pools"] if p["pool"] == "kube-a100")
    assert kube == {"pool": "kube-a100", "provider": "pvc", "healthy": True, "reason": "ok"}


# ------------------------------------------------------------------ data and checkpoints on Slurm


def test_a_file_written_on_one_slurm_cluster_is_read_on_another(gw):
    first = submit(gw, pool="slurm-22", mounts=[{"storage": "data"}],
                   command=sh('echo "written on $(hostname) by $(id -un)" > "$ISTHMUS_STORAGE_DATA/hello.txt"'))
    second = submit(gw, pool="slurm-24", mounts=[{"storage": "data"}, {"storage": "refdata"}],
                    depends_on=[{"job": first["id"]}],
                    command=sh('cat "$ISTHMUS_STORAGE_DATA/hello.txt" "$ISTHMUS_STORAGE_REFDATA/vocab.txt"'))
    done = finish(gw, first["id"], second["id"])
    assert [done[j]["state"] for j in (first["id"], second["id"])] == ["succeeded", "succeeded"], done
    text = output(gw, second["id"])
    assert "by alice" in text and "the reference vocabulary" in text, text


def test_another_account_cannot_read_an_accounts_checkpoints(gw):
    writer = submit(gw, pool="slurm-22", checkpoint={"storage": "ckpt"}, mounts=[{"storage": "secret"}],
                    command=sh('echo step-7 > "$ISTHMUS_CHECKPOINT_DIR/state" && '
                               'echo team-a-only > "$ISTHMUS_STORAGE_SECRET/key"'))
    done = finish(gw, writer["id"])[writer["id"]]
    assert done["state"] == "succeeded", done
    ckpt_dir = done["checkpoint_dir"]
    assert ckpt_dir.endswith(f"/ckpt/team-a/checkpoints/{writer['id']}")
    # bob (team-b) on the same cluster, reading team-a's directories by their paths.
    root = Path(ckpt_dir).parents[3]  # the test's storage directories
    thief = submit(gw, "team-b", pool="slurm-22", mounts=[{"storage": "ckpt"}],
                   command=sh(f'cat {ckpt_dir}/state; ls {root}/secret/team-a; echo "mine: $ISTHMUS_STORAGE_CKPT"'))
    stolen = finish(gw, thief["id"])[thief["id"]]
    text = output(gw, thief["id"], "team-b")
    assert "step-7" not in text and "team-a-only" not in text, text
    assert text.count("Permission denied") == 2, text
    assert f"mine: {root}/ckpt/team-b" in text, text
    assert stolen["state"] == "succeeded", stolen  # it ran; it just could not read


def test_a_job_resuming_another_sees_the_same_checkpoint_dir_on_another_cluster(gw):
    first = submit(gw, pool="slurm-22", checkpoint={"storage": "ckpt"},
                   command=sh('echo epoch-3 > "$ISTHMUS_CHECKPOINT_DIR/last"'))
    assert first["checkpoint_dir"].endswith(f"/checkpoints/{first['id']}")
    finish(gw, first["id"])
    second = submit(gw, pool="slurm-26", checkpoint={"storage": "ckpt"}, resume_from=first["id"],
                    command=sh('cat "$ISTHMUS_CHECKPOINT_DIR/last"; echo "dir=$ISTHMUS_CHECKPOINT_DIR"'))
    assert second["checkpoint_dir"] == first["checkpoint_dir"]
    third = submit(gw, pool="slurm-24", checkpoint={"storage": "ckpt"}, resume_from=second["id"],
                   command=["true"])
    assert third["checkpoint_dir"] == first["checkpoint_dir"]  # the chain's first job names it
    done = finish(gw, second["id"], third["id"])
    assert done[second["id"]]["state"] == "succeeded", done
    text = output(gw, second["id"])
    assert "epoch-3" in text and f"dir={first['checkpoint_dir']}" in text, text
    html = page(gw, second["id"])
    assert f'<code id="checkpoint-dir">{first["checkpoint_dir"]}</code>' in html
    # Another account cannot resume it.
    r = gw.client.post("/v1/jobs", json={"name": "x", "account": "team-b", "command": ["true"],
                                         "checkpoint": {"storage": "ckpt"}, "resume_from": first["id"]},
                       headers=user(gw, "team-b"))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.resume_from", r.text


# ------------------------------------------------------------------ Kubernetes: the Job on the API server


def test_the_kubernetes_job_mounts_each_claim_at_its_path_with_the_accounts_subpath(gw, k8s):
    env, _, batch = k8s
    job = submit(gw, pool="kube-a100", command=["true"], checkpoint={"storage": "ckpt"},
                 mounts=[{"storage": "data", "read_only": True}, {"storage": "ckpt", "path": "/ckpt"}])
    drive_until(gw, lambda: job_state(gw, job["id"], "queued", "starting", "running", *FINAL))
    backend_job_id = gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.admin).json()["backend_job_id"]
    ns, name = backend_job_id.split("/", 1)
    assert ns == _namespace(env, "team-a")
    pod = batch.read_namespaced_job(name, ns).to_dict()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = {name: (v["persistent_volume_claim"]["claim_name"], bool(v["persistent_volume_claim"]["read_only"]))
             for name, v in volumes.items()}  # the API server leaves out readOnly: false
    assert claim == {"storage-data": (DATA_CLAIM, True), "storage-ckpt": (CKPT_CLAIM, False)}
    mounts = [(m["name"], m["mount_path"], m["sub_path"], bool(m["read_only"]))
              for m in pod["containers"][0]["volume_mounts"]]
    root = job["checkpoint_dir"].split("/ckpt/")[0]
    assert mounts == [
        ("storage-data", f"{root}/data", None, True),
        ("storage-ckpt", "/ckpt", "team-a", False),
        ("storage-ckpt", job["checkpoint_dir"], f"team-a/checkpoints/{job['id']}", False)]
    env_vars = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env_vars["ISTHMUS_CHECKPOINT_DIR"] == job["checkpoint_dir"] and env_vars["ISTHMUS_STORAGE_CKPT"] == "/ckpt"
    finish(gw, job["id"])


# ------------------------------------------------------------------ the real node: real containers, real claims


def on_node(gw, account="team-a", **spec) -> dict:
    """A one-worker job on the real node (2 extended-resource GPUs, 2 CPUs): 1 GPU unless asked."""
    return submit(gw, account, pool=NODE_POOL, **{"gpus_per_worker": 1, "memory_per_worker": "256Mi", **spec})


def test_a_pipeline_writes_on_one_slurm_cluster_reads_on_another_and_in_a_real_container(gw, root):
    name = f"pipeline-{secrets.token_hex(3)}.txt"
    first = submit(gw, pool="slurm-22", mounts=[{"storage": "data"}], checkpoint={"storage": "ckpt"},
                   command=sh(f'echo "step 1 on $(hostname) by $(id -un)" > "$ISTHMUS_STORAGE_DATA/{name}" && '
                              'echo epoch-1 > "$ISTHMUS_CHECKPOINT_DIR/last"'))
    second = submit(gw, pool="slurm-24", mounts=[{"storage": "data"}], depends_on=[{"job": first["id"]}],
                    command=sh(f'echo "step 2 on $(hostname) by $(id -un)" >> "$ISTHMUS_STORAGE_DATA/{name}"'))
    third = on_node(gw, depends_on=[{"job": second["id"]}], mounts=[{"storage": "data", "read_only": True}],
                    checkpoint={"storage": "ckpt"}, resume_from=first["id"],
                    command=sh(f'cat "$ISTHMUS_STORAGE_DATA/{name}" "$ISTHMUS_CHECKPOINT_DIR/last"; '
                               'echo "step 3 in $(hostname) as uid $(id -u)"; '
                               'echo step-3 > "$ISTHMUS_CHECKPOINT_DIR/last"; '
                               f'echo overwritten > "$ISTHMUS_STORAGE_DATA/{name}" || echo "data is read-only"'))
    done = finish(gw, first["id"], second["id"], third["id"])
    assert [done[j["id"]]["state"] for j in (first, second, third)] == ["succeeded"] * 3, done
    node = read_env_file(NODE_ENV)
    assert done[third["id"]]["nodes"] == [node["ISTHMUS_KUBE_NODE_NAME"]], done[third["id"]]
    # The container's own output, through the gateway's logs API.
    lines = output(gw, third["id"]).splitlines()
    alice = dict(p.split("=") for p in node["ISTHMUS_KUBE_NODE_UID_MAP"].split(","))["alice"]
    # stderr and stdout are two streams the runtime logs apart: the shell's one stderr line
    # may come anywhere among the stdout lines (a CI run had it first), so it is taken out.
    err = [line for line in lines if line.endswith(f"{name}: Read-only file system")]
    text = [line for line in lines if line not in err]
    assert len(err) == 1 and len(text) == 5, lines
    assert text[0].startswith("step 1 on ") and text[0].endswith(" by alice"), text
    assert text[1].startswith("step 2 on ") and text[1].endswith(" by alice"), text
    assert text[2] == "epoch-1", text
    assert text[3].startswith("step 3 in isthmus-") and text[3].endswith(f" as uid {alice}"), text
    assert text[4] == "data is read-only", text
    # What the container wrote is on the shared file system, where the Slurm clusters see it.
    assert (Path(first["checkpoint_dir"]) / "last").read_text() == "step-3\n"
    assert not (root / "data" / name).read_text().startswith("overwritten")


def test_another_account_cannot_read_a_checkpoint_a_real_container_wrote(gw, root):
    writer = on_node(gw, checkpoint={"storage": "ckpt"}, command=sh('echo alice-secret > "$ISTHMUS_CHECKPOINT_DIR/state"'))
    done = finish(gw, writer["id"])[writer["id"]]
    assert done["state"] == "succeeded", (done, output(gw, writer["id"]))
    ckpt_dir = Path(done["checkpoint_dir"])
    assert (ckpt_dir / "state").read_text() == "alice-secret\n"
    # Made by alice, for alice only, as on Slurm (the kubelet would make it root's, mode 1777).
    uids = dict(p.split("=") for p in read_env_file(NODE_ENV)["ISTHMUS_KUBE_NODE_UID_MAP"].split(","))
    st = ckpt_dir.stat()
    assert (st.st_uid, oct(st.st_mode & 0o7777)) == (int(uids["alice"]), "0o700"), (st.st_uid, oct(st.st_mode))
    # bob (team-b), in a container on the same node, mounting the same storage: he sees his
    # account's directory at the storage's path, and nothing of team-a's ...
    in_pod = on_node(gw, "team-b", mounts=[{"storage": "ckpt"}],
                     command=sh(f'cat {ckpt_dir}/state; ls -A {root}/ckpt; echo "mine: $ISTHMUS_STORAGE_CKPT"'))
    # ... and on a Slurm cluster sharing the file system, he is refused.
    on_slurm = submit(gw, "team-b", pool="slurm-22", mounts=[{"storage": "ckpt"}], command=sh(f"cat {ckpt_dir}/state"))
    done = finish(gw, in_pod["id"], on_slurm["id"])
    text = output(gw, in_pod["id"], "team-b")
    assert done[in_pod["id"]]["state"] == "succeeded", (done, text)
    assert "alice-secret" not in text and "team-a" not in text.replace(str(ckpt_dir), ""), text
    assert f"cat: {ckpt_dir}/state: No such file or directory" in text, text
    assert f"mine: {root}/ckpt" in text, text
    text = output(gw, on_slurm["id"], "team-b")
    assert "alice-secret" not in text and "Permission denied" in text, text


def test_a_checkpoint_dir_replaced_by_a_link_into_another_accounts_is_refused_before_any_job_uses_it(gw, root, k8s):
    """Issue #45: a job of team-a that mounts its account's directory could replace
    ``team-a/checkpoints/<lineage>`` with a link into team-b's; the kubelet follows a
    subPath's links that stay inside the volume, so the next ``resume_from`` job would run in
    team-b's directory. Tried on the real node (a real kubelet, real containers) and on Slurm:
    the job's directory helper (init container) and the Slurm script refuse the link, and the
    job fails before its command runs."""
    theirs = on_node(gw, "team-b", checkpoint={"storage": "ckpt"},
                     command=sh('echo bob-secret > "$ISTHMUS_CHECKPOINT_DIR/state"'))
    mine = on_node(gw, checkpoint={"storage": "ckpt"}, command=sh('echo epoch-1 > "$ISTHMUS_CHECKPOINT_DIR/last"'))
    done = finish(gw, theirs["id"], mine["id"])
    assert [done[j["id"]]["state"] for j in (theirs, mine)] == ["succeeded"] * 2, done
    a_dir, b_dir = Path(done[mine["id"]]["checkpoint_dir"]), Path(done[theirs["id"]]["checkpoint_dir"])
    alice = a_dir.stat().st_uid
    # What team-a's other job could do in its account's directory: a relative link, inside the volume.
    subprocess.run(["rm", "-rf", str(a_dir)], check=True)
    a_dir.symlink_to(os.path.relpath(b_dir, a_dir.parent))
    os.lchown(a_dir, alice, alice)
    probe = sh('ls -ln "$ISTHMUS_CHECKPOINT_DIR"; cat "$ISTHMUS_CHECKPOINT_DIR/state"; echo ran')
    in_pod = on_node(gw, checkpoint={"storage": "ckpt"}, resume_from=mine["id"], command=probe)
    on_slurm = submit(gw, pool="slurm-22", checkpoint={"storage": "ckpt"}, resume_from=mine["id"], command=probe)
    done = finish(gw, in_pod["id"], on_slurm["id"])
    assert done[in_pod["id"]]["state"] == "failed" and done[on_slurm["id"]]["state"] == "failed", done
    for job in (in_pod, on_slurm):  # the command never ran: no output at all
        r = gw.client.get(f"/v1/jobs/{job['id']}/logs", params={"worker": 0}, headers=user(gw, "team-a"))
        assert r.status_code != 200 and "bob-secret" not in r.text, r.text
    # The real node: the directory helper (init container) refused it, the worker never started.
    _, core, _ = k8s
    ns, name = done[in_pod["id"]]["backend_job_id"].split("/")
    pods = core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items
    assert pods, f"no pod of {ns}/{name}"
    for pod in pods:
        (init,) = pod.status.init_container_statuses
        assert init.name == "isthmus-mkdir" and init.state.terminated.exit_code == 66, init
        assert pod.status.container_statuses[0].state.running is None
        assert not pod.status.container_statuses[0].state.terminated, pod.status.container_statuses
    # Slurm: the batch script stopped before srun (exit 66), saying why in its own output.
    batch = Path(read_env_file(REPO / ".stack" / "slurm-22.05" / "env")["SLURM_WORK_DIR"]) / \
        f"slurm-{done[on_slurm['id']]['backend_job_id']}.out"
    assert f"isthmus: {a_dir} is a symbolic link: a job's directories are never links" in batch.read_text()
    assert done[on_slurm["id"]]["exit_code"] == 66, done[on_slurm["id"]]
    assert (b_dir / "state").read_text() == "bob-secret\n"
    a_dir.unlink()


# ------------------------------------------------------------------ start-up checks through the real API server


def test_a_claim_that_is_missing_unbound_or_read_only_stops_start_up(gw, pg_url, dev_key_path, pools, root, k8s,
                                                                     tmp_path):
    env = k8s[0]
    ns = _namespace(env, "team-a")
    pending, rox = f"pending-{RUN}", f"rox-{RUN}"
    with claims(k8s, root, {pending: ("ReadWriteMany", None), rox: ("ReadOnlyMany", f"{root}/ckpt")}):
        cases = [
            ({"ckpt_claim": "missing-claim"}, f"claim 'missing-claim' does not exist in namespace '{ns}'"),
            ({"ckpt_claim": pending}, f"claim '{pending}' in namespace '{ns}' is Pending, not Bound"),
            ({"ckpt_claim": rox}, (f"the storage is read-write but claim '{rox}' in namespace '{ns}' is "
                                  "ReadOnlyMany")),
        ]
        for kwargs, message in cases:
            path = pools_file(tmp_path, pools, root, **kwargs)
            with pytest.raises(BackendConfigError) as err:
                with wired_gateway(pg_url, dev_key_path, {}, pools_file=str(path)):
                    pass
            assert str(err.value) == f"storage 'ckpt', field 'pools.kube-a100': {message}"
        # `isthmus worker` stops with that one line too.
        env_vars = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
        env_vars.update(ISTHMUS_DATABASE_URL=pg_url, ISTHMUS_POOLS_FILE=str(path))
        r = subprocess.run([ISTHMUS, "worker", "--once"], env=env_vars, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert [line for line in r.stderr.splitlines() if line.startswith("Error:")] == [
            f"Error: storage 'ckpt', field 'pools.kube-a100': {cases[-1][1]}"], r.stderr
