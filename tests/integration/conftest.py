"""Integration harness: real RabbitMQ, real Redis, the fake LLM server, the real
celeriac binary and a real Python Celery client.

Run through scripts/run-integration.sh (which exports CELERIAC_IT_DIR and runs
the suite in pytest-xdist workers, each starting its own private RabbitMQ and
Redis under it; a run given test files is one process on one such pair), or by
hand with that variable set.
Every test gets its own RabbitMQ vhost and its own Redis database, so tests
never see each other's messages or results.

Brokers: a test runs over RabbitMQ only, unless it is marked
`@pytest.mark.brokers("amqp", "redis")`: then it runs once per broker named
(ids `[amqp]` / `[redis]`). Over Redis, Env.broker is redis://.../<db> with a
database of the test's own (16 + the result backend's db, so kombu's keys and
its `/<db>.` pub/sub channels never meet another test's), flushed before and
after. Over SQS ("sqs"), the broker is the process's SQS emulator (the
`sqs_emu` fixture, started only when a test asks for it) with a
queue_name_prefix of the test's own, passed to the workers and the client
apps as broker transport options; results stay in Redis. Env.transport says
which broker a test has.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from celery import Celery

from erlctl import COUNTERS, ErlCtl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("CELERIAC_BIN", os.path.join(ROOT, "build", "celeriac"))
PY = "/usr/bin/python3"
_db_counter = [0]
# Result backends use dbs 1..15; a Redis broker uses 16 + that db, so that the
# two never share a db (scripts/services.sh starts Redis with 64 databases).
BROKER_DB_BASE = 16
BROKERS = ("amqp", "redis", "sqs")


def _read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.strip().split("=", 1)
                env[k] = v
    return env


def next_result_db():
    """A result backend db for the next test (1..15, in turn): task ids are
    unique, the turn only keeps one test's keys out of the next one's flush."""
    _db_counter[0] = _db_counter[0] % 15 + 1
    return _db_counter[0]


class RedisBrokerDb(int):
    """Env.vhost of a test over Redis: the broker's db number. It stands where a
    vhost name goes, so that `services.queue_depth(env.vhost, q)` reads the
    queue over either broker; rabbitmqctl given it fails loudly."""


def redis_queue_keys(queue):
    """The lists kombu keeps a queue in: the queue, then its priority buckets."""
    return [queue] + [queue + "\x06\x16" + str(p) for p in (3, 6, 9)]


class Services:
    def __init__(self, directory):
        self.dir = directory
        env = _read_env(os.path.join(directory, "env"))
        self.amqp_port = int(env["AMQP_PORT"])
        self.redis_port = int(env["REDIS_PORT"])
        self.node = env["RABBIT_NODE"]
        self._spare_vhosts = []
        self._dropped_vhosts = []
        self._vhost_eval = True
        self.erl = ErlCtl(self.node, directory)

    def close(self):
        self.erl.close()

    def ctl(self, *args, check=True):
        # The calls the suite makes most, answered without a VM of their own
        # (erlctl.py); anything else, or a call it cannot answer, is rabbitmqctl's.
        fast = None
        if args and args[0] == "eval" and len(args) == 2:
            fast = self.erl.eval(args[1])
            fast = None if fast is None else fast + "\n"
        elif (len(args) >= 5 and args[0] == "list_queues" and args[1] == "-p"
              and isinstance(args[2], str) and not isinstance(args[2], RedisBrokerDb)
              and args[3] == "name" and all(a in COUNTERS for a in args[4:])):
            fast = self.erl.list_queues(args[2], args[4:])
        if fast is not None:
            return subprocess.CompletedProcess(["rabbitmqctl", *args], 0, fast, "")
        return subprocess.run(["rabbitmqctl", "-q", "-n", self.node, *args], check=check,
                              capture_output=True, text=True, timeout=120)

    def script(self, action):
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "services.sh"), action,
                            self.dir], capture_output=True, text=True, timeout=300)
        # The script's own words (a node's log tail) in the failure, whole.
        assert r.returncode == 0, "services.sh %s failed (exit %d):\n%s" % (
            action, r.returncode, r.stderr[-4000:])

    # Each rabbitmqctl call boots an Erlang VM: a second of CPU, three of them a
    # test when each made and dropped its own vhost. One `eval` makes a batch of
    # vhosts ahead and deletes those dropped since the last.
    VHOST_BATCH = 8

    def new_vhost(self):
        if not self._spare_vhosts:
            self._vhost_round()
        return self._spare_vhosts.pop()

    def drop_vhost(self, name):
        """Deleted with the next batch made (the node goes at the end anyway)."""
        self._dropped_vhosts.append(name)

    def _vhost_round(self):
        dropped, self._dropped_vhosts = self._dropped_vhosts, []
        names = ["t-" + uuid.uuid4().hex[:10] for _ in range(self.VHOST_BATCH)]
        if self._vhost_eval:
            binl = lambda vs: "[%s]" % ",".join('<<"%s">>' % v for v in vs)
            expr = ('U = <<"celeriac-tests">>, '
                    '[rabbit_vhost:delete(V, U) || V <- %s], Add = %s, '
                    'R = [rabbit_vhost:add(V, U) || V <- Add] ++ '
                    '[rabbit_auth_backend_internal:set_permissions(<<"guest">>, V, <<".*">>, '
                    '<<".*">>, <<".*">>, U) || V <- Add], '
                    'case lists:usort(R) of [ok] -> made; _ -> R end.'
                    % (binl(dropped), binl(names)))
            r = self.ctl("eval", expr, check=False)
            if r.returncode == 0 and r.stdout.strip() == "made":
                self._spare_vhosts = names
                return
            # A RabbitMQ whose internals differ: rabbitmqctl's own commands, one by one.
            self._vhost_eval = False
            names = ["t-" + uuid.uuid4().hex[:10]]
        for v in dropped:
            self.ctl("delete_vhost", v, check=False)
        self.ctl("add_vhost", names[0])
        self.ctl("set_permissions", "-p", names[0], "guest", ".*", ".*", ".*")
        self._spare_vhosts = names

    def broker_url(self, vhost):
        return "amqp://guest:guest@127.0.0.1:%d/%s" % (self.amqp_port, urllib.parse.quote(vhost, safe=""))

    def redis_url(self, db):
        return "redis://127.0.0.1:%d/%d" % (self.redis_port, db)

    def queue_depth(self, vhost, queue):
        if isinstance(vhost, RedisBrokerDb):
            # kombu's queue size: LLEN summed over the queue's priority lists
            import redis
            r = redis.Redis(host="127.0.0.1", port=self.redis_port, db=int(vhost))
            try:
                return sum(r.llen(k) for k in redis_queue_keys(queue))
            finally:
                r.close()
        out = self.ctl("list_queues", "-p", vhost, "name", "messages").stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == queue:
                return int(parts[1])
        return None


def _services_script(action, directory, timeout=300):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "services.sh"), action, directory],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def services():
    """The RabbitMQ node and Redis of this test process. Run serially, those of
    CELERIAC_IT_DIR (started by run-integration.sh). Under pytest-xdist each worker
    starts its own under CELERIAC_IT_DIR/<dir>-<worker id> and stops them at the
    end: the tests that stop the broker, or fill it, then touch no other worker's."""
    d = os.environ.get("CELERIAC_IT_DIR")
    if not d:
        pytest.skip("CELERIAC_IT_DIR not set: run through scripts/run-integration.sh")
    wid = os.environ.get("PYTEST_XDIST_WORKER")
    if not wid:
        s = Services(d)
        try:
            yield s
        finally:
            s.close()
        return
    # The node's name is made from the dir's name: keep the run's in it, so that
    # two runs on one host never ask epmd for the same name.
    own = os.path.join(d, "%s-%s" % (os.path.basename(d.rstrip("/")), wid))
    r = _services_script("start", own)
    if r.returncode != 0:
        _services_script("stop", own, timeout=120)
        raise RuntimeError("services for %s did not start:\n%s%s" % (wid, r.stdout, r.stderr))
    s = Services(own)
    try:
        yield s
    finally:
        s.close()
        _services_script("stop", own, timeout=120)


