"""Issue 4: Celery events, remote control (pidbox), revoke and Prometheus metrics,
checked with the real Python Celery client, its event receiver and State (what
Flower uses), and the real `celery` CLI."""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

import celery
import pytest

from conftest import BIN, PY, free_port, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------- helpers

def node_of(w):
    m = re.search(r"(\S+) ready\.$", w.log(), re.M)
    assert m, w.log()
    return m.group(1)


class Events:
    """A `celery events`-style receiver in a thread, feeding celery.events.state.State."""

    def __init__(self, app):
        from celery.events.receiver import EventReceiver
        from celery.events.state import State
        self.state = State()
        self.events = []
        self.cv = threading.Condition()
        ready = threading.Event()

        class Receiver(EventReceiver):
            def on_consume_ready(self, *a, **kw):
                ready.set()
                return super().on_consume_ready(*a, **kw)

        self.conn = app.connection_for_read()
        self.recv = Receiver(self.conn, handlers={"*": self._on}, app=app)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert ready.wait(15), "event receiver did not start"

    def _run(self):
        try:
            self.recv.capture(limit=None, timeout=None, wakeup=False)
        except Exception:  # the connection closes under it at the end
            pass

    def _on(self, event):
        with self.cv:
            self.state.event(event)
            self.events.append(event)
            self.cv.notify_all()

    def of(self, type_, uuid_=None):
        with self.cv:
            return [e for e in self.events
                    if e["type"] == type_ and (uuid_ is None or e.get("uuid") == uuid_)]

    def wait(self, type_, uuid_=None, count=1, timeout=20):
        deadline = time.time() + timeout
        with self.cv:
            while True:
                got = [e for e in self.events
                       if e["type"] == type_ and (uuid_ is None or e.get("uuid") == uuid_)]
                if len(got) >= count:
                    return got
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError("no %s event for %s (seen: %s)" % (
                        type_, uuid_, [e["type"] for e in self.events]))
                self.cv.wait(min(left, 0.2))

    def worker(self, node):
        with self.cv:
            return self.state.workers.get(node)

    def task(self, task_id):
        with self.cv:
            return self.state.tasks.get(task_id)

    def close(self):
        self.recv.should_stop = True
        self.thread.join(5)
        try:
            self.conn.close()
        except Exception:
            pass


@pytest.fixture
def events(env):
    ev = Events(env.app)
    yield ev
    ev.close()


def cli(env, *args, timeout=60):
    """Runs the real `celery -A monapp ...` against this test's vhost."""
    e = dict(os.environ, CELERIAC_TEST_BROKER=env.broker, CELERIAC_TEST_BACKEND=env.backend)
    return subprocess.run([PY, "-m", "celery", "-A", "monapp", *args], cwd=HERE, env=e,
                          capture_output=True, text=True, timeout=timeout)


def cli_json(env, node, *args):
    out = cli(env, *args, "-d", node, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])[node]


def inspect(env, node, timeout=5):
    return env.app.control.inspect(destination=[node], timeout=timeout)


def call(env, node, method, **arguments):
    replies = env.app.control.broadcast(method, arguments=arguments, destination=[node],
                                        reply=True, timeout=5)
    assert len(replies) == 1, replies
    return replies[0][node]


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def scrape(port):
    from prometheus_client.parser import text_string_to_metric_families
    status, ctype, text = http_get("http://127.0.0.1:%d/metrics" % port)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


# ------------------------------------------------------------------ events

