"""GET /v1/jobs/{id}/logs: refusals and the tail reader (the real pools: tests/dispatch/test_slurm_logs.py)."""

from __future__ import annotations

import pytest

from gateway.jobs.logs import tail_offset

BODY = {"name": "logs", "account": "team-a", "command": ["true"], "workers": 2, "gpus_per_worker": 1}


@pytest.mark.parametrize("text, lines, expected", [
    (b"a\nb\nc\n", 1, b"c\n"),
    (b"a\nb\nc\n", 2, b"b\nc\n"),
    (b"a\nb\nc", 1, b"c"),
    (b"a\nb\nc", 2, b"b\nc"),
    (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
    (b"", 3, b""),
    (b"\n\n\n", 2, b"\n\n"),
])
def test_tail_starts_at_the_last_n_lines(tmp_path, text, lines, expected):
    path = tmp_path / "out"
    path.write_bytes(text)
    assert text[tail_offset(str(path), lines):] == expected


def test_tail_of_a_big_file_reads_across_chunks(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(b"".join(b"line %06d %s\n" % (i, b"x" * 100) for i in range(5000)))
    tail = path.read_bytes()[tail_offset(str(path), 3000):]
    assert tail.count(b"\n") == 3000 and tail.startswith(b"line 002000 ")


def test_pending_job_has_no_output_yet_and_other_accounts_get_404(gw):
    job = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"]
    r = gw.client.get(f"/v1/jobs/{job}/logs", headers=gw.headers())
    assert r.status_code == 409 and "no output yet" in r.json()["detail"], r.text
    other = gw.client.get(f"/v1/jobs/{job}/logs", headers=gw.headers("mallory", ("team-b",)))
    assert other.status_code == 404
    bad = gw.client.get(f"/v1/jobs/{job}/logs", params={"worker": 2}, headers=gw.headers())
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.worker"
    assert gw.client.get(f"/v1/jobs/{job}/logs").status_code == 401
