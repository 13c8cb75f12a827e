"""`celeriac rq worker` against Debian's python3-rq (RQ 1.13) as the producer and
reader: jobs enqueued by name with `Queue.enqueue("mymod.llm_inference", ...)`,
run as the built-in LLM tasks against the fake LLM, and read back with RQ's own
client (job.get_status(), job.result, the registries) and its `rq info` CLI.
Each test has a Redis database of its own, flushed before and after."""
import json
import os
import re
import signal
import subprocess
import time
import uuid

import pytest
import redis
from rq import Queue, Retry, Worker as RqPyWorker
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from conftest import BIN, Worker, next_result_db, wait_until

ALIAS = ["--task-alias", "mymod.llm_inference=llm.generate",
         "--task-alias", "mymod.chat=llm.chat", "--task-alias", "mymod.embed=llm.embed"]


class RqWorker(Worker):
    """A `celeriac rq worker` process, its log read line by line."""

    def start(self, wait_ready=True, timeout=30):
        self.read_lines(subprocess.Popen([BIN, "rq", "worker", *self.args], env=self.env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace"))
        if wait_ready:
            self.wait_for(r"rq worker ready\.$", timeout)
        return self


class RqEnv:
    def __init__(self, services, fake):
        self.services = services
        self.fake = fake
        self.db = next_result_db()
        self.url = services.redis_url(self.db)
        self.r = redis.Redis(host="127.0.0.1", port=services.redis_port, db=self.db)
        self.r.flushdb()
        self.workers = []

    def queue(self, name="default", **kw):
        return Queue(name, connection=self.r, **kw)

    def worker(self, *args, start=True, **kw):
        e = dict(os.environ)
        e["OPENAI_BASE_URL"] = self.fake.base + "/v1"
        e["OPENAI_API_KEY"] = "sk-test-secret-key"
        w = RqWorker(["--url", self.url, "-l", "info", *ALIAS, *args], e)
        self.workers.append(w)
        if start:
            w.start(**kw)
        return w

    def wait_status(self, job, status, timeout=20):
        wait_until(lambda: job.get_status() == status, timeout=timeout,
                   what="job %s %s" % (job.id, status))
        job.refresh()

    def rq_info(self):
        return subprocess.run(["rq", "info", "--url", self.url], capture_output=True,
                              text=True, timeout=30).stdout

    def close(self):
        for w in self.workers:
            w.stop()
        self.r.flushdb()
        self.r.close()


@pytest.fixture
def rqenv(request, services, fake_llm):
    e = RqEnv(services, fake_llm)
    yield e
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for i, w in enumerate(e.workers):
            print("\n----- rq worker %d log (last 60 lines) -----" % i)
            print("\n".join(w.lines[-60:]))
    e.close()


RQ2_READ = r'''
import sys
from redis import Redis
import rq
from rq.job import Job
r = Redis(port=int(sys.argv[1]), db=int(sys.argv[2]))
assert rq.__version__.startswith("2."), rq.__version__
j = Job.fetch(sys.argv[3], connection=r)
j.refresh()
assert j.is_finished, j.get_status()
assert j.return_value() == sys.argv[4] and j.result == sys.argv[4], j.return_value()
print("ok", rq.__version__)
'''


def test_enqueue_by_name_finishes(rqenv):
    q = rqenv.queue()
    job = q.enqueue("mymod.llm_inference", "Hello")
    rqenv.worker()
    rqenv.wait_status(job, "finished")
    want = rqenv.fake.expected("Hello")["text"]
    assert job.is_finished
    assert job.result == want
    assert job.return_value() == want
    assert job.latest_result().type.value == 1
    assert job.started_at and job.ended_at and job.ended_at >= job.started_at
    assert job.worker_name.startswith("celeriac-")
    assert job.id in FinishedJobRegistry(queue=q).get_job_ids()
    assert job.id not in StartedJobRegistry(queue=q).get_job_ids()
    rq2 = os.environ.get("CELERIAC_RQ2_PATH")
    if rq2:  # RQ 2.x's client reads the default (1.13) layout too
        out = subprocess.run(["/usr/bin/python3", "-c", RQ2_READ,
                              str(rqenv.services.redis_port), str(rqenv.db), job.id, want],
                             env=dict(os.environ, PYTHONPATH=rq2),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("ok 2."), out.stderr
    # result_ttl 500 (RQ's default) on the job, its stream, and the registry score
    assert 490 < rqenv.r.ttl("rq:job:" + job.id) <= 500
    assert 490 < rqenv.r.ttl("rq:results:" + job.id) <= 500
    score = rqenv.r.zscore("rq:finished:default", job.id)
    assert abs(score - (time.time() + 500)) < 10


def test_kwargs_chat_and_memo(rqenv):
    """llm.chat with a payload whose keys the pickler shares (BINGET), and
    llm.generate with keyword arguments only."""
    q = rqenv.queue()
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Grüß dich ✓"}]
    chat = q.enqueue("mymod.chat", msgs, model="m", temperature=0.5)
    gen = q.enqueue("mymod.llm_inference", prompt="Hi", max_tokens=64)
    rqenv.worker()
    rqenv.wait_status(chat, "finished")
    rqenv.wait_status(gen, "finished")
    assert chat.result["content"] == rqenv.fake.expected("Grüß dich ✓")["text"]
    # the stream's return_value is base64 of a pickle any Python reads
    import base64
    import pickle
    entry = rqenv.r.xrevrange("rq:results:" + chat.id, count=1)[0][1]
    raw = pickle.loads(base64.b64decode(entry[b"return_value"]))
    assert isinstance(raw, dict) and raw == chat.result
    assert gen.result == rqenv.fake.expected("Hi")["text"]


def test_priority_high_before_low(rqenv):
    high, low = rqenv.queue("high"), rqenv.queue("low")
    lows = [low.enqueue("mymod.llm_inference", "low %d" % i) for i in range(10)]
    hi = high.enqueue("mymod.llm_inference", "high")
    rqenv.worker("high", "low", "-c", "1")
    for j in lows + [hi]:
        rqenv.wait_status(j, "finished")
    assert all(hi.started_at <= j.started_at for j in lows)
    order = sorted(lows, key=lambda j: j.started_at)
    assert [j.id for j in order] == [j.id for j in lows]  # FIFO within a queue


class Evil:
    def __reduce__(self):
        return (os.system, ("touch %s" % Evil.path,))


def test_refused_jobs_fail_at_once(rqenv, tmp_path):
    import datetime
    q = rqenv.queue()
    Evil.path = str(tmp_path / "pwned")
    unmapped = q.enqueue("nomod.fn", "x", retry=Retry(max=3))
    hostile = q.enqueue("mymod.llm_inference", Evil())
    dated = q.enqueue("mymod.llm_inference", datetime.datetime(2026, 1, 1))
    callback = q.enqueue("mymod.llm_inference", "x", on_success=os.path.join)
    rqenv.worker()
    for j in (unmapped, hostile, dated, callback):
        rqenv.wait_status(j, "failed")
    def last_line(j):
        return j.latest_result().exc_string.rstrip("\n").splitlines()[-1]
    assert last_line(unmapped) == \
        "celeriac.UnsupportedJob: no task mapped for 'nomod.fn' (see --task-alias)"
    assert "STACK_GLOBAL" in last_line(hostile)
    assert "datetime.datetime" in last_line(dated)
    assert "on_success callback 'posixpath.join'" in last_line(callback)
    assert not os.path.exists(Evil.path)
    # never retried: the refusal would be the same
    unmapped.refresh()
    assert unmapped.retries_left == 3
    failed = FailedJobRegistry(queue=q).get_job_ids()
    assert {unmapped.id, hostile.id, dated.id, callback.id} <= set(failed)
    assert rqenv.fake.stats() == []


def test_llm_failure_into_failed_registry_then_requeue(rqenv):
    q = rqenv.queue()
    rqenv.fake.script(["status=400;err_msg=bad prompt"])
    job = q.enqueue("mymod.llm_inference", "Hello", retry=Retry(max=2))
    w = rqenv.worker()
    rqenv.wait_status(job, "failed")
    exc = job.latest_result().exc_string
    assert job.latest_result().type.value == 2  # Result.Type.FAILED
    assert exc.endswith("\n") and "bad prompt" in exc.splitlines()[-1]
    assert re.match(r"^[\w.]*BadRequestError: .*bad prompt", exc.splitlines()[-1])
    assert len(rqenv.fake.stats()) == 1  # permanent: not retried, retries left or not
    reg = FailedJobRegistry(queue=q)
    assert job.id in reg.get_job_ids()
    score = rqenv.r.zscore("rq:failed:default", job.id)
    assert abs(score - (time.time() + 31536000)) < 10
    reg.requeue(job.id)
    rqenv.wait_status(job, "finished")
    assert job.result == rqenv.fake.expected("Hello")["text"]
    assert job.id not in reg.get_job_ids()
    w.stop()


def test_retry_without_interval(rqenv):
    q = rqenv.queue()
    rqenv.fake.script(["status=500", "status=500"])
    job = q.enqueue("mymod.llm_inference", "Hello", retry=Retry(max=2))
    rqenv.worker()
    rqenv.wait_status(job, "finished")
    assert job.retries_left == 0
    assert len(rqenv.fake.stats()) == 3
    assert job.result == rqenv.fake.expected("Hello")["text"]


def test_retry_without_interval_requeues_at_the_tail(rqenv):
    """Retry(max=1) without an interval: back to its queue's tail, status
    queued with a new enqueued_at, behind the job queued after it."""
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    rqenv.fake.script(["status=500"])
    job = q.enqueue("mymod.llm_inference", "Hello", retry=Retry(max=1))
    behind = q.enqueue("mymod.llm_inference", "behind", model="fake/hold=" + hold)
    first_enqueued = job.enqueued_at
    rqenv.worker("-c", "1")
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="the job behind it runs")
    job.refresh()
    assert job.get_status() == "queued" and job.retries_left == 0
    assert job.enqueued_at > first_enqueued
    assert q.job_ids == [job.id]
    rqenv.fake.release(hold)
    rqenv.wait_status(job, "finished")
    assert job.result == rqenv.fake.expected("Hello")["text"]


def test_exhausted_retries_fail_once(rqenv):
    q = rqenv.queue()
    rqenv.fake.script(["status=500"] * 3)
    job = q.enqueue("mymod.llm_inference", "Hello", retry=Retry(max=1))
    rqenv.worker()
    rqenv.wait_status(job, "failed")
    assert len(rqenv.fake.stats()) == 2
    assert job.retries_left == 0
    assert rqenv.r.xlen("rq:results:" + job.id) == 1


def test_result_ttls(rqenv):
    q = rqenv.queue()
    gone = q.enqueue("mymod.llm_inference", "a", result_ttl=0)
    kept = q.enqueue("mymod.llm_inference", "b", result_ttl=-1)
    rqenv.worker("-c", "1")
    rqenv.wait_status(kept, "finished")
    wait_until(lambda: not rqenv.r.exists("rq:job:" + gone.id), what="job deleted")
    assert rqenv.r.ttl("rq:job:" + kept.id) == -1
    assert rqenv.r.ttl("rq:results:" + kept.id) == -1
    assert rqenv.r.zscore("rq:finished:default", kept.id) == float("inf")
    assert rqenv.r.zscore("rq:finished:default", gone.id) is None


def test_running_job_is_started_and_claimed(rqenv):
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/hold=" + hold)
    rqenv.worker("--name", "rqw", "-c", "2")
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
    job.refresh()
    assert job.get_status() == "started"
    assert job.worker_name in ("rqw-1", "rqw-2")
    score = rqenv.r.zscore("rq:wip:default", job.id)
    assert score > time.time() + 30
    # `rq info` runs the started registry's cleanup: the job must survive it
    out = rqenv.rq_info()
    assert "rqw-1" in out and "rqw-2" in out and "busy" in out and "idle" in out
    assert job.id in StartedJobRegistry(queue=q).get_job_ids()
    workers = {w.name: w for w in RqPyWorker.all(connection=rqenv.r)}
    assert set(workers) == {"rqw-1", "rqw-2"}
    busy = workers[job.worker_name]
    assert busy.get_state() == "busy" and busy.get_current_job_id() == job.id
    idle = ({"rqw-1", "rqw-2"} - {job.worker_name}).pop()
    assert rqenv.r.ttl("rq:worker:" + job.worker_name) > 0
    assert rqenv.r.ttl("rq:worker:" + idle) > 0
    assert workers[idle].get_state() == "idle"
    assert "%s (" % job.worker_name in out and "busy default" in out
    rqenv.fake.release(hold)
    rqenv.wait_status(job, "finished")
    wait_until(lambda: RqPyWorker.find_by_key("rq:worker:" + job.worker_name,
                                              connection=rqenv.r).get_state() == "idle",
               what="worker idle")


def test_started_score_kept_ahead_while_running(rqenv):
    """The started registry's score of a running job is always ahead of now
    and moves on at each heartbeat (half the monitoring interval), so RQ's
    cleanups (`rq info`) never fail it."""
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/hold=" + hold)
    rqenv.worker("--name", "beat", "-c", "1", "--job-monitoring-interval", "2")
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
    scores = []
    t_end = time.time() + 4
    while time.time() < t_end:
        sc = rqenv.r.zscore("rq:wip:default", job.id)
        assert sc is not None and sc > time.time() + 55
        if not scores or sc != scores[-1]:
            scores.append(sc)
        time.sleep(0.1)
    assert len(scores) >= 3 and scores == sorted(scores)  # refreshed about every second
    assert rqenv.r.ttl("rq:worker:beat") > 0
    rqenv.rq_info()
    assert job.get_status() == "started"
    rqenv.fake.release(hold)
    rqenv.wait_status(job, "finished")


def test_sigterm_is_warm(rqenv):
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/hold=" + hold)
    w = rqenv.worker("--name", "warm", "-c", "1")
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
    w.signal(signal.SIGTERM)
    w.wait_for(r"warm shutdown")
    time.sleep(0.5)
    assert w.proc.poll() is None  # waits for the running job
    rqenv.fake.release(hold)
    assert w.wait(timeout=20) == 0
    job.refresh()
    assert job.get_status() == "finished"
    assert not rqenv.r.sismember("rq:workers", "rq:worker:warm")
    assert not rqenv.r.sismember("rq:workers:default", "rq:worker:warm")
    assert rqenv.r.hget("rq:worker:warm", "death")
    assert 0 < rqenv.r.ttl("rq:worker:warm") <= 60


def test_job_timeout_aborts(rqenv):
    q = rqenv.queue()
    # streamed slowly: the fake sees the abort at its next write
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/tps=2,tokens=40",
                    job_timeout=1)
    rqenv.worker()
    t0 = time.time()
    rqenv.wait_status(job, "failed")
    assert time.time() - t0 < 5
    assert job.latest_result().exc_string.rstrip("\n").splitlines()[-1] == \
        "rq.timeouts.JobTimeoutException: Task exceeded maximum timeout value (1 seconds)"
    wait_until(lambda: [e["ended"] for e in rqenv.fake.stats()] == ["client_closed"],
               timeout=5, what="the call aborted")


def test_suspend_and_resume(rqenv):
    """No job starts once `rq suspend` holds, not even one pushed while a
    blocking pop was already waiting: it goes back to the head of its queue,
    in its place. The worker says it is suspended within a second or so, and
    `rq resume` lets the jobs run."""
    q = rqenv.queue()
    rqenv.worker("--name", "susp", "-c", "1")
    time.sleep(0.3)  # idle: a BLPOP is out
    subprocess.run(["rq", "suspend", "--url", rqenv.url], check=True, capture_output=True)
    first = q.enqueue("mymod.llm_inference", "Hello")
    second = q.enqueue("mymod.llm_inference", "Hello again")
    t0 = time.time()
    wait_until(lambda: rqenv.r.hget("rq:worker:susp", "state") == b"suspended",
               timeout=5, what="suspended state")
    assert time.time() - t0 < 1.5
    time.sleep(2)
    for j in (first, second):
        j.refresh()
        assert j.get_status() == "queued"
    assert q.job_ids == [first.id, second.id]
    assert rqenv.fake.stats() == []
    subprocess.run(["rq", "resume", "--url", rqenv.url], check=True, capture_output=True)
    rqenv.wait_status(first, "finished")
    rqenv.wait_status(second, "finished")
    assert first.started_at <= second.started_at


def test_suspend_seen_by_the_batch_pop(rqenv):
    """Slots freed right after `rq suspend` (before any check of it) take
    nothing: the batch pop finds the suspension in the same script."""
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    running = [q.enqueue("mymod.llm_inference", "run %d" % i, model="fake/hold=" + hold)
               for i in range(2)]
    waiting = [q.enqueue("mymod.llm_inference", "wait %d" % i) for i in range(3)]
    rqenv.worker("--name", "busy", "-c", "2")
    wait_until(lambda: rqenv.fake.held(hold) == 2, what="calls held")
    rqenv.r.set("rq:suspended", 1)
    rqenv.fake.release(hold)
    for j in running:
        rqenv.wait_status(j, "finished")
    time.sleep(1.5)
    assert q.job_ids == [j.id for j in waiting]
    rqenv.r.delete("rq:suspended")
    for j in waiting:
        rqenv.wait_status(j, "finished")


def test_retry_with_intervals_through_scheduled_registry(rqenv):
    q = rqenv.queue()
    rqenv.fake.script(["status=500"] * 3)
    job = q.enqueue("mymod.llm_inference", "Hello", retry=Retry(max=2, interval=[1, 2]))
    rqenv.worker()
    wait_until(lambda: rqenv.r.zscore("rq:scheduled:default", job.id) is not None,
               what="first retry scheduled")
    job.refresh()
    assert job.get_status() == "scheduled" and job.retries_left == 1
    rqenv.wait_status(job, "failed", timeout=20)
    times = [e["t"] for e in rqenv.fake.stats()]
    assert len(times) == 3
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert 0.9 <= gaps[0] < 3 and 1.9 <= gaps[1] < 4, gaps
    assert job.retries_left == 0
    assert rqenv.r.xlen("rq:results:" + job.id) == 1  # one FAILED entry in all
    assert rqenv.r.get("rq:scheduler-lock:default") == str(rqenv.workers[0].proc.pid).encode()


def test_enqueue_in_runs_later(rqenv):
    from datetime import timedelta
    q = rqenv.queue()
    rqenv.worker()
    t0 = time.time()
    job = q.enqueue_in(timedelta(seconds=2), "mymod.llm_inference", "later")
    rqenv.wait_status(job, "finished")
    # RQ scores in whole seconds (the time cut down), and its schedulers compare
    # whole seconds: a 2 s delay runs between 1 and 2 s later, with Python's too
    assert time.time() - t0 >= 0.95
    assert job.result == rqenv.fake.expected("later")["text"]


def test_dependents_released(rqenv):
    from rq.job import Dependency
    q = rqenv.queue()
    ok = q.enqueue("mymod.llm_inference", "parent ok")
    bad = q.enqueue("mymod.llm_inference", "parent bad", model="fake/status=400")
    child = q.enqueue("mymod.llm_inference", "child", depends_on=ok)
    stuck = q.enqueue("mymod.llm_inference", "stuck", depends_on=bad)
    allowed = q.enqueue("mymod.llm_inference", "allowed",
                        depends_on=Dependency(jobs=[bad], allow_failure=True))
    assert child.get_status() == "deferred"
    rqenv.worker("-c", "1")
    rqenv.wait_status(child, "finished")
    rqenv.wait_status(allowed, "finished")
    rqenv.wait_status(bad, "failed")
    time.sleep(1)
    deferred = {m.decode() for m in rqenv.r.zrange("rq:deferred:default", 0, -1)}
    assert child.id not in deferred and allowed.id not in deferred
    assert stuck.get_status() == "deferred"
    assert stuck.id in rqenv.r.zrange("rq:deferred:default", 0, -1) or \
        stuck.id.encode() in rqenv.r.zrange("rq:deferred:default", 0, -1)


def test_json_serializer_and_at_front(rqenv):
    from rq.serializers import JSONSerializer
    q = rqenv.queue("jq", serializer=JSONSerializer)
    first = q.enqueue("mymod.chat", [{"role": "user", "content": "json hi"}])
    front = q.enqueue("mymod.llm_inference", "front", at_front=True)
    rqenv.worker("jq", "-c", "1")
    rqenv.wait_status(first, "finished")
    rqenv.wait_status(front, "finished")
    assert front.started_at <= first.started_at
    j = Job.fetch(first.id, connection=rqenv.r, serializer=JSONSerializer)
    assert j.return_value()["content"] == rqenv.fake.expected("json hi")["text"]


def test_stop_job_command(rqenv):
    from rq.command import send_stop_job_command
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/hold=" + hold,
                    retry=Retry(max=3))
    rqenv.worker("--name", "stopper", "-c", "2")
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
    time.sleep(0.3)  # the subscription is made once the connection is up
    send_stop_job_command(rqenv.r, job.id)
    rqenv.wait_status(job, "stopped")
    assert job.latest_result().type.value == 2
    assert "Job stopped by user" in job.latest_result().exc_string
    assert job.id in FailedJobRegistry(queue=q).get_job_ids()
    assert job.retries_left == 3  # never retried
    rqenv.fake.release(hold)