def test_events_worker_online_and_every_task_event(env, events):
    from kombu import Exchange, Queue
    # A queue of our own, bound with exact routing keys, shows the message settings.
    rk_queue = Queue("rk-" + uuid.uuid4().hex[:8], Exchange("celeryev", "topic"),
                     routing_key="task.succeeded", auto_delete=True)
    conn = env.app.connection_for_write()
    bound = rk_queue(conn.default_channel)
    bound.declare()

    w = env.worker("-E", "--heartbeat-interval", "0.5", "--retry-backoff", "0.05",
                   "--retry-jitter", "false")
    node = node_of(w)
    online = events.wait("worker-online")[0]
    assert online["hostname"] == node and online["freq"] == 0.5
    assert online["sw_ident"] == "celeriac" and online["sw_sys"] == "Linux"
    assert len(online["loadavg"]) == 3 and online["active"] == 0
    events.wait("worker-heartbeat")
    assert events.worker(node).alive

    env.fake.script(["tps=200"])  # a measurable generation: tokens per second is known
    ok = env.app.send_task("llm.generate", args=["events ok"], kwargs={"model": "m-ok"})
    assert ok.get(timeout=20) == env.fake.expected_text("events ok")
    env.fake.script(["status=400;err_msg=bad%20request"])
    bad = env.app.send_task("llm.generate", args=["events bad"])
    bad.get(timeout=20, propagate=False)
    env.fake.script(["status=429", "tokens=4"])
    retried = env.app.send_task("llm.generate", args=["events retry"])
    assert retried.get(timeout=20) == env.fake.expected_text("events retry", tokens=4)
    expired = env.app.send_task("llm.generate", args=["too late"],
                                expires=datetime.now(timezone.utc) - timedelta(seconds=30))
    events.wait("task-revoked", expired.id)
    events.wait("task-succeeded", retried.id)

    # task-received carries what Flower takes from it (the merge rule)
    rec = events.wait("task-received", ok.id)[0]
    for key in ("hostname", "utcoffset", "pid", "clock", "timestamp"):
        assert key in rec
    assert rec["hostname"] == node and isinstance(rec["timestamp"], float)
    assert rec["name"] == "llm.generate" and rec["args"] == "['events ok']"
    assert rec["kwargs"] == "{'model': 'm-ok'}" and rec["retries"] == 0
    assert rec["root_id"] == ok.id and rec["parent_id"] is None
    assert rec["eta"] is None and rec["expires"] is None
    events.wait("task-started", ok.id)
    suc = events.wait("task-succeeded", ok.id)[0]
    assert suc["result"] == repr(env.fake.expected_text("events ok"))
    assert isinstance(suc["runtime"], float) and suc["runtime"] >= 0
    assert suc["model"] == "m-ok" and suc["completion_tokens"] == 16
    assert suc["prompt_tokens"] >= 1 and suc["ttft"] >= 0 and suc["runtime"] > 0
    assert 0 < suc["tokens_per_second"] < 2000  # paced at 200/s by the fake
    assert suc["provider"] == "default"  # as the result names the worker's own

    fail = events.wait("task-failed", bad.id)[0]
    assert fail["exception"].startswith("BadRequestError(")
    assert fail["traceback"].startswith("Traceback (most recent call last):")
    assert fail["model"] and "completion_tokens" in fail and "ttft" in fail

    ret = events.wait("task-retried", retried.id)[0]
    assert ret["exception"].startswith("RateLimitError(")
    assert len(events.of("task-received", retried.id)) == 2  # the retry arrives again
    assert events.of("task-received", retried.id)[1]["retries"] == 1

    rev = events.wait("task-revoked", expired.id)[0]
    assert rev["expired"] is True and rev["terminated"] is False and rev["signum"] is None

    # every event of this worker has a growing Lamport clock
    clocks = [e["clock"] for e in events.events if e.get("hostname") == node]
    assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)

    # Flower's store (celery.events.state.State) keeps all of it, LLM fields too
    t = events.task(ok.id)
    assert t.state == "SUCCESS" and t.name == "llm.generate" and t.worker.hostname == node
    assert t.args == "['events ok']" and t.runtime == suc["runtime"]
    assert t.model == "m-ok" and t.completion_tokens == 16 and t.ttft is not None
    assert t.tokens_per_second > 0
    assert events.task(bad.id).state == "FAILURE" and events.task(bad.id).exception
    assert events.task(retried.id).state == "SUCCESS"
    assert events.task(expired.id).state == "REVOKED"

    # the message itself: routing key, delivery mode, content type, hostname header
    msg = wait_until(lambda: bound.get(no_ack=True), 10, what="task.succeeded message")
    assert msg.delivery_info["routing_key"] == "task.succeeded"
    assert msg.properties["delivery_mode"] == 1
    assert msg.content_type == "application/json" and msg.headers == {"hostname": node}
    conn.close()

    w.stop()
    events.wait("worker-offline")
    assert not events.worker(node).alive


def test_events_name_the_provider_that_answered(env, events):
    """A model with a fallback list: the first provider fails before any
    text, the second answers; task-succeeded says which one did, as the
    result does, and the fallback itself is no event of Celery's."""
    doc = {"providers": {"first": {"type": "openai", "base_url": env.fake.base + "/v1"},
                         "second": {"type": "openai", "base_url": env.fake.base + "/v1"}},
           "models": {"m-fb": ["first/m-fb", "second/m-fb"]}}
    env.worker("-E", "--llm-providers", json.dumps(doc))
    events.wait("worker-online")
    env.fake.script(["status=503", "tokens=3"])
    r = env.app.send_task("llm.generate", args=["who answered"], kwargs={"model": "m-fb"})
    assert r.get(timeout=20) == env.fake.expected_text("who answered", tokens=3)
    suc = events.wait("task-succeeded", r.id)[0]
    assert suc["provider"] == "second" and suc["model"] == "m-fb"
    assert [e["type"] for e in events.events if e.get("uuid") == r.id] == \
        ["task-received", "task-started", "task-succeeded"]
    assert len(env.fake.stats()) == 2


def test_heartbeats_keep_flowing_during_a_long_generation(env, events):
    w = env.worker("--heartbeat-interval", "1")
    node = node_of(w)
    events.wait("worker-online")
    env.fake.script(["tps=3;tokens=12"])  # about four seconds of streaming
    r = env.app.send_task("llm.generate", args=["slow stream"])
    wait_until(lambda: env.fake.stats(), 10, what="the LLM call")
    samples = []
    while not r.ready():
        samples.append(events.worker(node).alive)
        time.sleep(0.1)
    assert len(samples) > 10 and all(samples), "worker flapped offline during the stream"
    start = env.fake.stats()[0]["t"]
    beats = [e for e in events.of("worker-heartbeat") if e["local_received"] > start]
    assert len(beats) >= 2 and all(b["freq"] == 1.0 for b in beats)
    # without -E no task event is sent
    assert not [e for e in events.events if e["type"].startswith("task-")]


