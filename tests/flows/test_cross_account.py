"""Issue #27 finding 5: a dependency across accounts is no way into the other account.

A user of both team-a and team-b makes a team-b job wait for a team-a job. A team-a-only
user then neither sees that job's id among the team-a job's ``dependents`` nor cancels it
with ``cascade=true``: it is judged by its own dependency condition, as without cascade.
"""

from __future__ import annotations

from tests.flows.test_api import BASE, get, post

BOTH = ("team-a", "team-b")


def test_cascade_and_dependents_stay_in_the_callers_accounts(gw):
    a = post(gw, "/v1/jobs", BASE, user="carol", groups=BOTH).json()
    mine = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": a["id"], "condition": "finished"}]},
                user="carol", groups=BOTH).json()
    theirs_finished = post(gw, "/v1/jobs", {**BASE, "account": "team-b",
                                            "depends_on": [{"job": a["id"], "condition": "finished"}]},
                           user="carol", groups=BOTH).json()
    theirs_succeeded = post(gw, "/v1/jobs", {**BASE, "account": "team-b", "depends_on": [{"job": a["id"]}]},
                            user="carol", groups=BOTH).json()
    assert theirs_finished["state"] == theirs_succeeded["state"] == "blocked"

    # alice (team-a only) sees only the team-a dependent; the team-b ones are 404 to her.
    assert get(gw, f"/v1/jobs/{a['id']}")["dependents"] == [mine["id"]]
    assert gw.client.get(f"/v1/jobs/{theirs_finished['id']}", headers=gw.headers()).status_code == 404
    # carol, in both accounts, sees all three.
    assert sorted(get(gw, f"/v1/jobs/{a['id']}", user="carol", groups=BOTH)["dependents"]) == sorted(
        [mine["id"], theirs_finished["id"], theirs_succeeded["id"]])

    r = gw.client.post(f"/v1/jobs/{a['id']}/cancel?cascade=true", headers=gw.headers())
    assert r.status_code == 202, r.text
    assert get(gw, f"/v1/jobs/{mine['id']}")["state"] == "cancelled"  # cascade reaches alice's own account

    def as_carol(job):
        return get(gw, f"/v1/jobs/{job['id']}", user="carol", groups=BOTH)

    # team-b's jobs follow their own condition: "finished" is met by a cancel, "succeeded" never will be.
    assert as_carol(theirs_finished)["state"] == "pending"
    after = as_carol(theirs_succeeded)
    assert after["state"] == "cancelled"
    assert after["state_reason"] == f"cancelled: dependency job {a['id']} can no longer be succeeded"
    for job in (theirs_finished, theirs_succeeded):  # no trace of alice's cascade on them
        assert all("cascade" not in e["reason"]
                   for e in get(gw, f"/v1/jobs/{job['id']}/events", user="carol", groups=BOTH)["items"])


def test_depends_on_hides_the_state_of_another_accounts_job(gw):
    # bob (team-b only) reads a team-b job that carol made wait for a team-a job: he sees the
    # dependency (his job's own data) and whether it is met, not what the team-a job is doing.
    a = post(gw, "/v1/jobs", BASE, user="carol", groups=BOTH).json()
    theirs = post(gw, "/v1/jobs", {**BASE, "account": "team-b", "depends_on": [{"job": a["id"]}]},
                  user="carol", groups=BOTH).json()
    [dep] = get(gw, f"/v1/jobs/{theirs['id']}", user="bob", groups=("team-b",))["depends_on"]
    assert dep["job"] == a["id"] and dep["met"] is False
    assert dep["state"] == "not visible to you (another account's)", dep
    [dep] = get(gw, f"/v1/jobs/{theirs['id']}", user="carol", groups=BOTH)["depends_on"]
    assert dep["state"] == "pending", dep