def test_shutdown_command(rqenv):
    from rq.command import send_shutdown_command
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/hold=" + hold)
    w = rqenv.worker("--name", "shut", "-c", "1")
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
    time.sleep(0.3)
    send_shutdown_command(rqenv.r, "shut")
    w.wait_for(r"warm shutdown \(shutdown command\)")
    rqenv.fake.release(hold)
    assert w.wait(timeout=20) == 0
    job.refresh()
    assert job.get_status() == "finished"
    assert not rqenv.r.sismember("rq:workers", "rq:worker:shut")
    assert not rqenv.r.sismember("rq:workers:default", "rq:worker:shut")
    assert rqenv.r.hget("rq:worker:shut", "death")
    assert 0 < rqenv.r.ttl("rq:worker:shut") <= 60


def test_concurrency_and_two_processes_in_rq_info(rqenv):
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    jobs = [q.enqueue("mymod.llm_inference", "p%d" % i, model="fake/hold=" + hold)
            for i in range(6)]
    rqenv.worker("-c", "3")
    rqenv.worker("-c", "3")
    wait_until(lambda: rqenv.fake.held(hold) == 6, what="six calls at once")
    workers = RqPyWorker.all(connection=rqenv.r)
    assert len(workers) == 6 and len({w.name for w in workers}) == 6
    assert sorted(w.get_state() for w in workers) == ["busy"] * 6
    assert {w.get_current_job_id() for w in workers} == {j.id for j in jobs}
    assert "6 workers" in rqenv.rq_info()
    rqenv.fake.release(hold)
    for j in jobs:
        rqenv.wait_status(j, "finished")


