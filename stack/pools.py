"""Print a pools YAML file (ISTHMUS_POOLS_FILE) for the local test systems that are up.

Five pools when the whole stack is up: ``slurm-22``, ``slurm-24``, ``slurm-26`` (kind slurm:
Slurm 22.05, 24.11, 26.05) and ``kube-a100``, ``kube-h100`` (kind kubernetes: the two
ClusterQueues of the one Kueue control plane, see stack/kube/up.sh). A pool's ``settings``
are exactly its ISTHMUS_BACKENDS entry (stack/backends_json.py). Systems whose
``.stack/*/env`` is missing are left out. ``stack/up.sh`` writes the output to
``.stack/pools.yaml``.

Usage: python stack/pools.py [STACK_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.envfile import read_env_file as read_env
from stack.backends_json import kube_settings, slurm_settings

SLURM_POOLS = {"slurm-22": "22.05", "slurm-24": "24.11", "slurm-26": "26.05"}


def pools(stack_dir: Path) -> list[dict]:
    out: list[dict] = []
    for name, version in SLURM_POOLS.items():
        env_file = stack_dir / f"slurm-{version}" / "env"
        if env_file.is_file():
            out.append({"name": name, "kind": "slurm", "weight": 1.0, "cost": 1.0,
                        "settings": slurm_settings(read_env(env_file))})
    env_file = stack_dir / "kube" / "env"
    if env_file.is_file():
        env = read_env(env_file)
        out.append({"name": "kube-a100", "kind": "kubernetes", "gpu_types": [env.get("ISTHMUS_KUBE_GPU_TYPE", "a100")],
                    "weight": 1.0, "cost": 1.0, "settings": kube_settings(env)})
        if "ISTHMUS_KUBE_H100_CLUSTER_QUEUE" in env:
            out.append({"name": "kube-h100", "kind": "kubernetes", "gpu_types": [env["ISTHMUS_KUBE_H100_GPU_TYPE"]],
                        "weight": 1.0, "cost": 2.0, "settings": kube_settings(env, "H100_")})
    return out


def render(items: list[dict]) -> str:
    doc = {"pools": items}
    try:
        import yaml
    except ImportError:  # JSON is YAML too; up.sh may run before the virtualenv exists
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump(doc, sort_keys=False)


def main(argv: list[str]) -> None:
    stack_dir = Path(argv[0]) if argv else ROOT / ".stack"
    sys.stdout.write(render(pools(stack_dir)))


if __name__ == "__main__":
    main(sys.argv[1:])
