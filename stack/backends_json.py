"""Print ISTHMUS_BACKENDS for the local test systems that are up (.stack/*/env)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adapters.envfile import read_env_file as read_env


def slurm_settings(env: dict[str, str]) -> dict:
    """The Slurm adapter settings of one stack cluster (its .stack/slurm-*/env)."""
    return {"transport": "rest", "rest_url": env["SLURMRESTD_URL"],
            "jwt_key_path": env["SLURM_JWT_KEY"], "partition": env["SLURM_PARTITION"],
            "work_dir": env["SLURM_WORK_DIR"], "slurm_conf": env["SLURM_CONF"]}


def kube_settings(env: dict[str, str], queue: str = "") -> dict:
    """The Kubernetes adapter settings of one stack ClusterQueue (``queue``: "" or "H100_")."""
    return {"kubeconfig": env["KUBECONFIG"],
            "cluster_queue": env[f"ISTHMUS_KUBE_{queue}CLUSTER_QUEUE"],
            "local_queue": env[f"ISTHMUS_KUBE_{queue}LOCAL_QUEUE"]}


def kube_node_settings(env: dict[str, str], node: dict[str, str]) -> dict:
    """The Kubernetes adapter settings of the stack's real node (stack/kube/node.sh): its
    ClusterQueue, the local Debian image, and the stack's users at their Slurm uids."""
    uids = dict(pair.split("=", 1) for pair in node["ISTHMUS_KUBE_NODE_UID_MAP"].split(","))
    return {"kubeconfig": env["KUBECONFIG"],
            "cluster_queue": node["ISTHMUS_KUBE_NODE_CLUSTER_QUEUE"],
            "local_queue": node["ISTHMUS_KUBE_NODE_LOCAL_QUEUE"],
            "default_image": node["ISTHMUS_KUBE_NODE_IMAGE"],
            "uid_map": {user: int(uid) for user, uid in uids.items()}}


def main(parts: list[str]) -> None:
    backends: dict[str, dict] = {}
    for part in parts:
        if part.startswith("slurm"):
            backends["slurm"] = slurm_settings(read_env(ROOT / ".stack" / part / "env"))
        elif part == "kube":
            backends["kubernetes"] = kube_settings(read_env(ROOT / ".stack" / "kube" / "env"))
        elif part == "kube-node":  # the one real node: real containers
            backends["kubernetes"] = kube_node_settings(read_env(ROOT / ".stack" / "kube" / "env"),
                                                        read_env(ROOT / ".stack" / "kube" / "node.env"))
    print(json.dumps(backends))


if __name__ == "__main__":
    main(sys.argv[1:] or ["slurm-22.05"])