@pytest.mark.brokers("amqp", "redis")
def test_enable_and_disable_events_by_remote_control(env, events):
    w = env.worker()
    node = node_of(w)
    a = env.app.send_task("celery.accumulate", args=[1])
    a.get(timeout=20)
    out = cli(env, "control", "enable_events", "-d", node)
    assert out.returncode == 0 and "task events enabled" in out.stdout, out.stdout + out.stderr
    b = env.app.send_task("celery.accumulate", args=[2])
    b.get(timeout=20)
    events.wait("task-succeeded", b.id)
    assert not events.of("task-received", a.id)
    assert call(env, node, "enable_events") == {"ok": "task events already enabled"}
    assert call(env, node, "disable_events") == {"ok": "task events disabled"}
    assert call(env, node, "disable_events") == {"ok": "task events already disabled"}
    c = env.app.send_task("celery.accumulate", args=[3])
    c.get(timeout=20)
    time.sleep(0.3)
    assert not events.of("task-received", c.id)


# ---------------------------------------------------------- remote control

def test_real_cli_status_and_inspect(env):
    w = env.worker("-Q", "celery,other", "-c", "7")
    node = node_of(w)
    out = cli(env, "status")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "%s: OK" % node in out.stdout and "1 node online." in out.stdout

    assert cli_json(env, node, "inspect", "ping") == {"ok": "pong"}
    stats = cli_json(env, node, "inspect", "stats")
    assert stats["pid"] == w.proc.pid and isinstance(stats["clock"], str)
    assert stats["pool"]["max-concurrency"] == 7 and isinstance(stats["total"], dict)
    assert stats["broker"]["transport"] == "amqp" and "password" not in json.dumps(stats)
    assert stats["prefetch_count"] == 28 and isinstance(stats["rusage"], dict)
    assert cli_json(env, node, "inspect", "registered") == ["llm.chat", "llm.embed",
                                                            "llm.generate"]
    queues = cli_json(env, node, "inspect", "active_queues")
    assert sorted(q["name"] for q in queues) == ["celery", "other"]
    q = [q for q in queues if q["name"] == "celery"][0]
    assert q["exchange"] == {"name": "celery", "type": "direct", "arguments": None,
                             "durable": True, "passive": False, "auto_delete": False,
                             "delivery_mode": None, "no_declare": False}
    assert q["routing_key"] == "celery" and q["durable"] and not q["no_ack"]

    env.fake.script(["stall_after_tokens=2"])
    r = env.app.send_task("llm.generate", args=["inspect me"], kwargs={"max_tokens": 5})
    wait_until(lambda: env.fake.stats(), 10, what="the LLM call")
    active = cli_json(env, node, "inspect", "active")
    assert len(active) == 1
    a = active[0]
    assert a["id"] == r.id and a["name"] == a["type"] == "llm.generate"
    assert a["args"] == ["inspect me"] and a["kwargs"] == {"max_tokens": 5}
    assert a["hostname"] == node and a["worker_pid"] == w.proc.pid
    assert isinstance(a["time_start"], float) and a["acknowledged"] is False
    assert a["delivery_info"] == {"exchange": "", "routing_key": "celery", "priority": 0,
                                  "redelivered": False}
    safe = inspect(env, node).active(safe=True)[node][0]
    assert safe["args"] == "['inspect me']" and safe["kwargs"] == "{'max_tokens': 5}"
    assert cli_json(env, node, "inspect", "revoked") == []
    r.revoke(terminate=True)
    wait_until(lambda: r.state == "REVOKED", 10, what="REVOKED")
    assert cli_json(env, node, "inspect", "revoked") == [r.id]


@pytest.mark.brokers("amqp", "redis")
def test_real_cli_control(env):
    w = env.worker()
    node = node_of(w)
    tid = str(uuid.uuid4())
    out = cli(env, "control", "revoke", tid, "-d", node)
    assert out.returncode == 0 and "tasks %s flagged as revoked" % tid in out.stdout, \
        out.stdout + out.stderr
    out = cli(env, "control", "rate_limit", "llm.generate", "100/m", "-d", node)
    assert "new rate limit set successfully" in out.stdout, out.stdout + out.stderr
    assert "llm.generate [rate_limit=100/m]" in \
        inspect(env, node).registered()[node]
    out = cli(env, "control", "rate_limit", "no.such", "1/s", "-d", node)
    assert "unknown task" in out.stdout
    out = cli(env, "control", "add_consumer", "extra", "-d", node)
    assert "add consumer extra" in out.stdout, out.stdout + out.stderr
    r = env.app.send_task("celery.accumulate", args=[9], queue="extra")
    assert r.get(timeout=20) == [9]
    names = lambda: sorted(q["name"] for q in inspect(env, node).active_queues()[node])
    assert names() == ["celery", "extra"]
    assert call(env, node, "cancel_consumer", queue="extra") == \
        {"ok": "no longer consuming from extra"}
    assert names() == ["celery"]
    out = cli(env, "control", "shutdown", "-d", node)
    assert w.wait(30) == 0  # warm shutdown, exit 0; shutdown sends no reply
    assert "Got shutdown from remote" in w.log()


