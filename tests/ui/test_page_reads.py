"""The dashboard's job page and jobs table read through statements built once (gateway/jobs/reads.py,
issue #46), on SQLite and Postgres: what a user sees is what the models' reads showed."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest

from gateway.kit.timeutil import utcnow
from gateway.models.jobs import Job
from gateway.ui.session import COOKIE
from tests.conftest import postgres_database
from tests.dispatch.conftest import wired_gateway
from tests.jobs.test_api import SPEC, submit
from tests.ui.test_pages import SECRET, page_as, session_cookie


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def gw(request, dev_key_path, tmp_path_factory):
    """A gateway whose /ui session cookies tests/ui/test_pages.py signs, on each database."""
    from gateway.cli import run_migrations

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('page-reads')}/gw.db"
        run_migrations(url)
        database = contextlib.nullcontext(url)
    else:
        database = postgres_database(migrated=True)
    with database as url, wired_gateway(url, dev_key_path, {}, ui_session_secret=SECRET) as gateway:
        yield gateway


def test_the_job_page_shows_the_job_its_history_and_nothing_of_another_account(gw):
    mine = submit(gw, {**SPEC, "name": "mine", "env": {"NOTE": "<b>x</b>"}}).json()
    page = page_as(gw, gw.headers(), f"/ui/jobs/{mine['id']}")
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert mine["id"] in page and "pending" in page and "mine" in page
    theirs = submit(gw, {**SPEC, "account": "team-b"}, user="bob", groups=("team-b",)).json()["id"]
    gw.client.cookies.set(COOKIE, session_cookie(gw.app, gw.headers()["Authorization"].split()[1]))
    try:
        r = gw.client.get(f"/ui/jobs/{theirs}")
    finally:
        gw.client.cookies.clear()
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert f"no job {theirs!r} visible to you".replace("'", "&#39;") in r.text


def test_the_jobs_table_lists_newest_first_with_each_pending_jobs_estimate(gw):
    old, planned, unseen = (submit(gw, {**SPEC, "name": n}).json()["id"] for n in ("old", "planned", "unseen"))
    with gw.session() as s:
        s.query(Job).filter(Job.id == old).update({"state": "succeeded"}, synchronize_session=False)
        s.query(Job).filter(Job.id == planned).update(
            {"estimated_start": utcnow() + timedelta(hours=3), "estimated_pool": "slurm",
             "estimate_reason": "behind 2 jobs"}, synchronize_session=False)
        s.commit()
    page = page_as(gw, gw.headers(), "/ui/")
    rows = {i: page[page.index(f'data-job-id="{i}"'):].split("</tr>")[0] for i in (old, planned, unseen)}
    assert page.index(f'data-job-id="{unseen}"') < page.index(f'data-job-id="{planned}"') \
        < page.index(f'data-job-id="{old}"')
    assert "in 3.0 h" in rows[planned] and "on slurm" in rows[planned] and 'title="behind 2 jobs"' in rows[planned]
    assert "not estimated yet" in rows[unseen]
    assert 'class="estimate"></td>' in rows[old] and "succeeded" in rows[old]
    assert page_as(gw, gw.headers(), "/ui/") == page  # a row kept is the row made