def test_embed_result_is_a_pickled_list(rqenv):
    q = rqenv.queue()
    job = q.enqueue("mymod.embed", ["one", "two"])
    rqenv.worker()
    rqenv.wait_status(job, "finished")
    v = job.result
    assert isinstance(v, list) and len(v) == 2
    assert all(isinstance(x, float) for x in v[0])


def test_kill_9_mid_job_is_failed_by_rq_cleanup(rqenv):
    """A killed celeriac leaves its job started; once the started registry's
    score passes (60 s + the monitoring interval), RQ's own cleanup in `rq
    info` fails it, or requeues it while retries are left: nothing is lost
    or left started for ever."""
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    once = q.enqueue("mymod.llm_inference", "a", model="fake/hold=" + hold)
    again = q.enqueue("mymod.llm_inference", "b", model="fake/hold=" + hold,
                      retry=Retry(max=1))
    w = rqenv.worker("-c", "2", "--job-monitoring-interval", "1")
    wait_until(lambda: rqenv.fake.held(hold) == 2, what="both held")
    w.proc.kill()
    w.proc.wait()
    score = max(rqenv.r.zscore("rq:wip:default", j.id) for j in (once, again))
    assert score <= time.time() + 62
    # Nothing refreshes the scores any more (the worker is dead): a minute
    # passing is the scores passing now, which the test writes rather than
    # sleeps for; then RQ's own cleanup (in `rq info`) does the rest.
    time.sleep(1.5)
    assert max(rqenv.r.zscore("rq:wip:default", j.id) for j in (once, again)) == score
    for j in (once, again):
        rqenv.r.zadd("rq:wip:default", {j.id: time.time() - 1})
    rqenv.rq_info()
    assert once.get_status() == "failed"
    assert again.get_status() == "queued"
    rqenv.fake.release(hold)
    rqenv.worker()
    rqenv.wait_status(again, "finished")


