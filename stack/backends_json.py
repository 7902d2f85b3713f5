"""Print ISTHMUS_BACKENDS for the local test systems that are up (.stack/*/env)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from adapters.envfile import read_env_file as read_env

ROOT = Path(__file__).resolve().parent.parent


def main(parts: list[str]) -> None:
    backends: dict[str, dict] = {}
    for part in parts:
        if part.startswith("slurm"):
            env = read_env(ROOT / ".stack" / part / "env")
            backends["slurm"] = {"transport": "rest", "rest_url": env["SLURMRESTD_URL"],
                                 "jwt_key_path": env["SLURM_JWT_KEY"], "partition": env["SLURM_PARTITION"],
                                 "work_dir": env["SLURM_WORK_DIR"], "slurm_conf": env["SLURM_CONF"]}
        elif part == "kube":
            env = read_env(ROOT / ".stack" / "kube" / "env")
            backends["kubernetes"] = {"kubeconfig": env["KUBECONFIG"],
                                      "cluster_queue": env["ISTHMUS_KUBE_CLUSTER_QUEUE"],
                                      "local_queue": env["ISTHMUS_KUBE_LOCAL_QUEUE"]}
    print(json.dumps(backends))


if __name__ == "__main__":
    main(sys.argv[1:] or ["slurm-22.05"])
