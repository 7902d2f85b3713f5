"""The dashboard on real pools: a real Chromium, the real Keycloak login, real Slurm and Kueue (#18, 2).

The gateway the browser talks to dispatches for real: its dispatcher thread (the one
``isthmus serve`` runs) submits to the Slurm 22.05 cluster and to the Kueue pool of the test
stack, and reconciles their states. It is started only once the browser has shown the
jobs as pending, so the page is seen to move through every state, without being reloaded.
On Slurm the job's command really runs and writes one output file per worker; on
Kubernetes kwok fakes the pods and serves their logs from files the test writes
(tests/dispatch/conftest.py, ``fake_container_output``). ISTHMUS_UI_SCREENSHOTS=docs/ui
refreshes the screenshots of My jobs, a job, Accounts and Pools from this test.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from gateway.cli import run_migrations
from tests.browser import new_browser, off_loopback, requested_urls
from tests.dispatch.conftest import (  # noqa: F401  (k8s, kube, slurm_cluster: fixtures)
    KWOK_RUN_FOR,
    fake_container_output,
    k8s,
    kube,
    kube_backend_options,
    slurm_backend_options,
    slurm_cluster,
    wired_gateway,
    worker_pods,
)
from tests.identity.conftest import issuer_configs, oidc_env, provider  # noqa: F401
from tests.jobs.live import served
from tests.ui.conftest import api, live_click, live_text, log_in, shot, submit

pytestmark = [
    pytest.mark.oidc, pytest.mark.slurm, pytest.mark.kubernetes,
]

HOSTILE = "<script>window.__pwned=3</script>"
# Each Slurm worker (srun task) prints its rank, a hostile line, and steps for ~10 s.
SLURM_SCRIPT = (f"echo \"w$SLURM_PROCID start\"; echo 'w'$SLURM_PROCID' says {HOSTILE}'; "
                "for i in 1 2 3 4 5; do echo \"w$SLURM_PROCID step $i\"; sleep 2; done")
KUBE = {"backend": "kubernetes", "image": "registry.example/trainer:1", "command": ["python", "train.py"]}
BASE = {"gpus_per_worker": 1, "cpus_per_worker": 1, "memory_per_worker": "1Gi", "time_limit": "10m"}
FINAL = ("succeeded", "failed", "cancelled")

# Records every state the page's #state shows, from the moment it is installed.
RECORD_STATES = """
window.__states = [document.getElementById('state').textContent];
new MutationObserver(function () {
  var s = document.getElementById('state');
  if (s && window.__states[window.__states.length - 1] !== s.textContent) window.__states.push(s.textContent);
}).observe(document.getElementById('live'), {childList: true, subtree: true});
document.body.setAttribute('data-not-reloaded', '1');
"""


def kube_lines(worker: int) -> list[str]:
    return [f"k{worker} start", f"k{worker} says {HOSTILE}", f"k{worker} done"]


@pytest.fixture
def pooled(oidc_env, slurm_cluster, kube, dev_key_path, tmp_path):
    """A gateway on the real Slurm and Kueue pools, trusting the real Keycloak, served over HTTP."""
    url = f"sqlite:///{tmp_path}/gw.db"
    run_migrations(url)
    backends = {"slurm": slurm_backend_options(slurm_cluster), "kubernetes": kube_backend_options(kube)}
    with wired_gateway(url, dev_key_path, backends, oidc_issuers=json.dumps(issuer_configs(oidc_env)),
                       ui_oidc_issuer=oidc_env["OIDC_ISSUER"], ui_client_id=oidc_env["OIDC_CLIENT_ID"],
                       ui_session_secret="test-only-" + "p" * 32, output_keep_dir=str(tmp_path / "kept")) as gw:
        try:
            with served(gw.app) as base:
                yield gw, base
        finally:
            gw.app.state.dispatcher.stop()  # before wired_gateway cleans the tables under it


def api_state(base: str, token: str, job_id: str) -> dict:
    return api(base, token).get(f"/v1/jobs/{job_id}").json()


def wait_api(base: str, token: str, job_id: str, *states: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = api_state(base, token, job_id)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} is {job['state']}, not {states}: {job['state_reason']}"
        time.sleep(0.5)


def page_state(driver) -> str:
    return live_text(driver, "state")


def output_text(driver) -> str:
    return live_text(driver, "output-text")


def test_jobs_on_real_slurm_and_kueue_move_on_the_page_show_their_output_and_cancel(pooled, provider, oidc_env,
                                                                                      kube, k8s):
    gw, base = pooled
    alice, bob = provider.password("alice"), provider.password("bob")
    on_slurm = submit(base, alice, name="on-slurm", backend="slurm", workers=2,
                      command=["/bin/sh", "-c", SLURM_SCRIPT], **BASE)
    on_kueue = submit(base, alice, name="on-kueue", workers=2, labels={KWOK_RUN_FOR: "25s"}, **KUBE, **BASE)
    to_cancel = submit(base, alice, name="to-cancel", workers=1, **KUBE, **BASE)  # runs until cancelled
    bobs = submit(base, bob, name="bobs-job", account="team-b", workers=1, labels={KWOK_RUN_FOR: "1s"},
                  **KUBE, **BASE)
    mine = (on_slurm, on_kueue, to_cancel)

    driver = new_browser()
    try:
        log_in(driver, base, "alice", oidc_env)
        # My jobs: alice's three, pending (nothing dispatches yet), and not bob's.
        rows = {r.get_attribute("data-job-id"): r for r in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")}
        assert set(rows) == {j["id"] for j in mine}
        assert bobs["id"] not in driver.page_source and "bobs-job" not in driver.page_source
        for j in mine:
            assert rows[j["id"]].find_element(By.CSS_SELECTOR, ".state").text == "pending"
        # Another account's job is a 404 page in the dashboard's style, naming nothing of it.
        driver.get(f"{base}/ui/jobs/{bobs['id']}")
        assert driver.find_element(By.ID, "problem").get_attribute("data-status") == "404"
        assert "bobs-job" not in driver.page_source and "team-b" not in driver.page_source

        # One tab per job, each recording the states its page shows, before any dispatch.
        tabs = {}
        for j in mine:
            driver.switch_to.new_window("tab")
            driver.get(f"{base}/ui/jobs/{j['id']}")
            assert page_state(driver) == "pending"
            driver.execute_script(RECORD_STATES)
            tabs[j["id"]] = driver.current_window_handle

        gw.app.state.dispatcher.start()  # the gateway now really dispatches, as `isthmus serve` does

        # Kueue: once the pods exist, kwok serves their (stand-in) container output.
        running = wait_api(base, alice, on_kueue["id"], "running", *FINAL, timeout_s=90)
        assert running["state"] == "running", running
        fake_container_output(kube, k8s, running["backend_job_id"], 2, kube_lines)

        # Slurm: the page moves from pending through running to succeeded, without a reload.
        driver.switch_to.window(tabs[on_slurm["id"]])
        WebDriverWait(driver, 150, 0.5).until(lambda d: page_state(d) in FINAL)
        assert page_state(driver) == "succeeded", live_text(driver, "live")
        seen = driver.execute_script("return window.__states")
        assert seen[0] == "pending" and "running" in seen and seen[-1] == "succeeded", seen
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-not-reloaded") == "1"
        events = live_text(driver, "events")
        for state in ("dispatching", "queued", "running", "succeeded"):
            assert f"→ {state}" in events, events
        assert live_text(driver, "pool") == "slurm"
        # Its output, per worker: what the job's command printed on the cluster's nodes.
        WebDriverWait(driver, 20).until(lambda d: "w0 step 5" in output_text(d))
        out0 = output_text(driver).splitlines()
        assert out0 == ["w0 start", f"w0 says {HOSTILE}"] + [f"w0 step {i}" for i in range(1, 6)], out0
        Select(driver.find_element(By.ID, "worker")).select_by_value("1")
        WebDriverWait(driver, 20).until(lambda d: output_text(d).startswith("w1 start"))
        assert "w0" not in output_text(driver)
        # Hostile output is text: no element of its own, no script of its ran.
        assert not driver.find_elements(By.CSS_SELECTOR, "#output-text *")
        assert driver.execute_script("return window.__pwned") is None
        raw = driver.find_element(By.ID, "output-raw").get_attribute("href")
        assert raw.endswith(f"/ui/jobs/{on_slurm['id']}/output?worker=1")
        shot(driver, "job")

        # Kueue: the same, on the real control plane (kwok's pods).
        driver.switch_to.window(tabs[on_kueue["id"]])
        WebDriverWait(driver, 120, 0.5).until(lambda d: page_state(d) in FINAL)
        assert page_state(driver) == "succeeded", live_text(driver, "live")
        seen = driver.execute_script("return window.__states")
        assert seen[0] == "pending" and "running" in seen and seen[-1] == "succeeded", seen
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-not-reloaded") == "1"
        assert live_text(driver, "pool") == "kubernetes"
        WebDriverWait(driver, 30).until(lambda d: output_text(d).splitlines() == kube_lines(0))
        Select(driver.find_element(By.ID, "worker")).select_by_value("1")
        WebDriverWait(driver, 20).until(lambda d: output_text(d).splitlines() == kube_lines(1))
        assert not driver.find_elements(By.CSS_SELECTOR, "#output-text *")
        assert driver.execute_script("return window.__pwned") is None

        # Cancel a running job with the page's button; the pool's pods go with it.
        driver.switch_to.window(tabs[to_cancel["id"]])
        WebDriverWait(driver, 90, 0.5).until(lambda d: page_state(d) in ("running", *FINAL))
        assert page_state(driver) == "running"
        backend_job_id = api_state(base, alice, to_cancel["id"])["backend_job_id"]
        live_click(driver, "cancel")  # a CSRF-protected form post, then back to the page
        WebDriverWait(driver, 90, 0.5).until(lambda d: page_state(d) in FINAL)
        assert page_state(driver) == "cancelled"
        assert api_state(base, alice, to_cancel["id"])["state"] == "cancelled"
        ns, name = backend_job_id.split("/")
        deadline = time.monotonic() + 60
        while worker_pods(k8s[0], ns, name):
            assert time.monotonic() < deadline, "the cancelled job's pods are still there"
            time.sleep(0.5)

        # My jobs after the runs; the pools page shows both real pools up.
        wait_api(base, bob, bobs["id"], *FINAL, timeout_s=60)
        driver.get(f"{base}/ui/")
        states = {r.get_attribute("data-job-id"): r.find_element(By.CSS_SELECTOR, ".state").text
                  for r in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")}
        assert states == {on_slurm["id"]: "succeeded", on_kueue["id"]: "succeeded", to_cancel["id"]: "cancelled"}
        shot(driver, "jobs")
        driver.get(f"{base}/ui/pools")
        pool_rows = {r.find_element(By.TAG_NAME, "td").text: r.find_element(By.CSS_SELECTOR, ".state").text
                     for r in driver.find_elements(By.CSS_SELECTOR, "#pools tbody tr")}
        assert pool_rows == {"slurm": "up", "kubernetes": "up"}, pool_rows
        # The Slurm 22.05 cluster's leaf switches (topology/tree, stack/slurm/up.sh), in the words
        # the CLI uses too; the a100 Kueue pool names no Topology.
        domains = {r.find_element(By.TAG_NAME, "td").text: r.find_element(By.CSS_SELECTOR, ".domains").text
                   for r in driver.find_elements(By.CSS_SELECTOR, "#pools tbody tr")}
        assert domains["slurm"].startswith("switch: s1 ") and " s2 " in domains["slurm"], domains
        assert domains["kubernetes"] == "–", domains
        shot(driver, "pools")
        driver.get(f"{base}/ui/accounts")
        assert driver.find_elements(By.ID, "account-team-a") and not driver.find_elements(By.ID, "account-team-b")
        shot(driver, "accounts")
        assert off_loopback(requested_urls(driver)) == []
        # The job the API says is bob's stayed his: alice's session cannot read its output either.
        cookie = driver.get_cookie("isthmus_ui")["value"]
        r = httpx.get(f"{base}/ui/jobs/{bobs['id']}/output", cookies={"isthmus_ui": cookie})
        assert r.status_code == 404
    finally:
        driver.quit()