class Greeter:
    def hello(self, prompt):
        return prompt


def test_enqueue_by_function_and_the_seed_example(rqenv, tmp_path, monkeypatch):
    """The seed's example: enqueue by function (its module importable on the
    producer's side only) and by name, job.refresh(), job.is_finished, job.result."""
    import importlib
    import sys
    (tmp_path / "mymod.py").write_text("def llm_inference(prompt):\n    raise SystemExit\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mymod", None)
    mymod = importlib.import_module("mymod")
    q = rqenv.queue()
    by_func = q.enqueue(mymod.llm_inference, "Hello")
    by_name = q.enqueue("mymod.llm_inference", "Hello")
    assert rqenv.r.hget("rq:job:" + by_func.id, "data") == \
        rqenv.r.hget("rq:job:" + by_name.id, "data")
    rqenv.worker()
    for job in (by_func, by_name):
        for _ in range(200):
            job.refresh()
            if job.is_finished:
                break
            time.sleep(0.05)
        assert job.is_finished
        assert job.result == rqenv.fake.expected("Hello")["text"]


def test_bound_method_bombs_and_expired_jobs(rqenv):
    import pickle
    import zlib
    q = rqenv.queue()
    bound = q.enqueue(Greeter().hello, "x")
    bomb = q.enqueue("mymod.llm_inference", "x")
    rqenv.r.hset("rq:job:" + bomb.id, "data",
                 zlib.compress(b"\x80\x05" + b"\x00" * (80 << 20), 9))
    frame = q.enqueue("mymod.llm_inference", "x")
    rqenv.r.hset("rq:job:" + frame.id, "data", b"\x80\x05\x95\xff\xff\x00\x00\x00\x00\x00\x00")
    expired = q.enqueue("mymod.llm_inference", "x", ttl=1)
    time.sleep(1.5)  # its hash expires before a worker starts it
    after = q.enqueue("mymod.llm_inference", "after")
    w = rqenv.worker("-c", "1")
    rqenv.wait_status(after, "finished")
    for j in (bound, bomb, frame):
        assert j.get_status() == "failed", j.id
    assert "STACK_GLOBAL (0x93) 'test_rq_worker.Greeter'" in \
        bound.latest_result().exc_string
    assert "inflates past" in bomb.latest_result().exc_string
    assert "exceeds the 0 bytes left" in frame.latest_result().exc_string  # truncated FRAME
    assert not rqenv.r.exists("rq:job:" + expired.id)
    assert w.count(expired.id) == 0 or "skipped" in w.log()
    assert len(rqenv.fake.stats()) == 1


