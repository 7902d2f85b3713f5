"""Lanes: the suite runs in several pytest-xdist workers, and no two of them use one cluster at once.

Most of the suite waits on clusters, not on the CPU (docs/testing.md, "Lanes"). ``make test``
runs it in ``ISTHMUS_TEST_LANES`` workers (``--dist loadgroup``); this plugin decides which
tests go together and keeps them from stepping on each other:

- **What a test holds.** Each test names the shared systems it uses with its markers:
  ``slurm`` (with the versions as arguments; none means Slurm 22.05, the ``slurm_cluster``
  fixture's default), ``kubernetes`` (the one control plane), ``oidc`` (the one Keycloak),
  ``uses("podman", "prometheus")``. Those names are its *resources*.
- **Groups.** Tests with the same resources form one xdist group and run one after the other
  in one worker, in collection order; a test with none is grouped with its module (its
  module-scoped fixtures are set up once). Groups are queued longest first, by the
  durations in ``tests/lanes-durations.json`` (written by a full run, ISTHMUS_TEST_DURATIONS).
- **Locks.** While a module's tests of one group run, the worker holds a file lock per
  resource (``.stack/lanes/<resource>.lock``, taken in name order, so no two workers can
  wait on each other). A test that needs two clusters therefore never shares either.
  A worker that gives a lock up lets a waiting worker have it before taking it again.
- **Settled on taking.** Whoever takes a cluster finds it as an idle cluster: jobs that an
  earlier module left on a Slurm cluster are cancelled and its nodes waited for; Kueue
  reservations left on the control plane are waited for (and their Jobs deleted). No test
  may assume what another test may still hold; this makes "idle when you start" true.
- **Order.** ``ISTHMUS_TEST_ORDER=reverse`` or ``random:<seed>`` queues the groups in
  another order, to prove that no test depends on what ran before it.

Without xdist (plain ``pytest``) the same locks and settling apply, in one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LOCK_DIR = Path(os.environ.get("ISTHMUS_LANES_DIR", REPO / ".stack" / "lanes"))
DURATIONS = REPO / "tests" / "lanes-durations.json"
DEFAULT_SLURM = "22.05"
SLURM_VERSIONS = ("22.05", "24.11", "25.11", "26.05")
OTHER_RESOURCES = ("kube", "oidc", "podman", "prometheus")
LOCK_WAIT_S = 3600


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or the only process) keeps the report
        _CURRENT["report"] = Report()
    config.addinivalue_line("markers", "slurm(*versions): uses the local Slurm clusters of these versions "
                                       "(none: 22.05) (stack/slurm; tests/lanes.py)")
    config.addinivalue_line("markers", "uses(*systems): uses these shared systems of the stack: podman, "
                                       "prometheus (tests/lanes.py)")


def resources(item) -> tuple[str, ...]:
    """The shared systems ``item`` uses, from its markers (and its Slurm version parameter)."""
    found: set[str] = set()
    slurm = list(item.iter_markers("slurm"))
    if slurm:
        versions = {str(v) for m in slurm for v in m.args}
        # A test parametrized over versions (any parameter whose value is a version) holds
        # its own version, besides those its marker names.
        params = getattr(getattr(item, "callspec", None), "params", {})
        versions |= {str(v) for v in params.values() if isinstance(v, str) and v in SLURM_VERSIONS}
        found |= {f"slurm-{v}" for v in (versions or {DEFAULT_SLURM})}
    if item.get_closest_marker("kubernetes"):
        found.add("kube")
    if item.get_closest_marker("oidc"):
        found.add("oidc")
    for m in item.iter_markers("uses"):
        found |= set(m.args)
    unknown = found - {f"slurm-{v}" for v in SLURM_VERSIONS} - set(OTHER_RESOURCES)
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: unknown shared system(s) {sorted(unknown)} (tests/lanes.py)")
    return tuple(sorted(found))


def group_of(item) -> str:
    held = resources(item)
    return "+".join(held) if held else item.module.__name__ if hasattr(item, "module") else item.nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Mark each item with its xdist group; queue the groups longest first (or as ISTHMUS_TEST_ORDER says)."""
    groups: dict[str, list] = {}
    for item in items:
        item.stash[_GROUP] = g = group_of(item)
        _GROUPS[item.nodeid] = g
        item.stash[_HOLDS] = resources(item)
        item.add_marker(pytest.mark.xdist_group(g))
        groups.setdefault(g, []).append(item)
    known = _durations()
    weight = {g: sum(known.get(_base_id(it), 1.0) for it in members) for g, members in groups.items()}
    order = os.environ.get("ISTHMUS_TEST_ORDER", "longest")
    names = sorted(groups, key=lambda g: (-weight[g], g))
    if order == "reverse":
        names.reverse()
    elif order.startswith("random:"):
        random.Random(order.split(":", 1)[1]).shuffle(names)
    elif order != "longest":
        raise pytest.UsageError(f"ISTHMUS_TEST_ORDER={order!r}: use longest, reverse or random:<seed>")
    # Within a group the collection order stays (module by module, as the suites expect).
    items[:] = [it for g in names for it in groups[g]]


