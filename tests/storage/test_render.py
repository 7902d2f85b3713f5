"""What each adapter makes of a job's mounts (#29), without a cluster: the Slurm batch
script's directory checks and the Kubernetes pod's volumes. The same rendering is run on the
real clusters in tests/storage/test_storage.py; this pins the details a test there cannot see
(quoting, the refusal of a mount Slurm cannot honour)."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from adapters.base import SubmissionRejected, SubmitRequest, VolumeMount
from adapters.kubernetes.render import MKDIR_SCRIPT, render_job, render_mounts
from adapters.kubernetes.settings import KubernetesSettings
from adapters.slurm.script import mount_lines, render_script


def _request(*mounts: VolumeMount) -> SubmitRequest:
    return SubmitRequest(gateway_job_id="j", name="n", account="team-a", user="alice", command=["true"], workers=1,
                         gpus_per_worker=0, cpus_per_worker=1, memory_mib_per_worker=64, time_limit_s=60,
                         mounts=mounts)


def test_the_slurm_script_makes_the_accounts_directory_and_fails_at_once_without_the_storage(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    own = VolumeMount(storage="ckpt", path=f"{root}/team-a", root=str(root), sub_path="team-a", read_only=False,
                      create=True)
    missing = VolumeMount(storage="data", path=str(tmp_path / "absent"), root=str(tmp_path / "absent"))
    script = tmp_path / "job.sh"
    script.write_text(render_script(["true"], {}, 1, mounts=[own]).replace("exec srun", "exec true"))
    r = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert r.returncode == 0 and (root / "team-a").is_dir(), r.stderr
    assert oct((root / "team-a").stat().st_mode & 0o777) == "0o700"  # the job's user only
    script.write_text("\n".join(["#!/bin/sh", *mount_lines([own, missing]), "echo ran"]) + "\n")
    r = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert r.returncode == 66 and "ran" not in r.stdout
    assert r.stderr.strip() == f"isthmus: storage 'data' is not available at {tmp_path}/absent on this node"


def test_slurm_cannot_show_a_storage_anywhere_but_where_it_is():
    with pytest.raises(SubmissionRejected, match="only at its own path"):
        mount_lines([VolumeMount(storage="data", path="/data", root="/shared/data")])
    with pytest.raises(SubmissionRejected, match="via pvc"):
        mount_lines([VolumeMount(storage="data", path="/shared/data", root="/shared/data", provider="pvc",
                                 claim="c")])


def test_the_pod_has_one_volume_per_storage_and_a_mount_per_directory():
    volumes, mounts = render_mounts(_request(
        VolumeMount(storage="data", path="/shared/data", root="/shared/data", provider="nfs", server="nfs1",
                    source_path="/export/data"),
        VolumeMount(storage="ckpt", path="/shared/ckpt/team-a", root="/shared/ckpt", sub_path="team-a",
                    read_only=True, provider="pvc", claim="ckpt"),
        VolumeMount(storage="ckpt", path="/shared/ckpt/team-a/checkpoints/j", root="/shared/ckpt",
                    sub_path="team-a/checkpoints/j", read_only=False, provider="pvc", claim="ckpt", create=True),
        VolumeMount(storage="scratch", path="/scratch", root="/srv/scratch", provider="host_path",
                    source_path="/srv/scratch", read_only=False)))
    assert volumes == [
        {"name": "storage-data", "nfs": {"server": "nfs1", "path": "/export/data", "readOnly": True}},
        # Writable because one of its mounts writes; the other mount of it is still read-only.
        {"name": "storage-ckpt", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": False}},
        {"name": "storage-scratch", "hostPath": {"path": "/srv/scratch", "type": "Directory"}}]
    assert mounts == [
        {"name": "storage-data", "mountPath": "/shared/data", "readOnly": True},
        {"name": "storage-ckpt", "mountPath": "/shared/ckpt/team-a", "readOnly": True, "subPath": "team-a"},
        {"name": "storage-ckpt", "mountPath": "/shared/ckpt/team-a/checkpoints/j", "readOnly": False,
         "subPath": "team-a/checkpoints/j"},
        {"name": "storage-scratch", "mountPath": "/scratch", "readOnly": False}]


def test_the_pods_directories_are_made_by_the_jobs_user_in_the_sites_image():
    ckpt = VolumeMount(storage="ckpt", path="/shared/ckpt/team-a/checkpoints/j", root="/shared/ckpt",
                       sub_path="team-a/checkpoints/j", read_only=False, provider="pvc", claim="ckpt", create=True)
    data = VolumeMount(storage="data", path="/shared/data", root="/shared/data", provider="pvc", claim="data")
    request = dataclasses.replace(_request(data, ckpt), image="user/own:1")
    settings = KubernetesSettings(uid_map={"alice": 2001}, helper_image="site/tools:1")
    pod = render_job(request, settings)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    worker = pod["containers"][0]
    assert init["image"] == "site/tools:1" and worker["image"] == "user/own:1"
    # argv, no shell string from the request: the directories are arguments of a fixed script.
    assert init["command"] == ["sh", "-c", MKDIR_SCRIPT, "isthmus-mkdir", "/isthmus-storage/ckpt/team-a/checkpoints/j"]
    assert init["volumeMounts"] == [{"name": "storage-ckpt", "mountPath": "/isthmus-storage/ckpt"}]
    assert pod["securityContext"]["runAsUser"] == 2001 and init["securityContext"] == worker["securityContext"]
    assert init["resources"] == worker["resources"]
    # Without the site's helper image, its default image; without a uid, the kubelet makes them.
    pod = render_job(request, KubernetesSettings(uid_map={"alice": 2001}))["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["image"] == KubernetesSettings().default_image
    assert "initContainers" not in render_job(request, KubernetesSettings())["spec"]["template"]["spec"]
    assert "initContainers" not in render_job(_request(data), settings)["spec"]["template"]["spec"]