class FakeLLM:
    def __init__(self, proc, port):
        self.proc = proc
        self.port = port
        self.base = "http://127.0.0.1:%d" % port

    def _req(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def reset(self):
        self._req("POST", "/__reset", {})

    def stats(self):
        return self._req("GET", "/__stats")

    def script(self, scenarios, model="*", replace=True):
        self._req("POST", "/__script", {"model": model, "scenarios": scenarios, "replace": replace})

    def concurrency(self):
        """{"inflight": N, "peak": N, "held": {name: N}}: API requests being served,
        the most at once since the last reset, and those waiting on each hold name."""
        return self._req("GET", "/__concurrency")

    def held(self, name):
        """How many calls wait on hold=<name> now: unlike "inflight", a call some
        earlier test left behind on this shared server does not count."""
        return self.concurrency()["held"].get(name, 0)

    def release(self, name):
        """Lets the calls held by the scenario knob hold=<name> answer."""
        self._req("POST", "/__release", {"name": name})

    def expected(self, prompt, tokens=16, **kw):
        q = {"prompt": prompt, "tokens": tokens}
        q.update(kw)
        return self._req("GET", "/__expected?" + urllib.parse.urlencode(q))

    def expected_text(self, prompt, tokens=16, **kw):
        e = self.expected(prompt, tokens, **kw)
        return e["text"] if isinstance(e, dict) else e


@pytest.fixture(scope="session")
def fake_llm_server():
    proc = subprocess.Popen([PY, os.path.join(ROOT, "scripts", "fake_llm.py"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.match(r"PORT (\d+)", line)
    assert m, "fake llm did not start: %r" % line
    server = FakeLLM(proc, int(m.group(1)))
    yield server
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def fake_llm(fake_llm_server):
    fake_llm_server.reset()
    return fake_llm_server


class SqsEmu:
    """The local SQS emulator of this test process (scripts/sqs_emu.js, local-aws-sqs
    behind the QueueUrl fix), with its request log.

    Queues live as long as the emulator (the whole session of one pytest
    process), so a test keeps to its own names: prefix() gives a fresh
    queue_name_prefix, which kombu also uses to list queues at start."""

    # wait_time_seconds 1: the emulator answers a long poll only when it is
    # full or timed out (sqs-broker.md section 12), so a task waits up to that.
    TRANSPORT_OPTIONS = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1}
    ACCOUNT = "123456789012"

    def __init__(self, proc, port, log_path):
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.endpoint = "http://127.0.0.1:%d" % port
        # Any key works: the emulator checks no signature.
        self.broker_url = "sqs://test:test@127.0.0.1:%d" % port

    def queue_url(self, sqs_name):
        return "%s/%s/%s" % (self.endpoint, self.ACCOUNT, sqs_name)

    @staticmethod
    def prefix():
        return "t%s-" % uuid.uuid4().hex[:8]

    def transport_options(self, **extra):
        opts = dict(self.TRANSPORT_OPTIONS)
        opts.update(extra)
        return opts

    def make_app(self, backend=None, name="it", prefix="", transport_options=None, **conf):
        """A Celery app (client side) on this emulator; `prefix` becomes
        queue_name_prefix, `transport_options` are added to the defaults."""
        app = Celery(name, broker=self.broker_url, backend=backend)
        opts = self.transport_options(**(transport_options or {}))
        if prefix:
            opts["queue_name_prefix"] = prefix
        app.conf.update(result_expires=3600, broker_connection_retry_on_startup=True,
                        broker_transport_options=opts, **conf)
        return app

    def client(self):
        """A boto3 SQS client on this emulator (Debian's botocore: query protocol)."""
        import boto3
        return boto3.client("sqs", region_name="us-east-1", endpoint_url=self.endpoint,
                            aws_access_key_id="test", aws_secret_access_key="test")

    def mark(self):
        """Where the request log ends now: requests(since=mark()) gives what came after."""
        with open(self.log_path, "rb") as f:
            return f.read().count(b"\n")  # whole lines only, as requests() reads them

    def requests(self, action=None, since=0):
        """The logged requests in the order they were answered (a long poll is
        logged when it returns; `t` is its arrival in ms), each a dict: t, ms, method, path,
        action, json (protocol), body (as received), params (the body decoded:
        a dict of the form's fields, or the JSON object), added_queue_url (set when
        the front added QueueUrl), status, response."""
        out = []
        with open(self.log_path) as f:
            for i, line in enumerate(f):
                if i < since or not line.endswith("\n"):
                    continue
                e = json.loads(line)
                if action is not None and e["action"] != action:
                    continue
                if e["json"]:
                    e["params"] = json.loads(e["body"] or "{}")
                else:
                    e["params"] = dict(urllib.parse.parse_qsl(e["body"], keep_blank_values=True))
                out.append(e)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdin.close()


@pytest.fixture(scope="session")
def sqs_emu(tmp_path_factory):
    """One SQS emulator per test process (per pytest-xdist worker), started the
    first time a test asks for it and stopped at the session's end; tests that
    do not ask pay nothing. Its files go under CELERIAC_IT_DIR when set, so
    that run-integration.sh's cleanup finds a process a dead worker left.
    SQS_EMU_FIX=0 in the environment runs it without its QueueUrl fix (the
    plain package, which a Debian Celery worker cannot consume from)."""
    script = os.path.join(ROOT, "scripts", "sqs_emu.js")
    if not os.path.exists(os.path.join(ROOT, "tests", "sqs-emu", "node_modules", "local-aws-sqs")):
        pytest.fail("local-aws-sqs missing: run scripts/install-deps.sh (make deps)")
    base = os.environ.get("CELERIAC_IT_DIR")
    if base:
        d = os.path.join(base, "sqs-emu-%s-%d" % (os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                                  os.getpid()))
        os.makedirs(d, exist_ok=True)
    else:
        d = str(tmp_path_factory.mktemp("sqs-emu"))
    log_path = os.path.join(d, "requests.jsonl")
    open(log_path, "w").close()
    # stdin stays open for the emulator's life: if this process dies, the
    # pipe closes and the emulator exits (--exit-with-stdin).
    err = open(os.path.join(d, "stderr.log"), "w")
    proc = subprocess.Popen(["node", script, "--port", "0", "--log", log_path, "--exit-with-stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        proc.wait()
        err.close()
        raise RuntimeError("the SQS emulator did not start: %r\n%s"
                           % (line, open(os.path.join(d, "stderr.log")).read()[-2000:]))
    emu = SqsEmu(proc, int(m.group(1)), log_path)
    try:
        yield emu
    finally:
        emu.stop()
        err.close()


class LineReader:
    """A child process whose output (stdout and stderr) is read line by line
    into self.lines; wait_for() returns the first match of a pattern."""

    what = "process"

    def read_lines(self, proc):
        self.lines = []
        self._cv = threading.Condition()
        self._eof = False
        self._drained = False
        self.proc = proc
        threading.Thread(target=self._pump_lines, daemon=True).start()

    def _pump_lines(self):
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._eof = True
            self._cv.notify_all()

    def _drain(self, timeout=5):
        """Once the process has exited, waits (bounded) until its last lines
        are read: the exit is seen before the reader thread reaches the end
        of the pipe, and a check of the log in between would miss them."""
        if self.proc is None or self.proc.poll() is None or getattr(self, "_drained", False):
            return
        deadline = time.time() + timeout
        with self._cv:
            while not getattr(self, "_eof", True) and time.time() < deadline:
                self._cv.wait(0.1)
            # once only: a pipe some child of the process keeps open never ends
            self._drained = True

    def wait_for(self, pattern, timeout=20):
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        with self._cv:
            while True:
                for l in self.lines:
                    m = rx.search(l)
                    if m:
                        return m
                if self.proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("%s: no %r:\n%s"
                                         % (self.what, pattern, "\n".join(self.lines)))
                self._cv.wait(0.1)

    def stop(self, timeout=30):
        """SIGTERM, then SIGKILL after timeout seconds; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Worker(LineReader):
    """One celeriac worker process, with its log captured line by line."""

    def __init__(self, args, env):
        self.args = args
        self.env = env
        self.lines = []
        self.proc = None
        self._cv = threading.Condition()

    def start(self, wait_ready=True, timeout=30):
        self.read_lines(subprocess.Popen([BIN, "worker", *self.args], env=self.env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace"))
        if wait_ready:
            self.wait_for(r" ready\.$", timeout)
        return self

    def log(self):
        self._drain()
        with self._cv:
            return "\n".join(self.lines)

    def wait_for(self, pattern, timeout=30, count=1):
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        with self._cv:
            while True:
                n = sum(1 for l in self.lines if rx.search(l))
                if n >= count:
                    return
                if self.proc.poll() is not None and not self._alive_reader():
                    raise AssertionError("worker exited (%s) before %r:\n%s"
                                         % (self.proc.returncode, pattern, "\n".join(self.lines[-40:])))
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError("timed out waiting for %r (%d/%d):\n%s"
                                         % (pattern, n, count, "\n".join(self.lines[-40:])))
                self._cv.wait(min(left, 0.2))

    def _alive_reader(self):
        # the process has exited: its last lines may still be in the pipe
        return not getattr(self, "_eof", True)

    def count(self, pattern):
        rx = re.compile(pattern)
        self._drain()
        with self._cv:
            return sum(1 for l in self.lines if rx.search(l))

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=60):
        rc = self.proc.wait(timeout=timeout)
        self._drain()
        return rc

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Env:
    """A test's world: a broker (a vhost, or a Redis db of its own), a Redis db
    for results, the fake LLM, workers and a client."""

    def __init__(self, services, fake_llm, transport="amqp", sqs=None):
        assert transport in BROKERS, transport
        assert (transport == "sqs") == (sqs is not None), "an SQS env needs the emulator"
        self.services = services
        self.fake = fake_llm
        self.transport = transport
        self.db = next_result_db()
        self.backend = services.redis_url(self.db)
        import redis
        self.redis = redis.Redis(host="127.0.0.1", port=services.redis_port, db=self.db)
        self.redis.flushdb()
        self.vhost = None  # RabbitMQ: the vhost's name; Redis: a RedisBrokerDb
        self.broker_db = None
        self.broker_redis = None
        self.sqs = sqs
        self.transport_options = None
        if transport == "sqs":
            self.sqs_prefix = sqs.prefix()
            self.transport_options = sqs.transport_options(queue_name_prefix=self.sqs_prefix)
            self.broker = sqs.broker_url
        elif transport == "amqp":
            self.vhost = services.new_vhost()
            self.broker = services.broker_url(self.vhost)
        else:
            self.broker_db = BROKER_DB_BASE + self.db
            self.vhost = RedisBrokerDb(self.broker_db)
            self.broker = services.redis_url(self.broker_db)
            self.broker_redis = redis.Redis(host="127.0.0.1", port=services.redis_port,
                                            db=self.broker_db)
            self.broker_redis.flushdb()
        self.workers = []
        self.app = self.make_app()

    def make_app(self, **conf):
        app = Celery("it", broker=self.broker, backend=self.backend)
        if self.transport_options is not None:
            conf.setdefault("broker_transport_options", self.transport_options)
        app.conf.update(result_expires=3600, broker_connection_retry_on_startup=True, **conf)
        return app

    def worker(self, *args, start=True, env=None, **kw):
        e = dict(os.environ)
        e["OPENAI_BASE_URL"] = self.fake.base + "/v1"
        e["OPENAI_API_KEY"] = "sk-test-secret-key"
        e.update(env or {})
        # -l info: the tests wait for INFO lines (the default level is WARNING);
        # a test's own --loglevel comes later and wins.
        full = ["-b", self.broker, "--result-backend", self.backend, "-n", "celeriac-%s@%%h" % uuid.uuid4().hex[:6],
                "-l", "info"]
        if self.transport_options is not None:
            full += ["--broker-transport-options", json.dumps(self.transport_options)]
        full += list(args)
        w = Worker(full, e)
        self.workers.append(w)
        if start:
            w.start(**kw)
        return w

    def queue_depth(self, queue="celery"):
        """Messages ready in a queue, over either broker (None: no such AMQP
        queue). On Redis: the sum of LLEN over kombu's four priority lists.
        On SQS: the messages neither in flight nor delayed (None: no such
        queue; the emulator counts in-flight ones in ApproximateNumberOfMessages)."""
        if self.sqs is not None:
            name = (self.sqs_prefix + queue).replace(".", "-") if not queue.endswith(
                ".fifo") else self.sqs_prefix + queue[:-5].replace(".", "-") + ".fifo"
            try:
                a = self.sqs.client().get_queue_attributes(
                    QueueUrl=self.sqs.queue_url(name),
                    AttributeNames=["ApproximateNumberOfMessages",
                                    "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
            except Exception:
                return None
            return int(a["ApproximateNumberOfMessages"]) - \
                int(a["ApproximateNumberOfMessagesNotVisible"])
        return self.services.queue_depth(self.vhost, queue)

    def unacked(self):
        """Redis broker only: the delivery tags in kombu's `unacked` hash."""
        return [k.decode() for k in self.broker_redis.hkeys("unacked")]

    def meta(self, task_id):
        raw = self.redis.get("celery-task-meta-" + task_id)
        return json.loads(raw) if raw else None

    def close(self):
        for w in self.workers:
            w.stop()
        try:
            self.app.close()
        except Exception:
            pass
        if self.transport == "amqp":
            self.services.drop_vhost(self.vhost)
        if self.broker_redis is not None:
            try:
                self.broker_redis.flushdb()
            except Exception:
                pass
        if self.sqs is not None:
            # the emulator keeps queues for its whole life: drop the test's own
            try:
                sqs = self.sqs.client()
                for url in sqs.list_queues(QueueNamePrefix=self.sqs_prefix).get("QueueUrls", []):
                    sqs.delete_queue(QueueUrl=url)
            except Exception:
                pass


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line("markers", "brokers(*names): run the test once over each broker "
                            "named (amqp, redis, sqs); unmarked tests run over amqp only")
    config.addinivalue_line("markers", "slow: takes 15 s or more on its own "
                            "(make test runs them; -m 'not slow' leaves them out)")


_exit_status = [0]


def pytest_sessionfinish(session, exitstatus):
    _exit_status[0] = int(exitstatus)


def pytest_unconfigure(config):
    """Leave without the interpreter's teardown: by then pytest has printed its summary,
    and Celery's AsyncResult.__del__ against closed Sentinel pools only prints noise that
    would push that summary out of CI's tail."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status[0])


def pytest_collection_modifyitems(session, config, items):
    """Under pytest-xdist (--dist loadgroup: tests handed out one by one in
    collection order, a file marked xdist_group as one unit), the heaviest first,
    so that a long test or group does not start last and keep one worker busy
    after the others are done. A test weighs one, fifteen when marked slow; a
    group weighs the sum of its tests and keeps its order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    def unit(it):
        if os.environ.get("CELERIAC_IT_DIST") == "loadfile":
            return it.nodeid.split("::", 1)[0]
        m = it.get_closest_marker("xdist_group")
        return ("group", m.args[0] if m and m.args else m.kwargs.get("name")) if m else it.nodeid

    weight = {}
    for it in items:
        u = unit(it)
        weight[u] = weight.get(u, 0) + (15 if it.get_closest_marker("slow") else 1)
    items.sort(key=lambda it: -weight[unit(it)])


def pytest_generate_tests(metafunc):
    """`@pytest.mark.brokers("amqp", "redis", "sqs")` parametrizes the env fixture;
    a bare `@pytest.mark.brokers` means amqp and redis (SQS is picked by name: its
    runs cost a second per long poll on the emulator, see SqsEmu)."""
    m = metafunc.definition.get_closest_marker("brokers")
    if m is None or "env" not in metafunc.fixturenames:
        return
    names = m.args or ("amqp", "redis")
    for n in names:
        assert n in BROKERS, "unknown broker %r in @pytest.mark.brokers" % n
    metafunc.parametrize("env", list(names), indirect=True, ids=list(names))


@pytest.fixture
def env(request, services, fake_llm):
    transport = getattr(request, "param", "amqp")
    sqs = request.getfixturevalue("sqs_emu") if transport == "sqs" else None
    e = Env(services, fake_llm, transport, sqs)
    yield e
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        # The worker's own words are the fastest way to see why.
        for i, w in enumerate(e.workers):
            print("\n----- worker %d log (last 60 lines) -----" % i)
            print("\n".join(w.lines[-60:]))
    e.close()


def amqp_unacked(env, queue="celery"):
    """Deliveries of an AMQP queue the broker counts as unacked (None: no
    such queue)."""
    out = env.services.ctl("list_queues", "-p", env.vhost, "name",
                           "messages_unacknowledged").stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue:
            return int(parts[1])
    return None


def wait_until(pred, timeout=30, interval=0.05, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError("timed out waiting for " + what)


def wait_progress(count, total, stall=15, cap=120, interval=0.2, what="condition"):
    """Waits until count() reaches total, for as long as it keeps growing: fails
    when it has not grown for `stall` seconds, or after `cap` seconds in all.
    For work whose length depends on the machine's load (a loaded CI host can
    take twice as long as an idle one), where one fixed bound either fails
    while work is still moving or waits long after it stopped. Returns the
    last count."""
    start = last_change = time.time()
    best = count()
    while best < total:
        now = time.time()
        if now - last_change > stall or now - start > cap:
            raise AssertionError("timed out waiting for %s: %d of %d after %.0f s, "
                                 "none more in the last %.0f s"
                                 % (what, best, total, now - start, now - last_change))
        time.sleep(interval)
        n = count()
        if n > best:
            best, last_change = n, time.time()
    return best


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p
