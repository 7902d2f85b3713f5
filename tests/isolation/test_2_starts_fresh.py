"""A later module starts on a database of its own, as the gateway's start-up left it: no
job, set, webhook or account that tests/isolation/test_1_leaves_rows.py (or any other
module) wrote, and the dev accounts team-a and team-b as seeded, with their default shares."""

from __future__ import annotations

from sqlalchemy import text

from tests.isolation.leftovers import LEFT


def test_a_module_sees_none_of_the_rows_an_earlier_module_left(gw, database_url):
    admin = gw.headers("root", (), admin=True)
    accounts = gw.client.get("/v1/admin/accounts", headers=admin).json()
    assert {a["account"]: (a["parent"], a["shares"]) for a in accounts} == {"team-a": (None, 1), "team-b": (None, 1)}
    assert gw.client.get("/v1/jobs", headers=admin).json()["items"] == []
    assert gw.client.get("/v1/accounts/team-a/webhooks", headers=gw.headers()).json()["items"] == []
    with gw.session() as s:
        assert [s.scalar(text(f"SELECT count(*) FROM {t}")) for t in ("job", "job_set", "webhook_endpoint")] == [0, 0, 0]

    left = LEFT.get(database_url.split(":")[0].split("+")[0])
    if left:  # the earlier module ran in this session: its database is not this one, and its rows are not here
        assert left["database_url"] != database_url
        assert gw.client.get(f"/v1/jobs/{left['job']}", headers=admin).status_code == 404
        assert gw.client.get(f"/v1/job-sets/{left['set']}", headers=gw.headers()).status_code == 404
