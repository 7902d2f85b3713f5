"""The README's first-job examples, run literally against the real Slurm 22.05 cluster.

The code blocks are read from README.md itself. What `make run-slurm` does is done here
the same way (its ISTHMUS_BACKENDS comes from stack/backends_json.py, which the Makefile
uses) on a free port instead of 8080, in a fresh home directory and a directory outside
the clone (only `.venv` is linked in), so the dev key is found the documented way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.dispatch.conftest import slurm_env
from tests.e2e.conftest import free_port, start_gateway

pytestmark = pytest.mark.slurm


def readme_blocks(section: str) -> list[str]:
    """The ```sh blocks under the README heading ``## <section>``."""
    text = (REPO / "README.md").read_text()
    m = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, flags=re.DOTALL | re.MULTILINE)
    assert m, f"README has no section {section!r}"
    return re.findall(r"^```sh\n(.*?)^```", m.group(1), flags=re.DOTALL | re.MULTILINE)


def runnable(block: str, port: int) -> str:
    # `make run-slurm &` is what the fixture below does; everything else runs as written.
    lines = [line for line in block.splitlines() if not line.startswith("make ")]
    return "set -euo pipefail\n" + "\n".join(lines).replace("127.0.0.1:8080", f"127.0.0.1:{port}") + "\n"


@contextlib.contextmanager
def newcomer_gateway(tmp_path_factory, backends_arg: str):
    """What `make run-<pool>` does (ISTHMUS_BACKENDS from stack/backends_json.py), on a free
    port, in a fresh home and a directory outside the clone (only `.venv` linked in)."""
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("newcomer")
    (work / ".venv").symlink_to(REPO / ".venv")
    backends = subprocess.run([sys.executable, str(REPO / "stack" / "backends_json.py"), backends_arg],
                              capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_") and k != "XDG_CONFIG_HOME"}
    env.update(HOME=str(home), ISTHMUS_DEV_MODE="true", ISTHMUS_BACKENDS=backends,
               ISTHMUS_DATABASE_URL=f"sqlite:///{work / 'isthmus.db'}")
    proc = start_gateway(env, port, work / "gateway.log", cwd=work)  # its ./isthmus-output lands there
    try:
        yield {"env": env, "port": port, "work": work, "home": home}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def readme_gateway(tmp_path_factory):
    env22 = slurm_env("22.05")
    with newcomer_gateway(tmp_path_factory, "slurm-22.05") as gw:
        yield {**gw, "slurm": env22}


def run_block(gw, block: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in gw["env"].items() if k != "ISTHMUS_DEV_MODE"}  # the README exports it
    return subprocess.run(["bash", "-c", runnable(block, gw["port"])], env=env, cwd=gw["work"],
                          capture_output=True, text=True, timeout=600)


def slurm_output(gw, job_id: str) -> str:
    """Every worker's output of a gateway job (one file per worker, docs/logs.md)."""
    files = sorted(Path(gw["slurm"]["SLURM_WORK_DIR"]).glob(f"isthmus-{job_id}-worker-*.out"))
    return "".join(path.read_text() for path in files)


def test_readme_curl_example_runs_a_job_to_success(readme_gateway):
    (block,) = readme_blocks("First job with curl")
    r = run_block(readme_gateway, block)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    job = next(d for d in docs if "state" in d and "id" in d)
    assert job["state"] == "succeeded" and job["exit_code"] == 0, job
    assert len(job["nodes"]) == 2
    assert "hello from" in slurm_output(readme_gateway, job["id"])
    events = next(d for d in docs if "items" in d and d["items"] and "to_state" in d["items"][0])
    assert [e["to_state"] for e in events["items"] if e["kind"] == "state"][-1] == "succeeded"
    me = next(d for d in docs if "subject" in d)
    assert me["user"] == "alice" and [a["name"] for a in me["accounts"]] == ["team-a"]
    pools = next(d for d in docs if "items" in d and d["items"] and "healthy" in d["items"][0])
    assert [(p["name"], p["healthy"]) for p in pools["items"]] == [("slurm", True)]
    # The dev key is in the documented place, not in the current directory.
    assert (readme_gateway["home"] / ".config" / "isthmus" / "dev-issuer-key.pem").exists()
    assert not (readme_gateway["work"] / ".isthmus").exists()


def test_readme_cli_example_runs_a_job_to_success(readme_gateway):
    (block,) = readme_blocks("First job with the CLI")
    r = run_block(readme_gateway, block)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^state:\s+succeeded$", r.stdout, flags=re.MULTILINE), r.stdout
    assert re.search(r"^exit_code:\s+0$", r.stdout, flags=re.MULTILINE), r.stdout
    job_id = re.search(r"^id:\s+([0-9a-f-]{36})$", r.stdout, flags=re.MULTILINE).group(1)
    assert "hello, epochs: 3" in slurm_output(readme_gateway, job_id)
    assert re.search(r"^user:\s+alice$", r.stdout, flags=re.MULTILINE)  # whoami
    assert "None" not in r.stdout