@pytest.mark.brokers("amqp", "redis")
def test_inspect_and_control_reply_shapes(env):
    # prefetch 3: the running task, a reserved one and an eta one all arrive
    # (held here: not sent through delayed delivery where global QoS is denied)
    w = env.worker("-c", "1", "--prefetch-multiplier", "3", "--delayed-delivery", "off")
    node = node_of(w)
    ins = inspect(env, node)
    env.fake.script(["stall_after_tokens=1"])
    running = env.app.send_task("llm.generate", args=["hold the slot"])
    wait_until(lambda: env.fake.stats(), 10, what="the LLM call")
    waiting = env.app.send_task("celery.accumulate", args=[1])
    later = env.app.send_task("celery.accumulate", args=[2], countdown=300)
    wait_until(lambda: ins.reserved()[node], 10, what="a reserved task")
    assert [t["id"] for t in ins.reserved()[node]] == [waiting.id]
    sched = wait_until(lambda: ins.scheduled()[node], 10, what="a scheduled task")
    assert sched[0]["request"]["id"] == later.id and sched[0]["priority"] == 6
    assert sched[0]["eta"].startswith(str(datetime.now(timezone.utc).year))
    q = ins.query_task([running.id, waiting.id, "unknown-id"])[node]
    assert q[running.id][0] == "active" and q[waiting.id][0] == "reserved"
    assert "unknown-id" not in q
    conf = ins.conf()[node]
    assert conf["worker_concurrency"] == 1 and "sk-test" not in json.dumps(conf)
    assert "celeriac" in ins.report()[node]["ok"]
    assert isinstance(ins.clock()[node]["clock"], int)
    hello = call(env, node, "hello", from_node="other@host", revoked={"r-1": time.time()})
    assert "r-1" in hello["revoked"] and isinstance(hello["revoked"]["r-1"], float)
    assert call(env, node, "hello", from_node=node) is None
    assert call(env, node, "time_limit", task_name="llm.generate", soft=10, hard=20) == \
        {"ok": "time limits set successfully"}
    assert call(env, node, "time_limit", task_name="nope", soft=1) == {"error": "unknown task"}
    assert call(env, node, "pool_grow", n=2) == {"ok": "pool will grow"}
    assert ins.stats()[node]["pool"]["max-concurrency"] == 3
    assert call(env, node, "pool_shrink", n=1) == {"ok": "pool will shrink"}
    assert ins.stats()[node]["pool"]["max-concurrency"] == 2
    # the grown pool ran the waiting task while the first one still holds its slot
    assert waiting.get(timeout=20) == [1]
    assert call(env, node, "heartbeat") is None
    assert call(env, node, "no_such_command") == {"error": "KeyError('no_such_command')"}
    assert call(env, node, "autoscale", max=2, min=1) == \
        {"error": "ValueError('Autoscale not enabled')"}
    assert call(env, node, "rate_limit", task_name="llm.generate") == {
        "error": "TypeError(\"rate_limit() missing 1 required positional argument: "
                 "'rate_limit'\")"}
    # destination and pattern: other nodes' requests are not answered
    assert env.app.control.broadcast("ping", destination=["other@x"], reply=True,
                                     timeout=0.5) == []
    got = env.app.control.inspect(pattern=node.split("@")[0][:9] + "*", matcher="glob",
                                  timeout=1).ping()
    assert got == {node: {"ok": "pong"}}
    running.revoke(terminate=True)
    later.revoke()
    wait_until(lambda: later.state == "REVOKED", 10, what="eta task REVOKED")


# The pattern libFuzzer found on which glibc's regcomp() ran for over 20 minutes
# (tests/fuzz/corpus/pidbox_msg/pcre_hostile_eclosure).
HOSTILE_PCRE = ".....??*????????????????????????+++++...z...............''edery@*"


def test_remote_control_patterns_cannot_stall_the_worker(env):
    w = env.worker()
    node = node_of(w)
    name, host = node.split("@", 1)
    ping = lambda **kw: env.app.control.inspect(timeout=1, **kw).ping()
    # re.match: anchored at the start, not at the end; fnmatch for glob
    assert ping(pattern=re.escape(name[:4]), matcher="pcre") == {node: {"ok": "pong"}}
    assert ping(pattern="(?i)" + re.escape(node.upper()) + "$", matcher="pcre") == \
        {node: {"ok": "pong"}}
    assert ping(pattern=re.escape(host), matcher="pcre") is None
    assert ping(pattern="*@" + host, matcher="glob") == {node: {"ok": "pong"}}
    # what anyone on the broker can send: a pattern Python's re refuses too,
    # catastrophic backtracking, one over the length bound, and many '*'
    hostile = [HOSTILE_PCRE, r"(.*.*)*\s", "(" * 2000,
               name[:1] + "x?" * 600]
    for p in hostile:
        assert env.app.control.broadcast("ping", pattern=p, matcher="pcre", reply=True,
                                         timeout=1) == []
    assert env.app.control.broadcast("ping", pattern="*" * 900 + "!", matcher="glob",
                                     reply=True, timeout=1) == []
    # a burst of them as casts, more distinct ones than the worker keeps compiled
    for i in range(40):
        env.app.control.broadcast("ping", pattern=HOSTILE_PCRE + str(i % 20),
                                  matcher="pcre")
    # and the worker still answers at once and runs tasks
    assert ping(destination=[node]) == {node: {"ok": "pong"}}
    assert ping(pattern=re.escape(node), matcher="pcre") == {node: {"ok": "pong"}}
    assert env.app.send_task("celery.accumulate", args=[5]).get(timeout=20) == [5]
    warned = [l for l in w.log().splitlines() if "its pattern matches nothing" in l]
    assert len(warned) == 1, w.log()


# ------------------------------------------------------------------ revoke