def test_memo_dag_and_cycle_fail_without_running(rqenv):
    """A 2**30-node DAG of memo references and a list that holds itself fail
    the job (within the limits, no call); the worker goes on."""
    import pickle
    import zlib
    q = rqenv.queue()
    x = []
    for _ in range(30):
        x = [x, x]
    cyc = []
    cyc.append(cyc)
    jobs = []
    for args in ((x,), (cyc,)):
        j = q.enqueue("mymod.llm_inference", "x")
        rqenv.r.hset("rq:job:" + j.id, "data", zlib.compress(pickle.dumps(
            ("mymod.llm_inference", None, args, {}), protocol=5)))
        jobs.append(j)
    after = q.enqueue("mymod.llm_inference", "after")
    rqenv.worker("-c", "1")
    rqenv.wait_status(after, "finished")
    for j, why in zip(jobs, ("pickle expands past", "(a cycle)")):
        assert j.get_status() == "failed"
        last = j.latest_result().exc_string.rstrip("\n").splitlines()[-1]
        assert last.startswith("celeriac.UnsupportedJob: job data refused: "), last
        assert why in last, last
    assert len(rqenv.fake.stats()) == 1


def test_progress_in_job_meta(rqenv):
    """The text streamed so far shows in job.meta["progress"] while the job
    runs, growing at the interval, next to the producer's own meta."""
    q = rqenv.queue()
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/tps=10,tokens=30",
                    meta={"user": "u1"})
    rqenv.worker("--progress-interval", "200")
    texts = []

    def grown():
        p = job.get_meta().get("progress")
        if p and p["text"] and (not texts or p["text"] != texts[-1]):
            texts.append(p["text"])
            assert job.meta["user"] == "u1"
            assert p["tokens"] >= 1
        return len(texts) >= 3
    wait_until(grown, timeout=10, what="job.meta growing")
    # each read holds the one before it and more
    assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(texts, texts[1:]))
    rqenv.wait_status(job, "finished")
    assert job.result.startswith(texts[-1]) and len(texts[-1]) < len(job.result)
    assert job.meta["user"] == "u1"