_GROUP = pytest.StashKey[str]()
_HOLDS = pytest.StashKey[tuple]()


def split_group(nodeid: str) -> tuple[str, str]:
    """(test id, group) of a report's node id: xdist's loadgroup appends ``@<group>``. A test
    id may hold an ``@`` of its own (a parameter such as an e-mail address), so only a last
    ``@`` followed by a group name counts."""
    base, at, group = nodeid.rpartition("@")
    if at and (group.startswith("tests.") or all(p in _KNOWN for p in group.split("+"))):
        return base, group
    return nodeid, ""


_KNOWN = {f"slurm-{v}" for v in SLURM_VERSIONS} | set(OTHER_RESOURCES)


def _base_id(item) -> str:
    return split_group(item.nodeid)[0]


def _durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------- locks


class Locks:
    """This process's held resources: one open, flock-ed file each. Re-entrant per name."""

    def __init__(self):
        self.held: dict[str, object] = {}
        self.released_at: dict[str, float] = {}

    def acquire(self, names: tuple[str, ...]) -> list[str]:
        """Take every lock in ``names`` (in name order); return those newly taken."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        taken = []
        for name in sorted(names):
            if name in self.held:
                continue
            self._let_waiters_first(name)
            fh = open(LOCK_DIR / f"{name}.lock", "a")  # noqa: SIM115 - held past this block, closed by release
            marker = LOCK_DIR / f"{name}.waiting.{os.getpid()}"
            marker.touch()
            try:
                deadline = time.monotonic() + LOCK_WAIT_S
                while True:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            fh.close()
                            raise RuntimeError(f"waited {LOCK_WAIT_S} s for {name}: held by {_holder(name)}") from None
                        time.sleep(0.05)
            finally:
                marker.unlink(missing_ok=True)
            (LOCK_DIR / f"{name}.holder").write_text(f"{os.getpid()} {os.environ.get('PYTEST_XDIST_WORKER', '-')}\n")
            self.held[name] = fh
            taken.append(name)
        return taken

    def release(self, names) -> None:
        for name in names:
            fh = self.held.pop(name, None)
            if fh is not None:
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()
                self.released_at[name] = time.monotonic()

    def _let_waiters_first(self, name: str) -> None:
        """Just gave ``name`` up and another worker waits for it: let that one have it first."""
        if time.monotonic() - self.released_at.get(name, -1e9) > 5:
            return
        mine = f"{name}.waiting.{os.getpid()}"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(p.name != mine for p in LOCK_DIR.glob(f"{name}.waiting.*")):
            time.sleep(0.05)


def _holder(name: str) -> str:
    try:
        return (LOCK_DIR / f"{name}.holder").read_text().strip()
    except OSError:
        return "?"


LOCKS = Locks()
_RUN: dict[str, object] = {"key": None}


def _run_key(item) -> tuple:
    return (getattr(item, "module", None) and item.module.__name__, item.stash.get(_HOLDS, ()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    holds = item.stash.get(_HOLDS, ())
    key = _run_key(item)
    if holds and _RUN["key"] != key:
        for name in LOCKS.acquire(holds):
            settle(name)
        _RUN["key"] = key
    try:
        yield
    finally:
        if holds and (nextitem is None or _run_key(nextitem) != key):
            LOCKS.release(holds)
            _RUN["key"] = None


@contextlib.contextmanager
def holding(*names: str):
    """Hold resources outside a marked test (a fixture of a helper that runs its own cluster job)."""
    taken = LOCKS.acquire(names)
    for name in taken:
        settle(name)
    try:
        yield
    finally:
        LOCKS.release(taken)


# ------------------------------------------------------------------------------- settling

SETTLE_WAIT_S = 120
# Kueue: how long the Jobs a module's own teardown is deleting get to go before the settle
# deletes what is left in the stack's namespaces itself.
KUBE_GRACE_S = 15


def settle(name: str) -> None:
    """Make the cluster just taken idle: nothing an earlier module left may hold it.

    ISTHMUS_LANES_SETTLE=0 turns it off (the lanes' own tests run pytest on a private lock
    directory, where settling the real clusters would cancel the jobs of the modules that
    hold them)."""
    if os.environ.get("ISTHMUS_LANES_SETTLE", "1") == "0":
        return
    if name.startswith("slurm-"):
        _settle_slurm(name.removeprefix("slurm-"))
    elif name == "kube":
        _settle_kube()


def _settle_slurm(version: str) -> None:
    from adapters.envfile import read_env_file

    path = REPO / ".stack" / f"slurm-{version}" / "env"
    if not path.exists():
        return
    from tests import slurm_cli

    env = read_env_file(path)

    def run(command: str, *args: str) -> str:
        return slurm_cli.run(env, command, *args, check=False).stdout

    # Nodes an earlier module left down or drained (a test's node failure, the gateway's own
    # drain of a suspect node: docs/recovery.md "Node health") are put back in service.
    for line in run("sinfo", "-h", "-N", "-p", env["SLURM_PARTITION"], "-o", "%N|%T|%E").splitlines():
        node, state, reason = (line.split("|") + ["", ""])[:3]
        if reason.startswith("isthmus") and any(w in state.lower() for w in ("down", "drain", "fail")):
            run("scontrol", "update", f"nodename={node}", "state=resume")
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        jobs = run("squeue", "-h", "-o", "%i").split()
        busy = [line for line in run("sinfo", "-h", "-N", "-p", env["SLURM_PARTITION"], "-o", "%N %T").splitlines()
                if line.split()[-1].rstrip("*~#!%$@^-").lower() in {"allocated", "mixed", "completing"}]
        if not jobs and not busy:
            return
        if jobs:
            run("scancel", *jobs)
        if time.monotonic() > deadline:
            print(f"[lanes] Slurm {version} still busy after {SETTLE_WAIT_S} s: jobs {jobs}, nodes {busy}")
            return
        time.sleep(0.5)


def _settle_kube() -> None:
    from adapters.envfile import read_env_file

    path = REPO / ".stack" / "kube" / "env"
    if not path.exists():
        return
    env = read_env_file(path)
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=env["KUBECONFIG"])
    try:
        custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)

        def reserved() -> list[str]:
            held = []
            for cq in custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues")["items"]:
                st = cq.get("status") or {}
                if st.get("reservingWorkloads") or st.get("admittedWorkloads"):
                    held.append(cq["metadata"]["name"])
            return held

        # Nodes an earlier module left cordoned by the gateway (docs/recovery.md, "Node health").
        core = client.CoreV1Api(api)
        for node in core.list_node().items:
            if "isthmus.io/drained" in (node.metadata.annotations or {}):
                with contextlib.suppress(client.exceptions.ApiException):
                    core.patch_node(node.metadata.name, {"metadata": {"annotations": {"isthmus.io/drained": None}},
                                                         "spec": {"unschedulable": None}})
        namespaces = [n for n in env.get("ISTHMUS_KUBE_NAMESPACES", "").split(",") if n]
        started = time.monotonic()
        deleted = False
        while reserved():
            waited = time.monotonic() - started
            if not deleted and waited > KUBE_GRACE_S:
                # Jobs an earlier module left: delete them (their pods go with them).
                for namespace in namespaces:
                    for job in batch.list_namespaced_job(namespace).items:
                        with contextlib.suppress(client.exceptions.ApiException):
                            batch.delete_namespaced_job(job.metadata.name, namespace, propagation_policy="Background")
                deleted = True
            if waited > SETTLE_WAIT_S:
                print(f"[lanes] Kueue still holds reservations after {SETTLE_WAIT_S} s: {reserved()}")
                return
            time.sleep(0.5)
    finally:
        api.close()


# --------------------------------------------------------------------------------- report

REPORT_START = "<!-- generated by tests/lanes.py: start -->"
REPORT_END = "<!-- generated by tests/lanes.py: end -->"


class Report:
    """What the run cost, per suite, from the reports the controller receives.

    A whole run (``make test`` with no arguments sets ISTHMUS_TEST_REPORT=1) writes it into
    docs/testing.md between the markers above, and each test's time into
    tests/lanes-durations.json (what orders the next run's groups)."""

    def __init__(self):
        self.started = time.time()
        self.tests: dict[str, dict] = {}  # base nodeid -> {seconds, outcome, group}

    def add(self, report) -> None:
        base, group = split_group(report.nodeid)
        group = group or _GROUPS.get(base, "")
        t = self.tests.setdefault(base, {"seconds": 0.0, "outcome": "passed", "group": group})
        t["seconds"] += report.duration
        if report.failed:
            t["outcome"] = "failed"
        elif report.skipped and t["outcome"] == "passed":
            t["outcome"] = "skipped"

    def suites(self) -> list[dict]:
        rows: dict[str, dict] = {}
        for nodeid, t in self.tests.items():
            path = nodeid.split("::")[0]
            parts = path.split("/")[:-1] or [path]  # the test's directory: tests/<suite>[/<kind>]
            suite = "/".join(parts[:3] if parts[1:2] == ["backends"] else parts[:2])
            r = rows.setdefault(suite, {"suite": suite, "tests": 0, "seconds": 0.0, "failed": 0, "skipped": 0,
                                        "holds": set()})
            r["tests"] += 1
            r["seconds"] += t["seconds"]
            r["failed"] += t["outcome"] == "failed"
            r["skipped"] += t["outcome"] == "skipped"
            if t["group"] and not t["group"].startswith("tests."):
                r["holds"] |= set(t["group"].split("+"))
        return sorted(rows.values(), key=lambda r: -r["seconds"])

    def markdown(self, lanes: int, order: str) -> str:
        wall = time.time() - self.started
        total = sum(t["seconds"] for t in self.tests.values())
        counts = {o: sum(t["outcome"] == o for t in self.tests.values()) for o in ("passed", "failed", "skipped")}
        lines = [REPORT_START,
                 (f"Last whole run: {time.strftime('%Y-%m-%d', time.gmtime(self.started))}, {lanes} lanes, "
                 f"order `{order}`: **{len(self.tests)} tests ({counts['passed']} passed, {counts['failed']} "
                 f"failed, {counts['skipped']} skipped) in {wall:,.0f} s of wall time**; the tests' own time adds "
                 f"up to {total:,.0f} s ({total / max(wall, 1):.1f} lanes busy on average)."), "",
                 "| suite | tests | test time (s) | share | failed | skipped | real systems it holds |",
                 "|---|---:|---:|---:|---:|---:|---|"]
        for r in self.suites():
            holds = ", ".join(sorted(r["holds"])) or "Postgres / SQLite only"
            lines.append(f"| `{r['suite']}` | {r['tests']} | {r['seconds']:,.0f} | {r['seconds'] / max(total, 1):.0%} "
                         f"| {r['failed']} | {r['skipped']} | {holds} |")
        lines += ["", "The 25 slowest tests (setup + call + teardown):", "",
                  "| s | test | holds |", "|---:|---|---|"]
        for nodeid, t in sorted(self.tests.items(), key=lambda kv: -kv[1]["seconds"])[:25]:
            holds = t["group"].replace("+", ", ") if t["group"] and not t["group"].startswith("tests.") else ""
            lines.append(f"| {t['seconds']:.1f} | `{nodeid}` | {holds} |")
        lines.append(REPORT_END)
        return "\n".join(lines)

    def write(self, lanes: int, order: str) -> None:
        doc = REPO / "docs" / "testing.md"
        text = doc.read_text()
        if REPORT_START in text and REPORT_END in text:
            head, rest = text.split(REPORT_START, 1)
            text = head + self.markdown(lanes, order) + rest.split(REPORT_END, 1)[1]
            doc.write_text(text)
        DURATIONS.write_text(json.dumps({k: round(v["seconds"], 2) for k, v in sorted(self.tests.items())},
                                        indent=0) + "\n")


_CURRENT: dict[str, Report] = {}
_GROUPS: dict[str, str] = {}  # nodeid -> group, in a run without xdist (its reports carry no "@group")


def pytest_runtest_logreport(report):
    r = _CURRENT.get("report")
    if r is not None:
        r.add(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = _CURRENT.pop("report", None)
    if report is None or not report.tests:
        return
    lanes = int(getattr(config.option, "numprocesses", 0) or 1)
    order = os.environ.get("ISTHMUS_TEST_ORDER", "longest")
    slowest = sorted(report.suites(), key=lambda r: -r["seconds"])[:8]
    terminalreporter.write_sep("=", "lanes: test time per suite")
    for r in slowest:
        terminalreporter.write_line(f"  {r['seconds']:8.1f} s  {r['tests']:5d} tests  {r['suite']}")
    if os.environ.get("ISTHMUS_TEST_REPORT") == "1":
        report.write(lanes, order)
        terminalreporter.write_line("lanes: report written to docs/testing.md and tests/lanes-durations.json")