def channel_prefetch(env):
    """The channel-wide prefetch windows of the vhost's channels (the worker's
    task channel asks for a global basic.qos)."""
    out = env.services.ctl("list_channels", "-p", env.vhost, "global_prefetch_count").stdout
    return [int(l) for l in out.split() if l.isdigit()]


def test_pool_grow_stops_at_the_cap_and_prefetch_stays_bounded(env):
    # Repeated grows once pushed the slot count past 2^29, where slots x the
    # multiplier overflowed an int and the prefetch window became "no limit".
    w = env.worker("-c", "99990", "--prefetch-multiplier", "1000")
    node = node_of(w)
    assert "error" in call(env, node, "pool_grow", n=2 ** 28)  # over the option's bound
    assert call(env, node, "pool_grow", n=100000) == \
        {"ok": "pool will grow to its maximum of 100000"}
    for _ in range(25):
        assert call(env, node, "pool_grow", n=100000) == \
            {"error": "pool is at its maximum of 100000"}
    stats = inspect(env, node).stats()[node]
    assert stats["pool"]["max-concurrency"] == 100000
    assert stats["prefetch_count"] == 65535
    assert "Concurrency stays 100000, its maximum" in w.log()
    if os.environ.get("CELERIAC_RABBITMQ_43"):
        # Global QoS denied: the windows are per consumer and fixed at the
        # consume, so there is no channel-wide one to read; the bound above
        # (stats) is what there is to check.
        return
    wait_until(lambda: 65535 in channel_prefetch(env), 10, what="the bounded prefetch window")
    r = env.app.send_task("celery.accumulate", args=[5])
    assert r.get(timeout=20) == [5]
    assert call(env, node, "pool_shrink", n=99999) == {"ok": "pool will shrink"}
    assert inspect(env, node).stats()[node]["pool"]["max-concurrency"] == 1
    wait_until(lambda: 1000 in channel_prefetch(env), 10, what="the window shrunk")


def test_conf_report_and_banner_show_no_url_secret(env):
    # A base URL may carry a password (or a key in its query): the banner and
    # `inspect conf` / `report` show it with the secret cut out.
    base = env.fake.base.replace("http://", "http://celeriac:basicpw99@") + "/v1"
    w = env.worker(env={"OPENAI_BASE_URL": base})
    node = node_of(w)
    conf = inspect(env, node).conf()[node]
    assert conf["celeriac_llm_base_url"] == base.replace("basicpw99", "***")
    report = inspect(env, node).report()[node]["ok"]
    assert "celeriac:***@" in report and "basicpw99" not in report
    assert "basicpw99" not in w.log() and "celeriac:***@" in w.log()
    r = env.app.send_task("llm.generate", args=["through a proxy"])
    assert r.get(timeout=20) == env.fake.expected_text("through a proxy")


@pytest.mark.brokers("amqp", "redis")
def test_revoke_before_start(env, events):
    w = env.worker("-E", "--delayed-delivery", "off")
    node = node_of(w)
    # an eta task waiting on the worker: revoked at once, REVOKED stored
    r = env.app.send_task("llm.generate", args=["eta"], countdown=120)
    wait_until(lambda: inspect(env, node).scheduled()[node], 10, what="scheduled")
    r.revoke()
    wait_until(lambda: r.state == "REVOKED", 10, what="REVOKED")
    rev = events.wait("task-revoked", r.id)[0]
    assert rev["terminated"] is False and rev["expired"] is False
    # revoked before it was even sent: never runs, never calls the LLM
    tid = str(uuid.uuid4())
    env.app.AsyncResult(tid).revoke()
    wait_until(lambda: tid in inspect(env, node).revoked()[node], 10, what="revoked id")
    r2 = env.app.send_task("llm.generate", args=["never"], task_id=tid)
    wait_until(lambda: r2.state == "REVOKED", 10, what="REVOKED")
    assert env.meta(tid)["result"]["exc_type"] == "TaskRevokedError"
    assert env.fake.stats() == []


@pytest.mark.brokers("amqp", "redis")
def test_revoke_terminate_mid_stream_stores_partial_text(env, events):
    from celery.exceptions import TaskRevokedError
    w = env.worker("-E")
    node = node_of(w)
    env.fake.script(["stall_after_tokens=3"])
    r = env.app.send_task("llm.generate", args=["stop me"])
    wait_until(lambda: env.fake.stats() and env.fake.stats()[0]["tokens_sent"] >= 3, 10,
               what="three tokens streamed")
    time.sleep(0.2)
    sent = env.fake.stats()[0]["text_sent"]
    reply = call(env, node, "revoke", task_id=r.id, terminate=True, signal="SIGKILL")
    assert reply == {"ok": "terminate: %s" % r.id}
    with pytest.raises(TaskRevokedError):
        r.get(timeout=10)
    meta = env.meta(r.id)
    assert meta["status"] == "REVOKED"
    assert meta["result"]["partial"] == sent and sent
    assert env.fake.expected_text("stop me").startswith(sent)
    wait_until(lambda: env.fake.stats()[0]["ended"] != "stalled", 10, what="transfer closed")
    assert env.fake.stats()[0]["ended"] == "stall_client_closed"
    rev = events.wait("task-revoked", r.id)[0]
    assert rev["terminated"] is True and rev["signum"] == 15
    assert call(env, node, "revoke", task_id=[r.id], terminate=True) == \
        {"ok": "terminate: tasks unknown"}
    # The worker's log reaches its reader thread a moment later on a busy machine.
    wait_until(lambda: w.count("Terminating") >= 1, 10, what="the Terminating line")
    assert w.count("Terminating") == 1