PROGRESS_KEY = "celeriac:progress:"


def stream_entries(rqenv, job_id):
    return [{k.decode(): v.decode() for k, v in f.items()}
            for _, f in rqenv.r.xrange(PROGRESS_KEY + job_id)]


def test_progress_stream_follows_an_rq_job(rqenv):
    """The Celery worker's progress stream, for an RQ job by its id: a reader
    subscribed to its channel sees entries come while the job streams, then
    its end with the result; a retried job's next run is a new attempt."""
    import json
    q = rqenv.queue()
    ps = rqenv.r.pubsub()
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/tps=10,tokens=30")
    ps.subscribe(PROGRESS_KEY + job.id)
    rqenv.worker("--progress-interval", "200")
    notes, live = [], []
    t_end = time.time() + 20
    while time.time() < t_end:
        m = ps.get_message(timeout=0.5)
        if m and m["type"] == "message":
            notes.append(int(m["data"]))
            es = stream_entries(rqenv, job.id)
            if job.get_status() == "started":
                live.append(len(es))
            if es and es[-1]["state"] == "SUCCESS":
                break
    ps.close()
    es = stream_entries(rqenv, job.id)
    assert [int(e["seq"]) for e in es] == list(range(1, len(es) + 1))
    assert es[0]["state"] == "STARTED" and es[-1]["state"] == "SUCCESS"
    assert all(e["state"] == "PROGRESS" for e in es[1:-1]) and len(es) >= 4
    assert all(e["attempt"] == "1" for e in es)
    assert notes == sorted(notes) and notes[-1] == len(es)
    assert live and min(live) < len(es)  # read while the job ran
    rqenv.wait_status(job, "finished")
    assert "".join(e["text"] for e in es) == job.result
    assert json.loads(es[-1]["result"]) == job.result
    assert int(es[-1]["tokens"]) == 30
    assert 490 < rqenv.r.ttl(PROGRESS_KEY + job.id) <= 500  # as long as the result

    # a failed run closes its attempt with RETRY; the retry is attempt 2
    rqenv.fake.script(["tps=100;tokens=20;cut_after_tokens=5", "tps=100;tokens=20"])
    again = q.enqueue("mymod.llm_inference", "Again", retry=Retry(max=1))
    rqenv.wait_status(again, "finished")
    es = wait_until(lambda: (lambda es: es if es and es[-1]["state"] == "SUCCESS"
                             else None)(stream_entries(rqenv, again.id)),
                    timeout=10, what="the stream's end")
    states = [(e["attempt"], e["state"]) for e in es]
    assert states[0] == ("1", "STARTED") and ("1", "RETRY") in states
    assert states.index(("1", "RETRY")) < states.index(("2", "STARTED"))
    assert states[-1] == ("2", "SUCCESS")
    assert [e for e in es if e["state"] == "RETRY"][0]["error"]
    assert "".join(e["text"] for e in es if e["attempt"] == "2") == again.result

    # a failure ends the stream with its error and Celery's failure result
    rqenv.fake.script(["status=400;err_msg=bad prompt"])
    bad = q.enqueue("mymod.llm_inference", "Bad")
    rqenv.wait_status(bad, "failed")
    es = wait_until(lambda: (lambda es: es if es and es[-1]["state"] == "FAILURE"
                             else None)(stream_entries(rqenv, bad.id)),
                    timeout=10, what="the stream's failure")
    assert es[0]["state"] == "STARTED" and "bad prompt" in es[-1]["error"]
    assert json.loads(es[-1]["result"])["exc_type"] == es[-1]["error"].split(":")[0]


def test_gateway_follows_an_rq_job(rqenv, services):
    """celeriac gateway, pointed at RQ's database as its result backend,
    streams an RQ job over its WebSocket by the job's id, to its end."""
    import types
    from test_gateway import Gateway, read_all, text_of
    q = rqenv.queue()
    job = q.enqueue("mymod.llm_inference", "Hello", model="fake/tps=10,tokens=30")
    bad = q.enqueue("mymod.llm_inference", "Bad", model="fake/tps=10,tokens=30,status=400")
    env = types.SimpleNamespace(broker=services.redis_url(next_result_db()),
                                backend=rqenv.url)
    gw = Gateway(env)
    try:
        ws = gw.stream(job.id)
        rqenv.worker("--progress-interval", "200", "-c", "1")
        msgs = read_all(ws)
        final = msgs[-1]
        rqenv.wait_status(job, "finished")
        assert final["type"] == "result" and final["state"] == "SUCCESS", msgs
        assert final["result"] == job.result
        assert text_of(msgs) == job.result
        deltas = [m for m in msgs if m["type"] == "progress" and m["text"]]
        assert len(deltas) >= 3 and deltas[0]["tokens"] < 30  # live, not replayed
        # the next job, joined after its end: replayed from the stream
        rqenv.wait_status(bad, "failed")
        msgs = read_all(gw.stream(bad.id))
        assert msgs[-1]["type"] == "result" and msgs[-1]["state"] == "FAILURE", msgs
        assert msgs[-1]["error"]
        assert [m["state"] for m in msgs if m["type"] == "progress"] == ["STARTED", "FAILURE"]
        # GET tells the same ends, read from RQ's job hash and result stream
        st, out = gw.json("GET", "/v1/tasks/" + job.id)
        assert st == 200 and out["state"] == "SUCCESS" and out["ready"], out
        assert out["result"] == job.result == final["result"]
        st, out = gw.json("GET", "/v1/tasks/" + bad.id)
        assert st == 200 and out["state"] == "FAILURE" and out["ready"], out
        assert out["error"] == msgs[-1]["error"]
    finally:
        assert gw.stop() == 0, "\n".join(gw.lines[-30:])


