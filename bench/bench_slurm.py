"""Slurm submission throughput: raw `sbatch` in a loop vs the adapter (REST, CLI, pyslurm).

    .venv/bin/python bench/bench_slurm.py [--jobs 30] [--repeats 3] [--versions 22.05,24.11]
    .venv/bin/python bench/bench_slurm.py --versions 25.11   # adds pyslurm; own section

Needs the local clusters (bash stack/slurm/up.sh <ver>). Every submission is the same
1-node exclusive job with 1 GPU running `true` as user alice. Repeats interleave the three
modes so each sees a similar queue. The adapter's submit() includes its idempotency
look-up (every job slurmctld holds is checked for the gateway id; finished jobs stay for
MinJobAge=300 s), so the table shows how many jobs slurmctld held. Writes the "slurm" section
of docs/benchmarks.md; Slurm 25.11 (the only version pyslurm builds against) goes to its own
"slurm-25.11" section with the pyslurm transport as a fourth mode.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from adapters.base import SubmitRequest
from adapters.envfile import read_env_file
from adapters.slurm import SlurmBackend, SlurmSettings
from bench.common import machine, pct, write_section

USER = "alice"


PYSLURM_VERSION = "25.11"


def raw_submit_loop(env: dict[str, str], n: int) -> tuple[list[float], list[str]]:
    prefix = shlex.split(env.get("SLURM_CLI_PREFIX", ""))
    work = env["SLURM_WORK_DIR"]
    script = "#!/bin/sh\nexec srun --nodes=1 --ntasks=1 -- true\n"
    bin_dir = env.get("SLURM_BIN_DIR")  # a Slurm built into a prefix (25.11)
    sbatch = f"{bin_dir}/sbatch" if bin_dir else "sbatch"
    argv = [*prefix, "runuser", "-u", USER, "--", sbatch, "--parsable", "--job-name=bench-raw",
            "--partition=gpu", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1",
            "--mem=1000", "--exclusive", "--time=5", f"--chdir={work}", "--output=/dev/null",
            "--gres=gpu:1"]
    proc_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": env["SLURM_CONF"]}
    lat, ids = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        out = subprocess.run(argv, input=script, capture_output=True, text=True, env=proc_env,
                             check=True)
        lat.append(time.perf_counter() - t0)
        ids.append(out.stdout.strip().split(";")[0])
    return lat, ids


def adapter_submit_loop(backend: SlurmBackend, n: int) -> tuple[list[float], list[str]]:
    lat, ids = [], []
    for _ in range(n):
        req = SubmitRequest(gateway_job_id=f"bench-{uuid.uuid4().hex[:12]}", name="bench-adapter",
                            account="bench", user=USER, command=["true"], workers=1,
                            gpus_per_worker=1, cpus_per_worker=1, memory_mib_per_worker=1000,
                            time_limit_s=300)
        t0 = time.perf_counter()
        ids.append(backend.submit(req).backend_job_id)
        lat.append(time.perf_counter() - t0)
    return lat, ids


def run_version(version: str, jobs: int, repeats: int) -> dict:
    env_file = REPO / ".stack" / f"slurm-{version}" / "env"
    env = read_env_file(env_file)
    transports = ("rest", "cli", "pyslurm") if version == PYSLURM_VERSION else ("rest", "cli")
    backends = {t: SlurmBackend(SlurmSettings.from_env_file(env_file, transport=t))
                for t in transports}
    cleaner = backends["cli"]
    results: dict[str, list[dict]] = {m: [] for m in ("raw", *transports)}
    for r in range(repeats):
        for mode, runs in results.items():
            in_memory = len(cleaner.transport.jobs())
            t0 = time.perf_counter()
            if mode == "raw":
                lat, ids = raw_submit_loop(env, jobs)
            else:
                lat, ids = adapter_submit_loop(backends[mode], jobs)
            wall = time.perf_counter() - t0
            runs.append({"jobs_s": jobs / wall, "p50": pct(lat, 50), "p99": pct(lat, 99),
                                  "in_memory": in_memory})
            for job_id in ids:  # keep the queue short for the next round
                cleaner.cancel(job_id)
            print(f"  {version} repeat {r + 1} {mode:7}: {jobs / wall:6.1f} jobs/s  "
                  f"p50 {pct(lat, 50) * 1000:6.1f} ms  p99 {pct(lat, 99) * 1000:6.1f} ms  "
                  f"({in_memory} jobs in slurmctld)", flush=True)
    med = {m: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for m, rs in results.items()}
    for b in backends.values():
        b.close()
    return {"version": version, "package": env.get("SLURM_PACKAGE_VERSION", ""),
            "rest_api": backends["rest"].transport.negotiate(), "median": med}


def render(rows: list[dict], jobs: int, repeats: int, argv: list[str]) -> str:
    pyslurm = any("pyslurm" in row["median"] for row in rows)
    lines = [
        f"## Slurm submission{' on 25.11: REST, CLI and pyslurm' if pyslurm else ''}",
        "",
        f"`python bench/bench_slurm.py {' '.join(argv)}` ({machine()}; run {dt.date.today()}).",
        (f"{jobs} sequential submissions per round, medians of {repeats} rounds; each job is a "
        "1-node exclusive job with 1 GPU running `true` as `alice`. *raw* is `sbatch --parsable` "
        "via `runuser` in a loop. The adapter's submit() first looks for a job with the same "
        "gateway id among all jobs slurmctld holds (idempotency): REST on 23.02+ via "
        "`GET /jobs/state` plus the comments it has already seen, the CLI via plain-text "
        "`squeue --format=%i|%k`, REST on 22.05 (v0.0.38) via a full `GET /jobs`, which grows "
        "with the jobs in memory. The first submission of a fresh backend lists everything "
        "once (it shows in p99). The machine is shared with other test suites: compare ratios."
        + (" *pyslurm* calls libslurm in the transport's child process (one JSON line each way) "
           "and lists jobs with `slurm_load_jobs` for the idempotency look-up." if pyslurm else "")),
        "",
        "| Slurm | mode | jobs/s | adapter / raw | submit p50 (ms) | submit p99 (ms) | jobs in slurmctld |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        med = row["median"]
        for mode in med:
            m = med[mode]
            label = {"raw": "raw sbatch", "rest": f"adapter REST {row['rest_api']}",
                     "cli": "adapter CLI", "pyslurm": "adapter pyslurm"}[mode]
            ratio = "1.00" if mode == "raw" else f"{m['jobs_s'] / med['raw']['jobs_s']:.2f}"
            lines.append(f"| {row['package']} | {label} | {m['jobs_s']:.1f} | {ratio} | "
                         f"{m['p50'] * 1000:.1f} | {m['p99'] * 1000:.1f} | {m['in_memory']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--versions", default="22.05,24.11")
    ap.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    args = ap.parse_args()
    rows = []
    for version in [v.strip() for v in args.versions.split(",") if v.strip()]:
        if not (REPO / ".stack" / f"slurm-{version}" / "env").exists():
            print(f"Slurm {version}: not up, skipped (bash stack/slurm/up.sh {version})")
            continue
        rows.append(run_version(version, args.jobs, args.repeats))
    if not rows:
        sys.exit("no Slurm cluster is up")
    # 25.11 has its own section, so measuring it does not erase the other versions' rows.
    for section, group in (("slurm", [r for r in rows if r["version"] != PYSLURM_VERSION]),
                           (f"slurm-{PYSLURM_VERSION}",
                            [r for r in rows if r["version"] == PYSLURM_VERSION])):
        if not group:
            continue
        text = render(group, args.jobs, args.repeats, sys.argv[1:])
        print(text)
        if not args.no_write:
            write_section(section, text)


if __name__ == "__main__":
    main()