@pytest.mark.brokers("amqp", "redis")
def test_statedb_keeps_revoked_ids_across_restarts(env, tmp_path):
    db = str(tmp_path / "state.db")
    w = env.worker("--statedb", db)
    node = node_of(w)
    tid = str(uuid.uuid4())
    assert call(env, node, "revoke", task_id=tid) == {"ok": "tasks %s flagged as revoked" % tid}
    wait_until(lambda: os.path.exists(db) and tid in open(db).read(), 10, what="state file")
    w.stop()
    w2 = env.worker("--statedb", db)
    node2 = node_of(w2)
    assert tid in inspect(env, node2).revoked()[node2]
    r = env.app.send_task("llm.generate", args=["revoked long ago"], task_id=tid)
    wait_until(lambda: r.state == "REVOKED", 10, what="REVOKED")
    assert env.fake.stats() == []
    assert "1 revoked task id(s) loaded" in w2.log()


def test_revoke_of_an_unseen_id_stores_revoked_at_once(env, tmp_path):
    # Celery 5.6: REVOKED is in the backend before any worker sees the task,
    # never over a SUCCESS, and --statedb keeps the id for the task's arrival
    db = str(tmp_path / "state.db")
    w = env.worker("--statedb", db)
    node = node_of(w)
    done = env.app.send_task("llm.generate", args=["done before"])
    done.get(timeout=20)
    tid = str(uuid.uuid4())
    call(env, node, "revoke", task_id=[tid, done.id])
    meta = wait_until(lambda: env.meta(tid), 10, what="REVOKED stored at once")
    assert meta["status"] == "REVOKED"
    assert meta["result"]["exc_type"] == "TaskRevokedError"
    assert env.app.AsyncResult(tid).state == "REVOKED"
    time.sleep(0.5)
    assert env.meta(done.id)["status"] == "SUCCESS"
    wait_until(lambda: os.path.exists(db) and tid in open(db).read(), 10, what="state file")
    w.stop()
    w2 = env.worker("--statedb", db)
    r = env.app.send_task("llm.generate", args=["revoked ahead"], task_id=tid)
    w2.wait_for(r"Discarding revoked task: .*%s" % tid, 10)
    assert env.meta(tid)["status"] == "REVOKED"
    assert len(env.fake.stats()) == 1  # only "done before" called the LLM
    assert r.state == "REVOKED"


def test_revoke_by_stamped_headers(env):
    # Celery 5.3+'s revoke_by_stamped_headers, with its reply shapes: queued
    # and arriving tasks carrying a revoked stamp are discarded as REVOKED,
    # others run; with terminate, a running one is ended, and the reply names
    # the stamps that matched. Stamps go as Celery 5.3+ producers send them,
    # as the stamped_headers and stamps message headers.
    w = env.worker("-c", "1", "--prefetch-multiplier", "4")
    node = node_of(w)

    def stamped(prompt, **stamps):
        return env.app.send_task("llm.generate", args=[prompt], headers={
            "stamped_headers": list(stamps), "stamps": stamps})

    env.fake.script(["hold=st;tokens=3"])
    running = stamped("running", mtask_id="run-1")
    wait_until(lambda: len(env.fake.stats()) >= 1, 10, what="the first call running")
    queued = stamped("queued", mtask_id="q-1")
    other = stamped("other", mtask_id="keep")
    listed = stamped("listed", batch=["b-0", "b-9"])
    reply = call(env, node, "revoke_by_stamped_headers",
                 headers={"mtask_id": ["q-1", "late-1"], "batch": "b-9"})
    assert reply == {"ok": "headers {'mtask_id': ['q-1', 'late-1'], 'batch': 'b-9'} "
                           "flagged as revoked, but not terminated"}, reply
    # a list of "name=value" strings, as Celery also accepts
    reply = call(env, node, "revoke_by_stamped_headers", headers=["origin=cli"])
    assert reply == {"ok": "headers {'origin': 'cli'} flagged as revoked, "
                           "but not terminated"}, reply
    late = stamped("late", mtask_id="late-1")
    reply = call(env, node, "revoke_by_stamped_headers", headers={"mtask_id": "run-1"},
                 terminate=True)
    assert reply == {"ok": "headers defaultdict(<class 'set'>, {'mtask_id': {'run-1'}}) "
                           "revoked"}, reply
    reply = call(env, node, "revoke_by_stamped_headers", headers={"mtask_id": "none"},
                 terminate=True)
    assert reply == {"ok": "headers {'mtask_id': 'none'} were not terminated"}, reply
    for r in (running, queued, listed, late):
        wait_until(lambda: (env.meta(r.id) or {}).get("status") == "REVOKED", 20,
                   what="%s REVOKED" % r.id)
    assert other.get(timeout=20)
    w.wait_for(r"revoked by header: mtask_id=q-1", 5)
    prompts = [json.dumps(s["body"]) for s in env.fake.stats()]
    assert not any(p in " ".join(prompts) for p in ('"queued"', '"listed"', '"late"'))


