"""Issue 16: chords on the Redis backend, joined by celeriac exactly as a Python
worker joins them (same keys, member format and scores), with a real Python
Celery 5.2.6 client, a real Python worker sharing a chord, and a crash between a
header task's store and its ack."""
import os
import subprocess
import textwrap
import time
import urllib.parse
import uuid

import pytest
from celery import chord
from celery.exceptions import ChordError

from conftest import PY, wait_until
from tcpproxy import TcpProxy


@pytest.fixture(autouse=True)
def sanitizers_quiet(env):
    """Under an ASan build (CELERIAC_BIN=build-asan/celeriac), each worker's
    exit report (leaks included) must be empty."""
    yield
    for w in env.workers:
        w.stop()
    time.sleep(0.3)  # the log pump reads to EOF
    for w in env.workers:
        assert "Sanitizer" not in w.log() and "runtime error" not in w.log(), w.log()[-3000:]


def acc(env, *args, **kw):
    """celery.accumulate(*args, index=...) runs on celeriac."""
    return env.app.signature("celery.accumulate", args=args, kwargs=kw)


def chord_keys(env, gid):
    return [k for k in (".j", ".t", ".s") if env.redis.exists("celery-taskset-meta-" + gid + k)]


def test_chord_of_100_headers(env):
    env.worker("-c", "20")
    header = [acc(env, i, index=0) for i in range(100)]
    res = chord(header, app=env.app)(acc(env, index=0))
    # the body gets the header's results in group_index order
    assert res.get(timeout=60) == list(range(100))
    gid = res.parent.id
    # the joined chord's keys are gone, as after Celery's join
    assert wait_until(lambda: not chord_keys(env, gid), 10, what="the chord keys deleted")


def test_chord_header_failure_gives_body_chord_error(env):
    w = env.worker("-c", "4")
    eb_id = str(uuid.uuid4())
    body = acc(env, index=0)
    body.link_error(env.app.signature("celery.accumulate", args=("eb",), task_id=eb_id))
    header = [acc(env, 1, index=0), acc(env, 2, index=9), acc(env, 3, index=0)]
    res = chord(header, app=env.app)(body)
    # (a result without its parent: res.get() would raise the header's error)
    with pytest.raises(ChordError) as ei:
        env.app.AsyncResult(res.id).get(timeout=30)
    failed_id = res.parent.results[1].id
    assert "Dependency %s raised IndexError('tuple index out of range')" % failed_id \
        in str(ei.value)
    meta = env.meta(res.id)
    assert meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "ChordError"
    assert meta["result"]["exc_module"] == "celery.exceptions"
    # the body's errback ran with the body's id, as an old-style errback does
    assert env.app.AsyncResult(eb_id).get(timeout=20) == [res.id, "eb"]
    assert w.count("ChordError") >= 1


PYAPP = textwrap.dedent('''
    import os, time
    from celery import Celery
    app = Celery("pyapp", broker=os.environ["CELERIAC_TEST_BROKER"],
                 backend=os.environ["CELERIAC_TEST_BACKEND"])
    app.conf.update(result_expires=3600, worker_hijack_root_logger=False)

    @app.task(name="pyapp.double")
    def double(x):
        return x * 2

    @app.task(name="pyapp.slow_double")
    def slow_double(x):
        time.sleep(1.5)
        return x * 2

    @app.task(name="pyapp.collect")
    def collect(results):
        return results
''')


@pytest.fixture
def python_worker(env, tmp_path):
    (tmp_path / "pyapp.py").write_text(PYAPP)
    e = dict(os.environ, CELERIAC_TEST_BROKER=env.broker, CELERIAC_TEST_BACKEND=env.backend)
    log = open(tmp_path / "py.log", "w")
    proc = subprocess.Popen([PY, "-m", "celery", "-A", "pyapp", "worker", "-P", "solo",
                             "-Q", "py", "-n", "py-%s@%%h" % uuid.uuid4().hex[:6],
                             "-l", "info", "--without-mingle", "--without-gossip"],
                            cwd=str(tmp_path), env=e, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "ready." in (tmp_path / "py.log").read_text(), 60,
                   what="the Python worker")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        print("\n----- python worker log -----\n" + (tmp_path / "py.log").read_text()[-4000:])


def test_chord_shared_with_a_python_worker(env, python_worker):
    env.worker("-c", "10")
    py = lambda name, *a: env.app.signature(name, args=a, queue="py")
    # celeriac finishes last and publishes a Python body
    slow = env.app.signature("llm.generate", args=("mixed-last",),
                             kwargs={"model": "fake/latency_ms=1500"})
    r1 = chord([py("pyapp.double", 1), py("pyapp.double", 2), slow],
               app=env.app)(py("pyapp.collect"))
    assert r1.get(timeout=60) == [2, 4, env.fake.expected_text("mixed-last")]
    # Python finishes last and publishes a celeriac body
    r2 = chord([acc(env, 3, index=0), acc(env, 4, index=0), py("pyapp.slow_double", 5)],
               app=env.app)(acc(env, index=0))
    assert r2.get(timeout=60) == [3, 4, 10]


def test_kill9_between_store_and_ack_joins_once(env):
    """The last header task is stored, then the worker dies before its ack
    (its broker connection held in a proxy): the redelivery does the
    part-return again and the body runs exactly once."""
    proxy = TcpProxy(env.services.amqp_port).start()
    try:
        w1 = env.worker("-c", "10", start=False)
        i = w1.args.index("-b")
        w1.args[i + 1] = "amqp://guest:guest@127.0.0.1:%d/%s" % (
            proxy.port, urllib.parse.quote(env.vhost, safe=""))
        w1.start()
        gen = lambda p, **kw: env.app.signature("llm.generate", args=(p,), kwargs=kw)
        header = [gen("head-0"), gen("head-1"), gen("head-2", model="fake/hold=h2")]
        body = gen("reduce-once").set(immutable=True)
        res = chord(header, app=env.app)(body)
        ids = [r.id for r in res.parent.results]
        wait_until(lambda: all(env.meta(t) for t in ids[:2]), 30, what="two headers")
        wait_until(lambda: w1.count(r"llm.generate\[%s\] received" % ids[2]), 10)
        time.sleep(0.5)  # its call is in flight, held
        # from here the worker's broker traffic is dropped: no confirm, no ack
        proxy.blackhole(True)
        env.fake.release("h2")
        wait_until(lambda: (env.meta(ids[2]) or {}).get("status") == "SUCCESS", 30,
                   what="the last header stored")
        time.sleep(0.5)
        w1.proc.kill()
        w1.wait()
        proxy.reset_all()  # RabbitMQ takes the unacked delivery back
        w2 = env.worker("-c", "10")
        assert res.get(timeout=60) == env.fake.expected_text("reduce-once")
        w2.wait_for("already has SUCCESS stored", 20)
        w2.wait_for("doing its chord part-return again", 20)
        calls = {}
        for e in env.fake.stats():
            calls[e["prompt"]] = calls.get(e["prompt"], 0) + 1
        assert calls == {"head-0": 1, "head-1": 1, "head-2": 1, "reduce-once": 1}, calls
        assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 20)
        time.sleep(1)
        assert [e["prompt"] for e in env.fake.stats()].count("reduce-once") == 1
    finally:
        proxy.close()
