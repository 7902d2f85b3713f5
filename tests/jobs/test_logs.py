"""GET /v1/jobs/{id}/logs: refusals and the tail reader (the real pools: tests/dispatch/test_slurm_logs.py)."""

from __future__ import annotations

from types import SimpleNamespace

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


class _StreamingPool:
    """A pool that serves output itself (like Kubernetes' pod log API), from a dict."""

    def __init__(self, outputs: dict[int, bytes]):
        from adapters.base import Backend

        class Pool(Backend):
            name = "test-stream"

            def submit(self, request): raise NotImplementedError
            def status(self, backend_job_id): raise NotImplementedError
            def cancel(self, backend_job_id): raise NotImplementedError
            def capacity(self): raise NotImplementedError
            def find_by_gateway_id(self, gateway_job_id, *, request=None): raise NotImplementedError

            def stream_output(self, backend_job_id, worker, *, tail_lines=None, follow=False):
                from adapters.base import JobNotFound
                if worker not in outputs:
                    raise JobNotFound(f"no pod for worker {worker}")
                data = outputs[worker]
                return iter([data[i:i + 7] for i in range(0, len(data), 7)])

        self.backend = Pool()


def test_keep_output_keeps_the_last_bytes_per_worker_and_never_loses_a_kept_copy(tmp_path):
    from adapters.base import Feature, features_of
    from gateway.jobs.logs import keep_output, kept_path

    job_id = "0b7a52c2-7f77-4b0e-9c43-7d1c1f7b9f0e"
    pool = _StreamingPool({0: b"".join(b"line %d\n" % i for i in range(100)), 1: b"w1\n"})
    assert features_of(pool.backend).has(Feature.OUTPUT_STREAM)
    assert keep_output(pool.backend, job_id, "ns/job", 2, tmp_path, keep_bytes=16) == 2
    assert kept_path(tmp_path, job_id, 0).read_bytes() == b"\nline 98\nline 99\n"[-16:]
    assert kept_path(tmp_path, job_id, 1).read_bytes() == b"w1\n"
    # Later the pods are gone: what was kept stays.
    gone = _StreamingPool({})
    assert keep_output(gone.backend, job_id, "ns/job", 2, tmp_path, keep_bytes=16) == 0
    assert kept_path(tmp_path, job_id, 1).read_bytes() == b"w1\n"
    with pytest.raises(ValueError):
        kept_path(tmp_path, "../etc", 0)


def test_a_pool_without_output_files_or_streams_answers_501():
    from adapters.base import Backend
    from gateway.jobs.logs import open_output
    from gateway.kit.errors import GatewayError

    class Plain(Backend):
        name = "test-plain"
        def submit(self, request): raise NotImplementedError
        def status(self, backend_job_id): raise NotImplementedError
        def cancel(self, backend_job_id): raise NotImplementedError
        def capacity(self): raise NotImplementedError
        def find_by_gateway_id(self, gateway_job_id, *, request=None): raise NotImplementedError

    job = SimpleNamespace(id="0b7a52c2-7f77-4b0e-9c43-7d1c1f7b9f0e", workers=1, state="running", pool="plain",
                          backend_job_id="x")
    with pytest.raises(GatewayError) as err:
        open_output({"plain": Plain()}, job, 0, keep_dir="/nonexistent", tail=None, follow=False,
                    job_final=lambda: True)
    assert err.value.status == 501


def test_a_streaming_pool_serves_live_output_then_the_kept_copy(tmp_path):
    import anyio

    from gateway.jobs.logs import keep_output, open_output
    from gateway.kit.errors import Conflict

    job_id = "0b7a52c2-7f77-4b0e-9c43-7d1c1f7b9f0e"
    pool = _StreamingPool({0: b"hello\nworld\n"})
    job = SimpleNamespace(id=job_id, workers=2, state="running", pool="kube", backend_job_id="ns/job")

    async def read(stream) -> bytes:
        return b"".join([c async for c in stream])

    def serve(j, worker=0, tail=None):
        return anyio.run(read, open_output({"kube": pool.backend}, j, worker, keep_dir=tmp_path, tail=tail,
                                           follow=False, job_final=lambda: True))

    assert serve(job) == b"hello\nworld\n"
    with pytest.raises(Conflict, match="no output yet"):
        serve(job, worker=1)
    keep_output(pool.backend, job_id, "ns/job", 2, tmp_path, keep_bytes=1024)
    pool.backend.stream_output = lambda *a, **k: iter([b"not the kept copy\n"])
    ended = SimpleNamespace(id=job_id, workers=2, state="succeeded", pool="kube", backend_job_id="ns/job")
    assert serve(ended) == b"hello\nworld\n"
    assert serve(ended, tail=1) == b"world\n"