def test_revoke_by_stamped_headers_from_the_client_api(env):
    # app.control.revoke_by_stamped_headers as a Celery 5.3+ client calls it,
    # on tasks it stamped itself with Signature.stamp(): the client reads
    # each reply's "ok" (a set there would be task ids to revoke as well), so
    # a reply of any other shape is an exception in the caller. Without
    # reply=True it returns None, and the stamps still take effect.
    if not hasattr(env.app.control, "revoke_by_stamped_headers"):
        pytest.skip("Celery %s's client has no revoke_by_stamped_headers (5.3+)"
                    % celery.__version__)
    w = env.worker("-c", "1", "--prefetch-multiplier", "4")
    node = node_of(w)

    def stamped(prompt, **stamps):
        sig = env.app.signature("llm.generate", args=[prompt])
        sig.stamp(**stamps)
        return sig.apply_async()

    def revoke(headers, **kw):
        return env.app.control.revoke_by_stamped_headers(
            headers, destination=[node], reply=True, timeout=5, **kw)

    env.fake.script(["hold=cs;tokens=3"])
    running = stamped("running", mtask_id="run-2")
    wait_until(lambda: len(env.fake.stats()) >= 1, 10, what="the first call running")
    queued = stamped("queued", mtask_id="q-2")
    other = stamped("other", mtask_id="kept")
    assert revoke({"mtask_id": ["q-2"]}) == [{node: {
        "ok": "headers {'mtask_id': ['q-2']} flagged as revoked, but not terminated"}}]
    assert env.app.control.revoke_by_stamped_headers({"mtask_id": "late-2"},
                                                     destination=[node]) is None
    assert call(env, node, "ping") == {"ok": "pong"}  # the one before is handled
    late = stamped("late", mtask_id="late-2")
    assert revoke({"mtask_id": "run-2"}, terminate=True) == [{node: {
        "ok": "headers defaultdict(<class 'set'>, {'mtask_id': {'run-2'}}) revoked"}}]
    for r in (running, queued, late):
        wait_until(lambda: (env.meta(r.id) or {}).get("status") == "REVOKED", 20,
                   what="%s REVOKED" % r.id)
        assert r.state == "REVOKED"
    assert other.get(timeout=20)
    prompts = " ".join(json.dumps(s["body"]) for s in env.fake.stats())
    assert '"queued"' not in prompts and '"late"' not in prompts


def test_extended_result_carries_stamps(env):
    # Celery 5.3+ with result_extended: the stamped headers and each stamp in
    # the meta, after queue and before task_id, through a retry too
    w = env.worker("--result-extended")
    env.fake.script(["status=503", "tokens=2"])
    r = env.app.send_task("llm.generate", args=["stamped"], headers={
        "stamped_headers": ["mtask_id", "batch"],
        "stamps": {"mtask_id": "m-1", "batch": ["b1", "b2"]}})
    assert r.get(timeout=30)
    raw = env.redis.get("celery-task-meta-" + r.id).decode()
    meta = json.loads(raw)
    assert meta["retries"] == 1, meta
    assert meta["stamped_headers"] == ["mtask_id", "batch"]
    assert meta["mtask_id"] == "m-1" and meta["batch"] == ["b1", "b2"]
    assert raw.index('"queue"') < raw.index('"stamped_headers"') < raw.index('"task_id"')


# ----------------------------------------------------------------- metrics

def test_metrics_endpoint_matches_the_work_done(env):
    port = free_port()
    w = env.worker("--metrics-port", str(port), "-c", "1", "--prefetch-multiplier", "2",
                   "--heartbeat-interval", "0.5")
    node = node_of(w)
    for i in range(3):
        env.app.send_task("llm.generate", args=["m%d" % i], kwargs={"model": "mod-a"}) \
            .get(timeout=20)
    env.fake.script(["status=400"])
    env.app.send_task("llm.generate", args=["fails"], kwargs={"model": "mod-b"}) \
        .get(timeout=20, propagate=False)
    s = scrape(port)
    assert sample(s, "celeriac_tasks_total", task="llm.generate", state="SUCCESS") == 3
    assert sample(s, "celeriac_tasks_total", task="llm.generate", state="FAILURE") == 1
    assert sample(s, "celeriac_tasks_received_total", task="llm.generate") == 4
    assert sample(s, "celeriac_task_runtime_seconds_count", task="llm.generate") == 4
    assert sample(s, "celeriac_task_queue_wait_seconds_count", task="llm.generate") == 4
    assert sample(s, "celeriac_llm_completion_tokens_total", model="mod-a") == 48
    assert sample(s, "celeriac_llm_prompt_tokens_total", model="mod-a") >= 3
    assert sample(s, "celeriac_llm_request_duration_seconds_count", model="mod-a") == 3
    assert sample(s, "celeriac_llm_time_to_first_token_seconds_count", model="mod-a") == 3
    assert sample(s, "celeriac_llm_request_duration_seconds_bucket", model="mod-a",
                  le="+Inf") == 3
    assert sample(s, "celeriac_llm_errors_total", model="mod-b", status="400",
                  type="BadRequestError") == 1
    assert sample(s, "celeriac_dead_letters_total", task="llm.generate") == 1
    assert sample(s, "celeriac_worker_info", hostname=node, version="0.1.0") == 1
    assert sample(s, "celeriac_broker_connected") == 1
    assert sample(s, "celeriac_broker_reconnects_total") == 0
    assert sample(s, "celeriac_tasks_in_flight") == 0
    assert sample(s, "celeriac_concurrency") == 1
    assert sample(s, "celeriac_queue_consumers", queue="celery") == 1

    # one running, one prefetched, the rest waiting in the queue (polled depth)
    env.fake.script(["stall_after_tokens=1"])
    held = [env.app.send_task("llm.generate", args=["q%d" % i]) for i in range(5)]
    s = wait_until(lambda: (lambda s: s if sample(s, "celeriac_tasks_in_flight") == 1 and
                            sample(s, "celeriac_tasks_prefetched") == 1 and
                            sample(s, "celeriac_queue_messages", queue="celery") == 3
                            else None)(scrape(port)), 20, 0.2, what="depth 3")
    top = subprocess.run([BIN, "top", "--once", "-i", "0.2", "127.0.0.1:%d" % port],
                         capture_output=True, text=True, timeout=30)
    assert top.returncode == 0, top.stderr
    assert node[:28] in top.stdout and re.search(r"^celery\s+3\s+1\s", top.stdout, re.M), \
        top.stdout
    assert re.search(r"\s1/1\s+1\s", top.stdout), top.stdout
    env.app.control.revoke([r.id for r in held], terminate=True)
    for r in held:
        wait_until(lambda: r.state == "REVOKED", 20, what="REVOKED")
    s = scrape(port)
    assert sample(s, "celeriac_tasks_total", task="llm.generate", state="REVOKED") == 5

    status, ctype, body = http_get("http://127.0.0.1:%d/healthz" % port)
    assert status == 200 and json.loads(body) == {"status": "ok", "broker": True,
                                                  "broker_blocked": False,
                                                  "backend": True, "loop": True}
    assert http_get("http://127.0.0.1:%d/nope" % port)[0] == 404