def gw_get(gw, job_id):
    st, out = gw.json("GET", "/v1/tasks/" + job_id)
    assert st == 200 and out["task_id"] == job_id, (st, out)
    return out


@pytest.mark.parametrize("layout", ["1", "2"])
def test_gateway_tells_an_rq_jobs_state(rqenv, services, layout):
    """GET /v1/tasks/<id> and the WebSocket's "state" messages tell an RQ
    job's status in Celery's words, in either layout: PENDING while queued,
    STARTED while it runs, SUCCESS with its result once finished, FAILURE
    with its error and traceback once failed; so do jobs run by RQ's own
    worker."""
    import json
    import types
    from test_gateway import Gateway, read_all
    q = rqenv.queue()
    job = q.enqueue("mymod.llm_inference", "Hello",
                    model="fake/latency_ms=1500,tps=10,tokens=20")
    env = types.SimpleNamespace(broker=services.redis_url(next_result_db()),
                                backend=rqenv.url)
    gw = Gateway(env)
    try:
        out = gw_get(gw, job.id)
        assert out["state"] == "PENDING" and not out["ready"] and out["result"] is None
        ws = gw.stream(job.id)
        assert json.loads(ws.recv()) == {"type": "state", "state": "PENDING"}
        rqenv.worker("--rq-protocol", layout, "--progress-interval", "200", "-c", "1")
        # the LLM's latency keeps it started, with no text yet
        out = wait_until(lambda: (lambda o: o if o["state"] != "PENDING" else None)(
            gw_get(gw, job.id)), timeout=20, what="the job out of PENDING")
        assert out["state"] == "STARTED" and not out["ready"], out
        assert out["result"] is None and out["date_done"] is None
        assert job.get_status() == "started"
        msgs = read_all(ws)
        kinds = [m["type"] for m in msgs]
        assert [m["state"] for m in msgs if m["type"] == "state"] == ["STARTED"], msgs
        # told while the text still came, not with the result
        assert kinds.index("state") < len(kinds) - 1 - kinds[::-1].index("progress")
        final = msgs[-1]
        assert final["type"] == "result" and final["state"] == "SUCCESS", msgs
        rqenv.wait_status(job, "finished")
        out = gw_get(gw, job.id)
        assert out["state"] == "SUCCESS" and out["ready"], out
        assert out["result"] == job.result == final["result"]
        assert out["date_done"].startswith(job.ended_at.strftime("%Y-%m-%dT%H:%M:%S"))
        assert out["traceback"] is None and "error" not in out

        bad = q.enqueue("mymod.llm_inference", "Bad", model="fake/status=400")
        rqenv.wait_status(bad, "failed")
        out = gw_get(gw, bad.id)
        assert out["state"] == "FAILURE" and out["ready"], out
        exc = bad.latest_result().exc_string
        typ, _, msg = exc.rstrip("\n").splitlines()[-1].partition(": ")
        assert out["traceback"] == exc
        assert out["error"] == "%s: %s" % (typ.rsplit(".", 1)[-1], msg), out
        assert out["result"]["exc_message"] == [msg]

        if layout == "1":
            # RQ's own worker, its own functions: the same words
            pq = rqenv.queue("py")
            ok = pq.enqueue("builtins.len", "four")
            err = pq.enqueue("builtins.int", "x")
            run = subprocess.run(["rq", "worker", "--burst", "--url", rqenv.url, "py"],
                                 capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stderr
            out = gw_get(gw, ok.id)
            assert out["state"] == "SUCCESS" and out["result"] == 4, out
            out = gw_get(gw, err.id)
            assert out["state"] == "FAILURE", out
            assert out["error"].startswith("ValueError: invalid literal for int()"), out
        assert gw_get(gw, "no-such-job")["state"] == "PENDING"
    finally:
        assert gw.stop() == 0, "\n".join(gw.lines[-30:])


def test_redis_connection_reset_mid_job(rqenv):
    """Redis goes away while a job runs: its end waits for the connection and
    is stored once it is back; the worker pops again after it."""
    from tcpproxy import TcpProxy
    proxy = TcpProxy(rqenv.services.redis_port).start()
    try:
        q = rqenv.queue()
        hold = "h" + uuid.uuid4().hex[:8]
        job = q.enqueue("mymod.llm_inference", "Hello", model="fake/hold=" + hold)
        w = RqWorker(["--url", "redis://127.0.0.1:%d/%d" % (proxy.port, rqenv.db),
                      "-l", "info", *ALIAS], dict(os.environ,
                                                  OPENAI_BASE_URL=rqenv.fake.base + "/v1",
                                                  OPENAI_API_KEY="sk-test"))
        rqenv.workers.append(w)
        w.start()
        wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
        proxy.blackhole(True)
        proxy.reset_all()
        rqenv.fake.release(hold)
        time.sleep(1)
        job.refresh()
        assert job.get_status() == "started"  # its end waits for Redis
        proxy.blackhole(False)
        rqenv.wait_status(job, "finished", timeout=30)
        assert job.result == rqenv.fake.expected("Hello")["text"]
        after = q.enqueue("mymod.llm_inference", "after")
        rqenv.wait_status(after, "finished", timeout=30)
    finally:
        proxy.close()


def test_name_of_a_live_worker_is_refused(rqenv):
    rqenv.worker("--name", "taken", "-c", "1")
    second = rqenv.worker("--name", "taken", "-c", "1", start=False)
    second.start(wait_ready=False)
    assert second.wait(timeout=20) == 1
    assert "there exists an active worker with that name already" in second.log()
    # the first is untouched
    assert rqenv.r.sismember("rq:workers", "rq:worker:taken")
    assert not rqenv.r.hget("rq:worker:taken", "death")


def test_scheduled_jobs_run_once_beside_a_python_scheduler(rqenv, tmp_path):
    """A Python `rq worker --with-scheduler` on the same queue: the
    scheduler-lock lets one scheduler move each due job, and each job runs
    once, on whichever worker pops it."""
    from datetime import timedelta
    marks = tmp_path / "ran"
    marks.mkdir()
    (tmp_path / "mymod.py").write_text(
        "import os, uuid\n"
        "def llm_inference(prompt, **kw):\n"
        "    open(os.path.join(%r, uuid.uuid4().hex), 'w').write(prompt)\n"
        "    return 'python: ' + prompt\n" % str(marks))
    rqenv.worker("-c", "2")
    py = subprocess.Popen(["rq", "worker", "--with-scheduler", "--url", rqenv.url,
                           "default"], cwd=str(tmp_path),
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        q = rqenv.queue()
        jobs = [q.enqueue_in(timedelta(seconds=2), "mymod.llm_inference", "s%d" % i)
                for i in range(6)]
        for j in jobs:
            rqenv.wait_status(j, "finished", timeout=30)
        time.sleep(2)
        ran = len(os.listdir(str(marks))) + len(rqenv.fake.stats())
        assert ran == 6
        lock = rqenv.r.get("rq:scheduler-lock:default")
        assert lock in (str(py.pid).encode(), str(rqenv.workers[0].proc.pid).encode())
    finally:
        py.terminate()
        py.wait(timeout=30)


RQ2_CHECK = r'''
import sys, time
from redis import Redis
import rq
from rq import Queue
from rq.job import Job
from rq.registry import StartedJobRegistry
r = Redis(port=int(sys.argv[1]), db=int(sys.argv[2]))
assert rq.__version__.startswith("2."), rq.__version__
held, done = Job.fetch(sys.argv[3], connection=r), Job.fetch(sys.argv[4], connection=r)
ex = held.get_executions()
assert len(ex) == 1 and ex[0].job_id == held.id, ex
assert StartedJobRegistry(queue=Queue(connection=r)).get_job_ids() == [held.id]
res = done.latest_result()
assert res.type == res.Type.SUCCESSFUL and res.worker_name and res.execution_id
print("ok", rq.__version__)
'''


def test_rq_protocol_2_layout(rqenv):
    """--rq-protocol 2: RQ 2.x's execution records and composite started
    members; RQ 1.13's client still reads the results. With CELERIAC_RQ2_PATH
    naming an RQ 2.x source tree, its client checks the executions too."""
    q = rqenv.queue()
    hold = "h" + uuid.uuid4().hex[:8]
    done = q.enqueue("mymod.llm_inference", "Hello")
    held = q.enqueue("mymod.llm_inference", "Hi", model="fake/hold=" + hold)
    rqenv.worker("--rq-protocol", "2", "-c", "2")
    rqenv.wait_status(done, "finished")
    assert done.result == rqenv.fake.expected("Hello")["text"]
    wait_until(lambda: rqenv.fake.held(hold) == 1, what="call held")
    members = [m.decode() for m in rqenv.r.zrange("rq:wip:default", 0, -1)]
    assert len(members) == 1 and members[0].startswith(held.id + ":")
    eid = members[0].split(":")[1]
    assert len(eid) == 32
    assert rqenv.r.hget("rq:execution:%s:%s" % (held.id, eid), "id") == eid.encode()
    assert rqenv.r.zscore("rq:executions:" + held.id, eid) > time.time() + 60
    entry = rqenv.r.xrevrange("rq:results:" + done.id, count=1)[0][1]
    assert entry[b"worker_name"] and len(entry[b"execution_id"]) == 32
    rq2 = os.environ.get("CELERIAC_RQ2_PATH")
    if rq2:
        out = subprocess.run(["/usr/bin/python3", "-c", RQ2_CHECK,
                              str(rqenv.services.redis_port), str(rqenv.db), held.id,
                              done.id], env=dict(os.environ, PYTHONPATH=rq2),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("ok 2."), out.stderr
    rqenv.fake.release(hold)
    rqenv.wait_status(held, "finished")
    assert not rqenv.r.exists("rq:execution:%s:%s" % (held.id, eid))
    assert rqenv.r.zcard("rq:wip:default") == 0


def test_limits_and_budgets_are_said_not_to_bind_rq_jobs(rqenv):
    """The providers document's limits and budget are the Celery worker's: an
    RQ worker given them says once, at start, that its jobs' calls are
    neither paced nor counted, and runs them."""
    d = json.dumps({"providers": {"default": {"limits": {"*": {"rpm": 6000}},
                                              "budget": {"usd_per_day": 5}}}})
    q = rqenv.queue()
    job = q.enqueue("mymod.llm_inference", "Hello")
    w = rqenv.worker("--llm-providers", d)
    rqenv.wait_status(job, "finished")
    w.wait_for(r"limits and budgets are not applied to RQ jobs yet", 5)
    assert w.count(r"not applied to RQ jobs") == 1
    # a document without them says nothing
    job2 = q.enqueue("mymod.llm_inference", "Hello again")
    w2 = rqenv.worker("--llm-providers", json.dumps({"providers": {}}))
    rqenv.wait_status(job2, "finished")
    assert w2.count(r"not applied to RQ jobs") == 0