# ------------------------------------------- follows: counted as streams, idle without polling (#27, 4)


class _FilePool:
    """A pool whose jobs write their output to files the gateway reads (like Slurm), in a directory."""

    def __init__(self, root):
        from adapters.base import Backend

        class Pool(Backend):
            name = "test-files"

            def submit(self, request): raise NotImplementedError
            def status(self, backend_job_id): raise NotImplementedError
            def cancel(self, backend_job_id): raise NotImplementedError
            def capacity(self): raise NotImplementedError
            def find_by_gateway_id(self, gateway_job_id, *, request=None): raise NotImplementedError

            def output_file(self, gateway_job_id, worker):
                return str(root / f"{gateway_job_id}-{worker}.out")

        self.backend = Pool()


def _set_job(gw, job_id: str, **values) -> None:
    from sqlalchemy import update

    from gateway.kit.db import transaction
    from gateway.models.jobs import Job

    with transaction(gw.app.state.sessionmaker) as s:  # as the dispatcher would leave it, without its checks
        s.execute(update(Job).where(Job.id == job_id).values(**values))


def test_an_idle_follow_rarely_asks_the_database_and_counts_as_one_of_the_callers_streams(gw, tmp_path, database_url):
    if not database_url.startswith("sqlite"):
        pytest.skip("the follow's polling does not depend on the database; SQLite is enough")
    import threading
    import time

    import httpx
    from sqlalchemy import event

    from tests.jobs.live import served
    from tests.jobs.test_events_stream import OpenStream

    job = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"]
    _set_job(gw, job, state="running", pool="files", backend_job_id="files-1")
    (tmp_path / f"{job}-0.out").write_bytes(b"hello\n")
    backends = gw.app.state.backends
    gw.app.state.backends = {**backends, "files": _FilePool(tmp_path).backend}
    queries: list[float] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and job in str(parameters):
            queries.append(time.monotonic())

    event.listen(gw.app.state.engine, "before_cursor_execute", count)
    got: list[bytes] = []
    held: list = []
    try:
        with served(gw.app) as url:
            def follow():
                with httpx.stream("GET", f"{url}/v1/jobs/{job}/logs", params={"follow": "true"},
                                  headers=gw.headers(), timeout=httpx.Timeout(10, read=30)) as r:
                    assert r.status_code == 200
                    for chunk in r.iter_raw():
                        got.append(chunk)
            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            deadline = time.monotonic() + 10
            while b"".join(got) != b"hello\n":
                assert time.monotonic() < deadline, got
                time.sleep(0.05)
            # Idle for 3 s: the follow used to ask the database whether the job ended 4 times a second.
            start = time.monotonic()
            time.sleep(3)
            idle = [t for t in queries if t >= start]
            assert len(idle) <= 2, f"{len(idle)} queries of the job in 3 s of an idle follow"
            # The follow is one of alice's 10 streams: 9 event streams more, and the 11th is refused.
            held += [OpenStream(url, gw.token()) for _ in range(9)]
            assert [s.status for s in held] == [200] * 9
            r = httpx.get(f"{url}/v1/jobs/{job}/logs", params={"follow": "true"}, headers=gw.headers(), timeout=10)
            assert r.status_code == 429 and "ISTHMUS_MAX_STREAMS_PER_SUBJECT" in r.json()["detail"]
            for s in held:
                s.close()
            # New output still arrives (the wait starts short again), and the follow ends with the job.
            with open(tmp_path / f"{job}-0.out", "ab") as f:
                f.write(b"world\n")
            deadline = time.monotonic() + 10
            while b"".join(got) != b"hello\nworld\n":
                assert time.monotonic() < deadline, got
                time.sleep(0.05)
            _set_job(gw, job, state="succeeded")
            reader.join(15)
            assert not reader.is_alive(), "the follow did not end with the job"
    finally:
        event.remove(gw.app.state.engine, "before_cursor_execute", count)
        gw.app.state.backends = backends