def test_metrics_port_in_use_is_one_clear_error(env):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        w = env.worker("--metrics-port", str(port), start=False)
        w.start(wait_ready=False)
        assert w.wait(30) != 0
        assert "metrics: cannot listen on 127.0.0.1:%d: address already in use" % port \
            in w.log()
    finally:
        s.close()


def test_cost_in_results_events_and_metrics(env, events):
    """Issue 38, cost: a provider's prices give every answer's usage a cost
    (USD), with the cached and reasoning parts the provider reported;
    task-succeeded carries it and /metrics adds it up by provider and model.
    Without a price the cost is null and nothing is counted."""
    doc = {"providers": {
        "default": {"prices": {"gpt-t*": {"input": 2.5, "output": 10, "cached_input": 1.25}}},
        "acme": {"type": "openai", "base_url": env.fake.base + "/v1",
                 "prices": {"*": {"input": 1, "output": 4}}}}}
    port = free_port()
    w = env.worker("-E", "--metrics-port", str(port), "--llm-providers", json.dumps(doc))
    events.wait("worker-online")
    env.fake.script(["cached_tokens=3;tokens=5"])
    r = env.app.send_task("llm.chat", args=[[{"role": "user", "content": "price me " * 8}]],
                          kwargs={"model": "gpt-test"})
    u = r.get(timeout=20)["usage"]
    p = u["prompt_tokens"]
    assert p > 3 and u["completion_tokens"] == 5 and u["cached_tokens"] == 3
    assert u["reasoning_tokens"] == 0 and "cache_creation_tokens" not in u
    want = ((p - 3) * 2.5 + 3 * 1.25 + 5 * 10) / 1e6
    assert abs(u["cost"] - want) < 1e-12, (u, want)
    assert abs(events.wait("task-succeeded", r.id)[0]["cost"] - want) < 1e-9

    g = env.app.send_task("llm.chat", args=[[{"role": "user", "content": "named"}]],
                          kwargs={"model": "acme/m1"})
    ga = g.get(timeout=20)["usage"]
    want_acme = (ga["prompt_tokens"] * 1 + ga["completion_tokens"] * 4) / 1e6
    assert abs(ga["cost"] - want_acme) < 1e-12, ga
    ev = events.wait("task-succeeded", g.id)[0]
    assert ev["provider"] == "acme" and abs(ev["cost"] - want_acme) < 1e-9, ev

    n = env.app.send_task("llm.chat", args=[[{"role": "user", "content": "free"}]],
                          kwargs={"model": "unpriced"})
    assert n.get(timeout=20)["usage"]["cost"] is None
    assert "cost" not in events.wait("task-succeeded", n.id)[0]

    _, _, text = http_get("http://127.0.0.1:%d/metrics" % port)

    def series(name, **labels):
        sel = ",".join('%s="%s"' % kv for kv in labels.items())  # in the series' order
        m = re.search(r"^%s\{%s\} (\S+)$" % (re.escape(name), re.escape(sel)), text, re.M)
        return float(m.group(1)) if m else None
    assert abs(series("celeriac_llm_cost_usd_total", provider="default", model="gpt-test")
               - want) < 1e-9, text
    assert abs(series("celeriac_llm_cost_usd_total", provider="acme", model="acme/m1")
               - want_acme) < 1e-9, text
    assert series("celeriac_llm_cost_usd_total", provider="default", model="unpriced") is None
    assert series("celeriac_llm_tokens_total", provider="default", model="gpt-test",
                  kind="cached") == 3
    assert series("celeriac_llm_tokens_total", provider="default", model="gpt-test",
                  kind="completion") == 5
