#!/usr/bin/python3
"""run.py -- runs every workload of `make bench` on celeriac and on Python Celery, in one run.

    /usr/bin/python3 bench/run.py SERVICES_DIR OUT_DIR     (scripts/bench.sh calls this)

Needs the services of scripts/services.sh running (SERVICES_DIR/env), build/celeriac
and build/bench/*. Starts its own fast fake LLM server (build/bench/fake_fast).
Writes OUT_DIR/results.json, OUT_DIR/table.md and the chart's data files, and
prints the table. BENCH_QUICK=1 shrinks every workload so that a run checks
the harness in under three minutes. Every load loop is bounded in count and
time; every process started here is stopped here.
"""
import gc
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "celeriac")
TOOLS = os.path.join(ROOT, "build", "bench")
PY = "/usr/bin/python3"
QUICK = os.environ.get("BENCH_QUICK", "0") not in ("", "0")
HZ = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

# Workload sizes: (full, quick).
N_DISPATCH = int(os.environ.get("BENCH_N_DISPATCH", 3000 if QUICK else 20000))
N_CONC = int(os.environ.get("BENCH_N_CONC", 2000 if QUICK else 10000))
CONC_LEVELS = [int(x) for x in os.environ.get("BENCH_CONC_LEVELS", "1000" if QUICK else "1000,5000,10000").split(",")]
MEM_LEVELS = [1000] if QUICK else [1000, 5000, 10000]
PY_BOUND_S = 8 if QUICK else 45         # a Python dispatch run stops after this
PY_CONC_BOUND_S = 15 if QUICK else 120  # the Python concurrency run
# celeriac dispatch and limit runs; the top concurrency level and Python gevent
REPEAT = int(os.environ.get("BENCH_REPEAT", 1 if QUICK else 3))
LAT_N = 100 if QUICK else 1000  # p99 is then the 10th worst call, not the 4th
IMPLS = os.environ.get("BENCH_IMPL", "celeriac,python").split(",")
# celeriac with --progress off as well, to price live progress apart from the core
VARIANTS = os.environ.get("BENCH_VARIANTS", "1") != "0"
DISPATCH_C = int(os.environ.get("BENCH_DISPATCH_C", "100"))
# The concurrency workload: 1.0 s per request at the server. Headers and the
# role chunk at once, first token at 380 ms, then 50 tokens/s: the 32nd token
# leaves at 380 + 31 * 20 = 1000 ms.
LLM_1S = "fake/ttft_ms=380,tps=50,tokens=32"
LLM_1S_S = 1.0
LLM_ZERO = "fake/tokens=16"
MEM_HOLD_MS = 3000 if QUICK else 12000  # longer than the ramp to 10,000 streams
# The canvas workload (issue 16): chord headers and group members, chain length,
# map items on both sides (Python runs them one after another: 20 x 200 ms), a
# bigger map on celeriac alone, the fake LLM's delay for map items, and the
# accumulate tasks of the pool probe (only when the dispatch rows are missing).
CANVAS_N = int(os.environ.get("BENCH_CANVAS_N", 200 if QUICK else 1000))
CANVAS_CHAIN = int(os.environ.get("BENCH_CANVAS_CHAIN", 50))
CANVAS_MAP = int(os.environ.get("BENCH_CANVAS_MAP", 20))
CANVAS_MAP_BIG = 200 if QUICK else 1000
CANVAS_LLM_MS = 200
CANVAS_PROBE_N = 500 if QUICK else 2000
CANVAS_TIMEOUT_S = 60  # one case on one worker; a case that runs out fails, the rest go on
PY_POOLS = (("prefork", 2), ("solo", 1), ("threads", 8), ("gevent", 100))  # as in dispatch()
# The Redis broker (issue 15): its own db on the same Redis as the results
# (db 1), flushed before every run; kombu's priority-list separator.
REDIS_BROKER_DB = 2
KOMBU_SEP = "\x06\x16"
# The TLS row (issue 18): the cap on the worker's connections to the nginx front.
# With HTTP/2 at 1,000 streams per connection, 10,000 calls need ten.
TLS_MAX_CONN = os.environ.get("BENCH_TLS_MAX_CONN", "16")
# The SQS section (issue 33), on a local emulator (scripts/sqs_emu.js) of its
# own: the dispatch tasks, the one-second LLM tasks and the concurrency they
# run at, the bound of a Python dispatch run, and the long poll's wait. The
# emulator answers a long poll only once it holds MaxNumberOfMessages or the
# wait is over (sqs-broker.md section 12), so 1 s, the tests' value, on both
# sides: the queue's last few tasks may wait that long.
SQS_N = int(os.environ.get("BENCH_SQS_N", 500 if QUICK else 2000))
SQS_N_CONC = int(os.environ.get("BENCH_SQS_N_CONC", 500 if QUICK else 2000))
SQS_C = int(os.environ.get("BENCH_SQS_C", 500 if QUICK else 1000))
SQS_PY_BOUND_S = 15 if QUICK else 40
SQS_WAIT_S = 1
SQS_OPTIONS = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": SQS_WAIT_S}
# The RQ section (issue 34): RQ's own db on the same Redis, the one-second LLM
# jobs celeriac runs at RQ_C, and the fewer jobs RQ's own workers get (one job
# at a time per worker process: RQ_PY_N jobs over RQ_PY_WORKERS processes take
# RQ_PY_N / RQ_PY_WORKERS seconds at best).
RQ_DB = 3
RQ_N = int(os.environ.get("BENCH_RQ_N", 500 if QUICK else 2000))
RQ_C = int(os.environ.get("BENCH_RQ_C", 500 if QUICK else 1000))
RQ_PY_N = int(os.environ.get("BENCH_RQ_PY_N", 50 if QUICK else 200))
RQ_PY_WORKERS = int(os.environ.get("BENCH_RQ_PY_WORKERS", 10))
RQ_BOUND_S = 60 if QUICK else 180
# Section 13 (issue 38): three workers against one provider limit.
FLEET_N = int(os.environ.get("BENCH_FLEET_N", 200 if QUICK else 1000))
FLEET_RPM = int(os.environ.get("BENCH_FLEET_RPM", 1200))
FLEET_WORKERS = 3
FLEET_C = 20  # per worker; a call takes about 50 ms, 20 a second need one or two
FLEET_BOUND_S = 45 if QUICK else 150

started = []  # every Popen we own, stopped in cleanup()


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- /proc

def proc_children():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(pid):
    kids, out, todo = proc_children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def cpu_s(pids):
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / HZ


def machine_busy_s():
    """CPU seconds spent by every process on the machine so far (all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return (sum(v[:8]) - v[3] - v[4]) / HZ


def wait_quiet(limit=0.05, window=0.5, bound_s=20):
    """Waits until the whole machine was under `limit` busy (a fraction of all
    cores) over `window` seconds, or `bound_s` passed: what the services do
    after a heavy workload (RabbitMQ and Redis freeing 10,000 queues' worth
    of messages and keys) is not the low load the latency workload asks for.
    Returns the last window's busy fraction."""
    cores = os.cpu_count() or 1
    deadline = time.time() + bound_s
    while True:
        b0, t0 = machine_busy_s(), time.time()
        time.sleep(window)
        busy = (machine_busy_s() - b0) / ((time.time() - t0) * cores)
        if busy < limit or time.time() > deadline:
            return busy


def children_cpu_s():
    """CPU seconds of the tools run and waited for so far."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def status_kb(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pids):
    return sum(status_kb(p, "VmRSS") for p in pids)


# ----------------------------------------------------------------- services

def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.strip().split("=", 1)
                env[k] = v
    return env


class Redis:
    """A tiny RESP client: enough for SELECT, FLUSHDB, DBSIZE and pipelined LPUSH."""

    def __init__(self, port, db):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")
        self.cmd("SELECT", str(db))

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def pipeline(self, cmds):
        """Sends every command at once, then reads the replies; returns them."""
        self.s.sendall(b"".join(self.encode(c) for c in cmds))
        return [self.reply() for _ in cmds]

    def cmd(self, *args):
        self.s.sendall(self.encode(args))
        return self.reply()

    def reply(self):
        line = self.f.readline()
        if line[:1] == b"-":
            raise RuntimeError(line.decode().strip())
        if line[:1] == b":":
            return int(line[1:])
        if line[:1] == b"$":
            n = int(line[1:])
            return None if n < 0 else self.f.read(n + 2)[:-2]
        return line[1:].strip()


class ResultCounter:
    """Counts final results (SUCCESS or FAILURE) as they are stored.

    Celery's Redis backend and celeriac both PUBLISH every stored state on a
    channel named like its key, right after the SET, so a pattern subscriber
    sees each result land without scanning keys. DBSIZE would also count the
    worker's other keys (celeriac's progress streams), and a plain message
    count would also count PROGRESS states, hence the status markers."""

    OK = b'"status": "SUCCESS"'
    FAIL = b'"status": "FAILURE"'

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.sendall(b"*2\r\n$10\r\nPSUBSCRIBE\r\n$18\r\ncelery-task-meta-*\r\n")
        self.ok = self.failed = 0
        self.s.settimeout(5)
        got = b""
        while b"psubscribe" not in got:
            got += self.s.recv(4096)
        self.tail = b""
        self.s.settimeout(0.02)

    def poll(self):
        try:
            data = self.s.recv(1 << 20)
        except socket.timeout:
            return self.ok + self.failed
        if not data:
            raise RuntimeError("redis closed the subscription")
        buf = self.tail + data
        self.ok += buf.count(self.OK)
        self.failed += buf.count(self.FAIL)
        # Neither marker overlaps itself or the other, so a carried tail one
        # byte shorter than a marker never makes one count twice.
        self.tail = buf[-(len(self.OK) - 1):]
        return self.ok + self.failed

    def close(self):
        self.s.close()


class Proc:
    """A started process whose output lines are watched for a ready marker."""

    def __init__(self, name, cmd, env=None, cwd=None, ready=None):
        self.name = name
        self.lines = []
        self.ready_at = None
        self._ready_rx = re.compile(ready) if ready else None
        self._ev = threading.Event()
        self.p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace",
                                  start_new_session=True)
        started.append(self.p)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            if self._ready_rx and self.ready_at is None and self._ready_rx.search(line):
                self.ready_at = time.time()
                self._ev.set()
            if len(self.lines) < 2000:
                self.lines.append(line.rstrip())
        self._ev.set()

    def wait_ready(self, timeout=90):
        self._ev.wait(timeout)
        if self.ready_at is None:
            raise RuntimeError("%s not ready:\n%s" % (self.name, "\n".join(self.lines[-30:])))
        return self.ready_at

    def stop(self, grace=5.0):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(10)
        # Kill leftovers of the group (prefork children) as well.
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cleanup():
    for p in started:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


class Bench:
    def __init__(self, svc_dir, out_dir):
        env = read_env(os.path.join(svc_dir, "env"))
        self.amqp_port = int(env["AMQP_PORT"])
        self.redis_port = int(env["REDIS_PORT"])
        self.broker = "amqp://guest:guest@127.0.0.1:%d//" % self.amqp_port
        self.db = 1
        self.backend = "redis://127.0.0.1:%d/%d" % (self.redis_port, self.db)
        self.redis = Redis(self.redis_port, self.db)
        # The Redis broker's db (section 8); results stay in self.db.
        self.redis_broker = "redis://127.0.0.1:%d/%d" % (self.redis_port, REDIS_BROKER_DB)
        self.bredis = Redis(self.redis_port, REDIS_BROKER_DB)
        # The services' own CPU, to show which process limits a run.
        self.svc_pids = {}
        for name, path in (("rabbitmq", "rabbit/pid"), ("redis", "redis.pid")):
            try:
                with open(os.path.join(svc_dir, path)) as f:
                    self.svc_pids[name] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        self.out = out_dir
        self.runs = 0
        self.results = {"quick": QUICK}
        self.fake = Proc("fake_fast", [os.path.join(TOOLS, "fake_fast")], ready=r"^PORT \d+")
        self.fake.wait_ready(10)
        self.fake_port = int(self.fake.lines[0].split()[1])
        self.llm_base = "http://127.0.0.1:%d/v1" % self.fake_port

    # ------------------------------------------------------------ helpers

    def fake_stats(self, reset=False):
        req = urllib.request.Request(
            "http://127.0.0.1:%d/%s" % (self.fake_port, "__reset" if reset else "__stats"),
            data=b"{}" if reset else None, method="POST" if reset else "GET")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def tool(self, *args, timeout=180):
        r = subprocess.run([os.path.join(TOOLS, args[0])] + [str(a) for a in args[1:]],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode:
            raise RuntimeError("%s failed: %s" % (args[0], r.stderr.strip()))
        return r.stdout.strip()

    def publish(self, queue, n, task, args, kwargs):
        out = self.tool("publish", self.amqp_port, queue, n, task, json.dumps(args),
                        json.dumps(kwargs))
        m = re.search(r"\(([\d.]+) msg/s\)", out)
        return float(m.group(1))

    def redis_publish(self, queue, n, task, args, kwargs):
        """Pre-publishes n tasks on the Redis broker as a Celery 5 producer does
        through kombu's Redis transport (reference/redis-broker.md §3): the
        queue's binding (SADD), then LPUSH of one JSON envelope per task, its
        body base64, a fresh task id and delivery tag each. Pipelined in
        batches; returns messages/s."""
        import base64
        import uuid
        body = base64.b64encode(json.dumps(
            [args, kwargs, {"callbacks": None, "errbacks": None, "chain": None,
                            "chord": None}]).encode()).decode()
        origin = "%d@bench" % os.getpid()
        base = self.bredis.cmd("LLEN", queue)
        t0 = time.perf_counter()
        cmds = [("SADD", "_kombu.binding." + queue, queue + KOMBU_SEP + KOMBU_SEP + queue)]
        batch = []
        for _ in range(n):
            tid = str(uuid.uuid4())
            batch.append(json.dumps({
                "body": body, "content-encoding": "utf-8", "content-type": "application/json",
                "headers": {"lang": "py", "task": task, "id": tid, "shadow": None, "eta": None,
                            "expires": None, "group": None, "group_index": None,
                            "retries": 0, "timelimit": [None, None], "root_id": tid,
                            "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}",
                            "origin": origin, "ignore_result": False},
                "properties": {"correlation_id": tid, "reply_to": "bench-reply",
                               "delivery_mode": 2,
                               "delivery_info": {"exchange": "", "routing_key": queue},
                               "priority": 0, "body_encoding": "base64",
                               "delivery_tag": str(uuid.uuid4())}}))
            if len(batch) == 500:
                cmds.append(("LPUSH", queue) + tuple(batch))
                batch = []
        if batch:
            cmds.append(("LPUSH", queue) + tuple(batch))
        for i in range(0, len(cmds), 20):
            self.bredis.pipeline(cmds[i:i + 20])
        depth = self.bredis.cmd("LLEN", queue)
        if depth != base + n:
            raise RuntimeError("redis publish: %s holds %s, not %d + %d" % (queue, depth, base, n))
        return n / (time.perf_counter() - t0)

    def new_queue(self):
        self.runs += 1
        return "bench%d" % self.runs

    def celeriac(self, queue, c, extra=(), llm_base=None, broker=None, options=None,
                 env_extra=None):
        env = dict(os.environ, OPENAI_BASE_URL=llm_base or self.llm_base, **(env_extra or {}))
        wrap = os.environ.get("BENCH_CELERIAC_WRAP", "").split()  # e.g. perf record -g --
        cmd = wrap + [BIN, "worker", "-b", broker or self.broker, "--result-backend", self.backend,
               "-c", str(c), "-Q", queue, "-l", "warning", "-n", "celeriac@bench"] + list(extra)
        if options:
            cmd += ["--broker-transport-options", json.dumps(options)]
        return Proc("celeriac", cmd, env=env, ready=r" ready\.$")

    def python(self, queue, pool, c, llm_base=None, broker=None, options=None):
        """Python Celery with its defaults, except the prefetch window of solo
        and threads: with Celery's default (4 x c) both stall on this stack
        (Celery 5.2.6, kombu 5.2.4, Python 3.11) after a few hundred tasks,
        consuming nothing more, so they get a 1,000-message window."""
        env = dict(os.environ, BENCH_BROKER=broker or self.broker, BENCH_BACKEND=self.backend,
                   OPENAI_BASE_URL=llm_base or self.llm_base, PYTHONWARNINGS="ignore")
        if options:
            env["BENCH_TRANSPORT_OPTIONS"] = json.dumps(options)
        cmd = [PY, "-m", "celery", "-A", "pyapp", "worker", "-P", pool, "-c", str(c),
               "-Q", queue, "-l", "warning", "--without-gossip", "--without-mingle",
               "--without-heartbeat", "-n", "py@bench"]
        if pool in ("solo", "threads"):
            cmd += ["--prefetch-multiplier", str(max(1, 1000 // c))]
        return Proc("python-" + pool, cmd, env=env, cwd=os.path.join(ROOT, "bench"),
                    ready=r"BENCH-READY")

    def run_tasks(self, impl, pool, c, task, args, kwargs, n, bound_s, hold_for=None,
                  extra=(), quiet=False, broker="amqp", llm_base=None, env_extra=None):
        """Pre-publishes n tasks, starts a worker, times ready -> n results stored.

        Samples the worker's RSS and CPU and the fake's CPU every 100 ms. With
        hold_for, also records the worker's RSS once the fake has that many
        streams open at once. With quiet, waits for an idle machine first.
        broker="redis": the tasks go through the Redis broker's db instead,
        flushed before the publish and after the run; broker="sqs": through
        a queue of the SQS emulator (sqs_section), deleted after the run."""
        if impl not in IMPLS:
            return None
        queue = self.new_queue()
        if broker == "redis":
            self.bredis.cmd("FLUSHDB")
            pub_rate = self.redis_publish(queue, n, task, args, kwargs)
        elif broker == "sqs":
            pub_rate = self.sqs_publish(queue, n, task, args, kwargs)
        else:
            pub_rate = self.publish(queue, n, task, args, kwargs)
        self.redis.cmd("FLUSHDB")
        self.fake_stats(reset=True)
        # The concurrency runs use the whole machine: they start once the
        # publishing and the previous run's clean-up (RabbitMQ deleting a
        # queue, Redis expiring keys) are over, or they vary by +-10%.
        busy_before = wait_quiet() if quiet else None
        counter = ResultCounter(self.redis_port)
        url = {"redis": self.redis_broker, "sqs": getattr(self, "sqs_url", None)}.get(broker)
        opts = SQS_OPTIONS if broker == "sqs" else None
        w = (self.celeriac(queue, c, extra, broker=url, llm_base=llm_base, options=opts,
                           env_extra=env_extra)
             if impl == "celeriac" else self.python(queue, pool, c, broker=url, options=opts))
        rec = {"impl": impl, "pool": pool, "c": c, "task": task, "n": n,
               "model": kwargs.get("model"), "publish_rate": round(pub_rate),
               "variant": " ".join(extra)}
        if broker != "amqp":
            rec["broker"] = broker
        if busy_before is not None:
            rec["busy_before"] = round(busy_before, 3)
        try:
            t0 = w.wait_ready()
            pids = tree(w.p.pid)
            cpu0, fcpu0 = cpu_s(pids), cpu_s([self.fake.p.pid])
            scpu0 = {k: cpu_s([v]) for k, v in self.svc_pids.items()}
            mcpu0, hcpu0 = machine_busy_s(), cpu_s([os.getpid()])
            peak_rss, held_rss, done, last_sample = 0, None, 0, 0.0
            timeline = []
            while True:
                now = time.time()
                done = counter.poll()
                if done >= n or now - t0 > bound_s or w.p.poll() is not None:
                    break
                if now - last_sample > 0.1:
                    last_sample = now
                    if impl == "python" and pool == "prefork":
                        pids = tree(w.p.pid)
                    rss = rss_kb(pids)
                    peak_rss = max(peak_rss, rss)
                    fs = self.fake_stats()
                    # time, results, streams open at the server, worker CPU, RSS
                    timeline.append((round(now - t0, 2), done, fs["open"],
                                     round(cpu_s(pids) - cpu0, 2), rss))
                    if hold_for and held_rss is None and fs["open"] >= hold_for:
                        time.sleep(0.3)
                        held_rss = rss_kb(pids)
            t_end = time.time()
            rec["cpu_s"] = round(cpu_s(pids) - cpu0, 3)
            rec["fake_cpu_s"] = round(cpu_s([self.fake.p.pid]) - fcpu0, 3)
            for k, v in self.svc_pids.items():
                rec[k + "_cpu_s"] = round(cpu_s([v]) - scpu0[k], 3)
            # Whatever else ran meanwhile (other users of the machine): the
            # noise indicator of this run.
            rec["harness_cpu_s"] = round(cpu_s([os.getpid()]) - hcpu0, 3)
            # Every process on every core: a run cannot take less wall time
            # than this over the number of cores.
            rec["machine_cpu_s"] = round(machine_busy_s() - mcpu0, 3)
            rec["other_cpu_s"] = round(rec["machine_cpu_s"] - rec["cpu_s"] - rec["fake_cpu_s"]
                                       - rec["harness_cpu_s"] - sum(
                                           rec.get(k + "_cpu_s", 0) for k in self.svc_pids), 3)
            rec["hwm_kb"] = status_kb(w.p.pid, "VmHWM") if impl == "celeriac" else None
            rec["peak_rss_kb"] = max(peak_rss, rss_kb(pids))
            rec["held_rss_kb"] = held_rss
            fs = self.fake_stats()
            rec["fake_max_open"] = fs["max_open"]
            rec["fake_tokens"] = fs["tokens"]
            rec["fake_accepted"] = fs.get("accepted")
            rec["timeline"] = timeline
        finally:
            w.stop()
            counter.close()
        rec["done"] = done
        rec["failed"] = counter.failed
        rec["wall_s"] = round(t_end - t0, 3)
        rec["rate"] = round(done / (t_end - t0), 1)
        rec["fake_util"] = round(rec["fake_cpu_s"] / (t_end - t0), 3)
        rec["complete"] = done >= n
        if w.p.returncode not in (0, -9, -15, None) and impl == "celeriac":
            rec["exit"] = w.p.returncode
        if impl == "celeriac" and not rec["complete"]:
            log("  celeriac stopped early (exit %s); its output ends:\n    %s" % (
                w.p.returncode, "\n    ".join(w.lines[-40:])))
        if broker == "redis":
            self.bredis.cmd("FLUSHDB")
        elif broker == "sqs":
            self.sqs.delete_queue(QueueUrl=self.sqs_queue_url(queue))
        else:
            self.tool("publish", self.amqp_port, queue, "purge")
        busy = lambda k: 100 * rec.get(k, 0) / rec["wall_s"]
        log("  %-8s %-8s c=%-6d %-18s %6d/%-6d in %7.2f s: %9.1f tasks/s  rss %6.1f MB  "
            "cpu%%: worker %3.0f rabbit %3.0f redis %3.0f fake %3.0f others %3.0f%s" % (
                impl if broker == "amqp" else impl + "/" + broker, pool, c, task, done, n, rec["wall_s"], rec["rate"],
                rec["peak_rss_kb"] / 1024, busy("cpu_s"), busy("rabbitmq_cpu_s"),
                busy("redis_cpu_s"), busy("fake_cpu_s"), busy("other_cpu_s"),
                " sqs-emu %3.0f" % busy("sqs_cpu_s") if "sqs_cpu_s" in rec else ""))
        return rec

    # ---------------------------------------------------------- workloads

    def limits(self):
        log("5. limits: bare consume-and-ack, bare SETEX+PUBLISH")
        prefetch = DISPATCH_C * 4
        res = {"prefetch": prefetch, "ack_each": [], "ack_multiple": [], "redis": [],
               "redis_eval": [], "redis_evalsha": [], "others_pct": []}
        rabbit = self.svc_pids.get("rabbitmq")
        for _ in range(REPEAT):
            for key, every in (("ack_each", 1), ("ack_multiple", 50)):
                q = self.new_queue()
                self.publish(q, N_DISPATCH, "celery.accumulate", [1], {})
                m0, r0, t0 = machine_busy_s(), cpu_s([rabbit]) if rabbit else 0, time.time()
                k0 = children_cpu_s() + cpu_s([os.getpid()])
                out = self.tool("consume_ack", self.amqp_port, q, N_DISPATCH, prefetch, every)
                wall = time.time() - t0
                rab = (cpu_s([rabbit]) if rabbit else 0) - r0
                mine = children_cpu_s() + cpu_s([os.getpid()]) - k0
                others = max(0.0, machine_busy_s() - m0 - rab - mine)
                res["others_pct"].append(round(100 * others / wall))
                res[key].append(float(re.search(r"\(([\d.]+) msg/s\)", out).group(1)))
                if key == "ack_each":
                    res.setdefault("rabbit_pct", []).append(round(100 * rab / wall))
                self.tool("publish", self.amqp_port, q, "purge")
            for key, extra in (("redis", []), ("redis_eval", [200, "eval"]),
                               ("redis_evalsha", [200, "evalsha"])):
                out = self.tool("redis_limit", self.redis_port, self.db, N_DISPATCH, prefetch,
                                *(extra or [200]))
                res[key].append(float(re.search(r"\(([\d.]+) results/s\)", out).group(1)))
        for k in ("ack_each", "ack_multiple", "redis", "redis_eval", "redis_evalsha"):
            log("  %-13s %s" % (k, " ".join("%.0f" % v for v in res[k])))
        log("  RabbitMQ busy during ack_each: %s%%; other processes: %s%%" % (
            res.get("rabbit_pct"), res["others_pct"]))
        self.results["limits"] = res

    def dispatch(self):
        log("1. dispatch: %d pre-published tasks, ready -> last result stored" % N_DISPATCH)
        out = {}
        for label, task, args, kwargs in (
                ("accumulate", "celery.accumulate", [1], {}),
                ("llm_zero", "llm.generate", ["bench"], {"model": LLM_ZERO})):
            rows = []
            for _ in range(REPEAT):
                rows.append(self.run_tasks("celeriac", "libuv", DISPATCH_C, task, args, kwargs,
                                           N_DISPATCH, 120))
            for pool, c in (("prefork", 2), ("solo", 1), ("threads", 8), ("gevent", 100)):
                rows.append(self.run_tasks("python", pool, c, task, args, kwargs, N_DISPATCH,
                                           PY_BOUND_S))
            out[label] = [r for r in rows if r]
        self.results["dispatch"] = out

    def concurrency(self):
        log("2. concurrency: %d LLM tasks, 1 s each at the server (%s)" % (N_CONC, LLM_1S))
        rows = []
        top = max(CONC_LEVELS)
        # The highest level and Python gevent run REPEAT times, alternating,
        # and the ratio is taken between their medians: one run of each moved
        # the ratio by +-10% (18.9x to 21.4x) on an unchanged build.
        for rep in range(REPEAT):
            for c in CONC_LEVELS if rep == 0 else [top]:
                rows.append(self.run_tasks("celeriac", "libuv", c, "llm.generate", ["bench"],
                                           {"model": LLM_1S}, N_CONC, 300, quiet=True))
            # The same at the highest level without live progress
            # (--progress off), to price that feature apart from the core.
            if VARIANTS:
                rows.append(self.run_tasks("celeriac", "libuv", top, "llm.generate",
                                           ["bench"], {"model": LLM_1S}, N_CONC, 300,
                                           extra=("--progress", "off"), quiet=True))
            rows.append(self.run_tasks("python", "gevent", 1000, "llm.generate", ["bench"],
                                       {"model": LLM_1S}, N_CONC, PY_CONC_BOUND_S, quiet=True))
        rows = [r for r in rows if r]
        for r in rows:
            r["ideal_s"] = N_CONC * LLM_1S_S / r["c"]
        self.results["concurrency"] = rows

    def memory(self):
        log("3. memory: peak RSS with N streams in flight (held %d ms)" % MEM_HOLD_MS)
        q = self.new_queue()
        w = self.celeriac(q, max(MEM_LEVELS))
        try:
            w.wait_ready()
            time.sleep(1.0)
            idle = status_kb(w.p.pid, "VmRSS")
        finally:
            w.stop()
        rows = []
        model = "fake/ttft_ms=%d,tokens=32,tps=0" % MEM_HOLD_MS
        for c, extra in [(c, ()) for c in MEM_LEVELS] + VARIANTS * [(max(MEM_LEVELS),
                                                                     ("--progress", "off"))]:
            r = self.run_tasks("celeriac", "libuv", c, "llm.generate", ["bench"],
                               {"model": model}, c, 120, hold_for=c, extra=extra)
            r["idle_kb"] = idle
            r["per_stream_b"] = round((r["hwm_kb"] - idle) * 1024 / c)
            r["held_per_stream_b"] = round(((r["held_rss_kb"] or 0) - idle) * 1024 / c)
            rows.append(r)
        floor = []
        # libcurl's default buffer, then 1 KB as the worker sets it.
        for n, buf in ((3000, 0), (3000, 4096), (3000, 1024), (max(MEM_LEVELS), 1024)):
            out = self.tool("idle_streams", "%s/chat/completions" % self.llm_base, n, 4, buf)
            f = dict(zip(out.split()[::2], (int(x) for x in out.split()[1::2])))
            f["buffersize"] = buf
            floor.append(f)
            log("  bare libcurl: %d streams (%d open), buffersize %s: %d B per stream" % (
                n, f["open"], buf or "default", f["per_stream_bytes"]))
        self.results["memory"] = {"idle_kb": idle, "runs": rows, "floor": floor}
        log("  celeriac idle: %.1f MB" % (idle / 1024))

    def latency(self):
        log("4. latency: %d sequential apply_async -> get() round trips" % LAT_N)
        from celery import Celery
        res = []
        for impl, pool, c in (("floor", "null_worker", 1), ("celeriac", "libuv", 10),
                              ("python", "solo", 1), ("python", "prefork", 2),
                              ("python", "gevent", 100)):
            if impl not in IMPLS and impl != "floor":
                continue
            queue = self.new_queue()
            self.redis.cmd("FLUSHDB")
            if impl == "floor":
                w = Proc("null_worker", [os.path.join(TOOLS, "null_worker"), str(self.amqp_port),
                                         queue, str(self.redis_port), str(self.db), "120"],
                         ready=r"ready\.$")
            elif impl == "celeriac":
                w = self.celeriac(queue, c)
            else:
                w = self.python(queue, pool, c)
            app = Celery("lat", broker=self.broker, backend=self.backend)
            app.conf.update(result_expires=3600)
            try:
                w.wait_ready()
                quiet = wait_quiet()
                times = []
                # The client's garbage collector paused every implementation,
                # the floor included, for 5-7 ms about once a hundred calls:
                # that was the p99 of all of them. It is not the worker's.
                gc.collect()
                gc.disable()
                for i in range(LAT_N + 20):
                    t = time.perf_counter()
                    r = app.send_task("celery.accumulate", args=(i,), queue=queue)
                    r.get(timeout=10)
                    if i >= 20:
                        times.append((time.perf_counter() - t) * 1000)
                    r.forget()
            finally:
                gc.enable()
                w.stop()
                app.close()
            times.sort()
            rec = {"impl": impl, "pool": pool, "n": len(times), "busy_before": round(quiet, 3),
                   "p50_ms": round(statistics.median(times), 3),
                   "p90_ms": round(times[int(0.90 * len(times)) - 1], 3),
                   "p99_ms": round(times[int(0.99 * len(times)) - 1], 3),
                   "max_ms": round(times[-1], 3)}
            log("  %-8s %-8s p50 %.2f ms  p99 %.2f ms  max %.2f ms" % (
                impl, pool, rec["p50_ms"], rec["p99_ms"], rec["max_ms"]))
            res.append(rec)
            self.tool("publish", self.amqp_port, queue, "purge")
        self.results["latency"] = res

    def cpu_per_token(self):
        log("6. CPU per streamed token (marginal: 256 tokens against 1)")
        out = []
        for impl, pool, c, n, extra in (
                ("celeriac", "libuv", 1000, 1000 if QUICK else 4000, ()),
                ("celeriac", "libuv", 1000, 1000 if QUICK else 4000, ("--progress", "off")),
                ("python", "gevent", 100, 200 if QUICK else 500, ())):
            if impl not in IMPLS or (extra and not VARIANTS):
                continue
            runs = {}
            for tok in (1, 257):
                runs[tok] = self.run_tasks(impl, pool, c, "llm.generate", ["bench"],
                                           {"model": "fake/tokens=%d" % tok}, n, 120,
                                           extra=extra)
            a, b = runs[1], runs[257]
            if a["complete"] and b["complete"]:
                per = (b["cpu_s"] - a["cpu_s"]) / (n * 256)
            else:
                per = None
            rec = {"impl": impl, "pool": pool, "n": n, "variant": " ".join(extra),
                   "cpu_1tok_s": a["cpu_s"],
                   "cpu_257tok_s": b["cpu_s"],
                   "us_per_token": round(per * 1e6, 3) if per is not None else None,
                   "us_per_task_1tok": round(a["cpu_s"] / n * 1e6, 1)}
            out.append(rec)
        self.results["cpu_per_token"] = out

    # ------------------------------------------------------ Redis broker

    def redis_loop(self, mode):
        """One run of the bare loop (bench/redis_loop.c) over N_DISPATCH
        accumulate envelopes; returns its record."""
        q = self.new_queue()
        self.bredis.cmd("FLUSHDB")
        self.redis_publish(q, N_DISPATCH, "celery.accumulate", [1], {})
        self.redis.cmd("FLUSHDB")
        rpid = self.svc_pids.get("redis")
        r0, m0, t0 = cpu_s([rpid]) if rpid else 0, machine_busy_s(), time.time()
        k0 = children_cpu_s()
        try:
            out = self.tool("redis_loop", self.redis_port, REDIS_BROKER_DB, self.db, q,
                            N_DISPATCH, mode)
        finally:
            self.bredis.cmd("FLUSHDB")
            self.redis.cmd("FLUSHDB")
        wall = time.time() - t0
        rec = {"mode": mode, "n": N_DISPATCH,
               "rate": float(re.search(r"\(([\d.]+) msg/s\)", out).group(1)),
               "loop_cpu_s": round(children_cpu_s() - k0, 3),
               "redis_cpu_s": round((cpu_s([rpid]) if rpid else 0) - r0, 3),
               "machine_cpu_s": round(machine_busy_s() - m0, 3), "wall_s": round(wall, 3)}
        log("  bare loop %-4s %6d in %6.2f s: %9.0f msg/s  cpu%%: loop %3.0f redis %3.0f" % (
            mode, N_DISPATCH, wall, rec["rate"], 100 * rec["loop_cpu_s"] / wall,
            100 * rec["redis_cpu_s"] / wall))
        return rec

    def idle_kb(self, broker=None):
        """celeriac's RSS once ready with nothing to do, -c the top level."""
        q = self.new_queue()
        w = self.celeriac(q, max(CONC_LEVELS), broker=broker)
        try:
            w.wait_ready()
            time.sleep(1.0)
            return status_kb(w.p.pid, "VmRSS")
        finally:
            w.stop()
            if broker:
                self.bredis.cmd("FLUSHDB")

    def redis_section(self):
        """Section 8 (issue 15): the dispatch and concurrency workloads over the
        Redis broker, side by side with the AMQP ones in this run, and the bare
        Redis loop. A celeriac that cannot consume from Redis (the transport
        missing, or failing to start) is recorded as missing, once, and its
        remaining runs are skipped; the Python and bare-loop rows still run."""
        log("8. Redis broker (issue 15): dispatch and concurrency over redis://…/%d, bare loop"
            % REDIS_BROKER_DB)
        res = {"db": REDIS_BROKER_DB, "n": N_DISPATCH, "c": DISPATCH_C, "loop": [],
               "loop_sync": [], "dispatch": {}, "concurrency": [], "missing": None}
        self.results["redis_broker"] = res

        def celeriac_redis(fn, *a, **kw):
            if res["missing"] or "celeriac" not in IMPLS:
                return None
            try:
                return fn(*a, **kw)
            except RuntimeError as e:
                res["missing"] = " ".join(str(e).split("\n")[:6])[:600]
                log("  celeriac over Redis: missing (%s)" % res["missing"][:200])
                self.bredis.cmd("FLUSHDB")
                return None

        for _ in range(REPEAT):
            res["loop"].append(self.redis_loop("pipe"))
        res["loop_sync"].append(self.redis_loop("sync"))
        res["loop_deep"] = [self.redis_loop("pipe8")]  # eight BRPOPs in flight
        if "celeriac" in IMPLS:
            res["idle_kb_amqp"] = self.idle_kb()
            res["idle_kb_redis"] = celeriac_redis(self.idle_kb, self.redis_broker)
        for label, task, args, kwargs in (
                ("accumulate", "celery.accumulate", [1], {}),
                ("llm_zero", "llm.generate", ["bench"], {"model": LLM_ZERO})):
            rows = []
            for _ in range(REPEAT):
                rows.append(celeriac_redis(self.run_tasks, "celeriac", "libuv", DISPATCH_C, task,
                                           args, kwargs, N_DISPATCH, 120, broker="redis"))
            for pool, c in PY_POOLS:
                try:
                    rows.append(self.run_tasks("python", pool, c, task, args, kwargs,
                                               N_DISPATCH, PY_BOUND_S, broker="redis"))
                except RuntimeError as e:  # a pool that did not start: its row is missing
                    log("  python %s over Redis: %s" % (pool, str(e)[:300]))
                    self.bredis.cmd("FLUSHDB")
            res["dispatch"][label] = [r for r in rows if r]
        # The concurrency workload at the top level, alternating AMQP and
        # Redis, REPEAT times: the figures to hold within 10% of each other.
        top = max(CONC_LEVELS)
        rows = []
        for _ in range(REPEAT):
            rows.append(self.run_tasks("celeriac", "libuv", top, "llm.generate", ["bench"],
                                       {"model": LLM_1S}, N_CONC, 300, quiet=True))
            rows.append(celeriac_redis(self.run_tasks, "celeriac", "libuv", top, "llm.generate",
                                       ["bench"], {"model": LLM_1S}, N_CONC, 300, quiet=True,
                                       broker="redis"))
        rows = [r for r in rows if r]
        for r in rows:
            r["ideal_s"] = N_CONC * LLM_1S_S / r["c"]
            r.setdefault("broker", "amqp")
        res["concurrency"] = rows
        # RSS per stream with every stream open at once, as section 3 measures
        # it: the fake holds each call MEM_HOLD_MS before its first token, so
        # both brokers hold the same streams whatever the pace of their intake
        # (in the one-second workload the number open at once depends on it).
        # Both runs go through celeriac_redis(): without the Redis run there is
        # nothing to compare the AMQP one with.
        model = "fake/ttft_ms=%d,tokens=32,tps=0" % MEM_HOLD_MS
        held = []
        for broker in ("amqp", "redis"):
            r = celeriac_redis(self.run_tasks, "celeriac", "libuv", top, "llm.generate",
                               ["bench"], {"model": model}, top, 120, hold_for=top,
                               broker=broker)
            if not r:
                continue
            r["broker"] = broker
            idle = res.get("idle_kb_" + broker)
            if r.get("held_rss_kb") and idle:
                r["held_per_stream_b"] = round((r["held_rss_kb"] - idle) * 1024 / top)
            held.append(r)
        res["held"] = held
        for r in [r for rs in res["dispatch"].values() for r in rs] + rows + held:
            r.pop("timeline", None)  # 100 ms samples: the other sections keep theirs

    # ------------------------------------------------------------ SQS

    def sqs_queue_url(self, queue):
        # The emulator's URLs: any account works, this is the one it uses.
        return "%s/123456789012/%s" % (self.sqs_endpoint, queue)

    def sqs_publish(self, queue, n, task, args, kwargs):
        """Pre-publishes n tasks into a new SQS queue as a Celery 5 client does
        through kombu's SQS transport (reference/sqs-broker.md section 3):
        the queue created with kombu's attributes (so that neither worker's
        own CreateQueue conflicts), then MessageBody = base64 of kombu's
        envelope, ten to a SendMessageBatch. Returns messages/s."""
        import base64
        import uuid
        body = base64.b64encode(json.dumps(
            [args, kwargs, {"callbacks": None, "errbacks": None, "chain": None,
                            "chord": None}]).encode()).decode()
        origin = "%d@bench" % os.getpid()
        t0 = time.perf_counter()
        url = self.sqs.create_queue(QueueName=queue,
                                    Attributes={"VisibilityTimeout": "1800"})["QueueUrl"]
        entries = []
        for i in range(n):
            tid = str(uuid.uuid4())
            env = {
                "body": body, "content-encoding": "utf-8", "content-type": "application/json",
                "headers": {"lang": "py", "task": task, "id": tid, "shadow": None, "eta": None,
                            "expires": None, "group": None, "group_index": None,
                            "retries": 0, "timelimit": [None, None], "root_id": tid,
                            "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}",
                            "origin": origin, "ignore_result": False},
                "properties": {"correlation_id": tid, "reply_to": "bench-reply",
                               "delivery_mode": 2,
                               "delivery_info": {"exchange": "", "routing_key": queue},
                               "priority": 0, "body_encoding": "base64",
                               "delivery_tag": str(uuid.uuid4())}}
            entries.append({"Id": str(i % 10),
                            "MessageBody": base64.b64encode(json.dumps(env).encode()).decode()})
            if len(entries) == 10 or i == n - 1:
                r = self.sqs.send_message_batch(QueueUrl=url, Entries=entries)
                if r.get("Failed"):
                    raise RuntimeError("sqs publish: %s" % r["Failed"][:2])
                entries = []
        rate = n / (time.perf_counter() - t0)
        # The emulator's count lagged its last batch by a moment (490 of 500
        # right after the last send): it gets a few seconds to agree.
        deadline = time.time() + 5
        while True:
            depth = int(self.sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                ["Attributes"]["ApproximateNumberOfMessages"])
            if depth == n or time.time() > deadline:
                break
            time.sleep(0.05)
        if depth != n:
            raise RuntimeError("sqs publish: %s holds %d, not %d" % (queue, depth, n))
        return rate

    def sqs_section(self):
        """Section 10 (issue 33): dispatch (celery.accumulate) and the
        one-second streamed LLM workload over Amazon SQS, on a local emulator
        started here (scripts/sqs_emu.js: npm's local-aws-sqs behind the
        QueueUrl front Debian's kombu needs) and stopped at the end. celeriac
        against each Python pool for dispatch, and against gevent for the LLM
        workload, both on the same emulator with the same transport options.
        The emulator's own CPU is recorded per run (sqs_cpu_s): it is one
        Node process, so near 100% of one core it is the limit, not the
        worker. Without the emulator (make deps not run) the section is
        recorded as missing."""
        log("10. SQS broker (issue 33): %d celery.accumulate, then %d LLM tasks (1 s each) at "
            "-c %d, on the local SQS emulator" % (SQS_N, SQS_N_CONC, SQS_C))
        mod = os.path.join(ROOT, "tests", "sqs-emu", "node_modules", "local-aws-sqs")
        res = {"n": SQS_N, "n_conc": SQS_N_CONC, "c": SQS_C, "c_dispatch": DISPATCH_C,
               "options": SQS_OPTIONS, "dispatch": [], "concurrency": [], "missing": None}
        self.results["sqs"] = res
        try:
            import boto3
            with open(os.path.join(mod, "package.json")) as f:
                res["emulator"] = "local-aws-sqs %s, node %s" % (
                    json.load(f)["version"],
                    subprocess.run(["node", "--version"], capture_output=True,
                                   text=True).stdout.strip())
        except (ImportError, OSError, ValueError, KeyError) as e:
            res["missing"] = "no emulator or boto3 (make deps): %s" % e
            log("  SQS: missing (%s)" % res["missing"])
            return
        emu = Proc("sqs_emu", ["node", os.path.join(ROOT, "scripts", "sqs_emu.js"),
                               "--port", "0"], ready=r"listening on http://127\.0\.0\.1:\d+")
        try:
            emu.wait_ready(30)
            port = int(next(re.search(r":(\d+)\s*$", l).group(1) for l in emu.lines
                            if "listening on" in l))
            self.sqs_endpoint = "http://127.0.0.1:%d" % port
            # Any key works: the emulator checks no signature.
            self.sqs_url = "sqs://test:test@127.0.0.1:%d" % port
            self.sqs = boto3.client("sqs", region_name="us-east-1",
                                    endpoint_url=self.sqs_endpoint,
                                    aws_access_key_id="test", aws_secret_access_key="test")
            self.svc_pids["sqs"] = emu.p.pid
            rows = []
            for _ in range(REPEAT):
                rows.append(self.run_tasks("celeriac", "libuv", DISPATCH_C, "celery.accumulate",
                                           [1], {}, SQS_N, 120, broker="sqs"))
            for pool, c in PY_POOLS:
                try:
                    rows.append(self.run_tasks("python", pool, c, "celery.accumulate", [1], {},
                                               SQS_N, SQS_PY_BOUND_S, broker="sqs"))
                except RuntimeError as e:  # a pool that did not start: its row is missing
                    log("  python %s over SQS: %s" % (pool, str(e)[:300]))
            res["dispatch"] = [r for r in rows if r]
            # The LLM workload alternates celeriac and Python gevent (the
            # pool of the AMQP concurrency workload), REPEAT times. No wait
            # for a quiet machine (quiet=True) here: on a shared machine that
            # wait runs to its 20 s bound before every run, and these runs
            # are paced by the emulator's receive (10 messages per 10 ms
            # poll), not by the machine's spare cores.
            rows = []
            for _ in range(REPEAT):
                rows.append(self.run_tasks("celeriac", "libuv", SQS_C, "llm.generate", ["bench"],
                                           {"model": LLM_1S}, SQS_N_CONC, 120, broker="sqs"))
                try:
                    rows.append(self.run_tasks("python", "gevent", SQS_C, "llm.generate",
                                               ["bench"], {"model": LLM_1S}, SQS_N_CONC,
                                               2 * SQS_PY_BOUND_S, broker="sqs"))
                except RuntimeError as e:
                    log("  python gevent over SQS: %s" % str(e)[:300])
            res["concurrency"] = [r for r in rows if r]
            for r in res["concurrency"]:
                r["ideal_s"] = SQS_N_CONC * LLM_1S_S / r["c"]
        finally:
            self.svc_pids.pop("sqs", None)
            emu.stop()
        for r in res["dispatch"] + res["concurrency"]:
            r.pop("timeline", None)

    # ------------------------------------------------------------ tracing

    def tracing_section(self):
        """Section 12 (issue 35): dispatch of llm.generate (0 ms fake LLM,
        two spans a task: run/llm.generate and its chat span) with every span
        exported over OTLP/HTTP protobuf to a local receiver, against the same
        without OTEL_*, alternating, REPEAT times each. The receiver (a
        thread of this harness) answers 200 at once and counts the bytes."""
        import http.server
        log("12. tracing (issue 35): %d llm.generate, traced (every span exported) "
            "against untraced" % N_DISPATCH)
        got = {"requests": 0, "bytes": 0}

        class Receiver(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got["requests"] += 1
                got["bytes"] += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:%d" % srv.server_port,
                "OTEL_SERVICE_NAME": "celeriac-bench"}
        rows = []
        try:
            for _ in range(REPEAT):
                for traced in (False, True):
                    before = dict(got)
                    r = self.run_tasks("celeriac", "libuv", DISPATCH_C, "llm.generate",
                                       ["bench"], {"model": LLM_ZERO}, N_DISPATCH, 120,
                                       env_extra=otel if traced else None)
                    if r:
                        r["traced"] = traced
                        r["otlp_requests"] = got["requests"] - before["requests"]
                        r["otlp_bytes"] = got["bytes"] - before["bytes"]
                        r.pop("timeline", None)
                        rows.append(r)
        finally:
            srv.shutdown()
        self.results["tracing"] = rows
        on = [r["rate"] for r in rows if r["traced"] and r["complete"]]
        off = [r["rate"] for r in rows if not r["traced"] and r["complete"]]
        if on and off:
            log("  traced %.0f tasks/s, untraced %.0f (medians): %.0f%%" % (
                statistics.median(on), statistics.median(off),
                100 * statistics.median(on) / statistics.median(off)))

    # ------------------------------------------------------------ RQ

    def rq_run(self, impl, procs_fn, n, queue):
        """Enqueues n one-second LLM jobs as an RQ 1.13 producer does
        (enqueue_many by the function's name), starts the workers procs_fn()
        gives, and times their start -> n jobs ended (finished or failed
        registry), sampling their CPU and RSS (every process of each tree)."""
        import redis
        import rq
        r = redis.Redis(port=self.redis_port, db=RQ_DB)
        r.flushdb()
        q = rq.Queue(queue, connection=r)
        t0 = time.perf_counter()
        q.enqueue_many([rq.Queue.prepare_data("pyapp.generate", args=("bench",),
                                              kwargs={"model": LLM_1S}, result_ttl=3600)
                        for _ in range(n)], pipeline=None)
        pub_rate = n / (time.perf_counter() - t0)
        if r.llen("rq:queue:" + queue) != n:
            raise RuntimeError("rq enqueue: %d queued, not %d" % (r.llen("rq:queue:" + queue), n))
        fcpu0 = cpu_s([self.fake.p.pid])
        rcpu0 = cpu_s([self.svc_pids["redis"]]) if "redis" in self.svc_pids else 0
        # Every worker process is waited for by stop(), and an RQ worker
        # waits for the work horses it forks: the CPU of all of them is in
        # this process's reaped-children account once the run is over.
        ccpu0 = children_cpu_s()
        t_start = time.time()
        procs = procs_fn()
        rec = {"impl": impl, "n": n, "publish_rate": round(pub_rate), "workers": len(procs)}
        peak_rss, done, failed = 0, 0, 0
        try:
            while True:
                done = r.zcard("rq:finished:" + queue)
                failed = r.zcard("rq:failed:" + queue)
                if done + failed >= n or time.time() - t_start > RQ_BOUND_S:
                    break
                if all(p.p.poll() is not None for p in procs):
                    break
                peak_rss = max(peak_rss, rss_kb([x for p in procs for x in tree(p.p.pid)]))
                time.sleep(0.2)
            t_end = time.time()
        finally:
            for p in procs:
                p.stop()
        rec["done"], rec["failed"] = done, failed
        rec["wall_s"] = round(t_end - t_start, 3)
        rec["rate"] = round(done / (t_end - t_start), 1)
        rec["cpu_s"] = round(children_cpu_s() - ccpu0, 3)
        rec["peak_rss_kb"] = peak_rss
        rec["fake_cpu_s"] = round(cpu_s([self.fake.p.pid]) - fcpu0, 3)
        if "redis" in self.svc_pids:
            rec["redis_cpu_s"] = round(cpu_s([self.svc_pids["redis"]]) - rcpu0, 3)
        rec["ideal_s"] = n * LLM_1S_S / (RQ_C if impl == "celeriac" else len(procs))
        rec["complete"] = done >= n
        log("  %-10s %5d jobs on %4d %s: %7.1f s (ideal %.1f s), %6.1f jobs/s, CPU %.1f s, "
            "RSS %.1f MB, failed %d" % (impl, n, RQ_C if impl == "celeriac" else len(procs),
                                         "slots" if impl == "celeriac" else "processes",
                                         rec["wall_s"], rec["ideal_s"], rec["rate"],
                                         rec["cpu_s"], peak_rss / 1024, failed))
        r.flushdb()
        return rec

    def rq_section(self):
        """Section 11 (issue 34): RQ's job queues. RQ_N queued jobs, each a
        one-second streamed LLM call (the fake's LLM_1S), run by `celeriac rq
        worker -c RQ_C`, against RQ 1.13's own workers (Debian's python3-rq)
        on fewer jobs: RQ_PY_WORKERS `rq worker` processes, forking a work
        horse per job as RQ does by default, then as many SimpleWorkers (no
        fork: RQ's fastest). An RQ worker runs one job at a time, so its
        rows are rates to compare, not the same wall time."""
        log("11. RQ (issue 34): %d one-second LLM jobs on celeriac -c %d; %d on %d RQ workers"
            % (RQ_N, RQ_C, RQ_PY_N, RQ_PY_WORKERS))
        res = {"n": RQ_N, "c": RQ_C, "py_n": RQ_PY_N, "py_workers": RQ_PY_WORKERS,
               "model": LLM_1S, "rows": [], "missing": None}
        self.results["rq"] = res
        try:
            import rq
            res["rq_version"] = rq.__version__
        except ImportError as e:
            res["missing"] = "no python3-rq (make deps): %s" % e
            log("  RQ: missing (%s)" % res["missing"])
            return
        url = "redis://127.0.0.1:%d/%d" % (self.redis_port, RQ_DB)
        queue = "benchrq"
        env = dict(os.environ, OPENAI_BASE_URL=self.llm_base, PYTHONWARNINGS="ignore",
                   PYTHONPATH=os.path.join(ROOT, "bench"))

        def celeriac():
            return [Proc("celeriac-rq", [BIN, "rq", "worker", queue, "--url", url, "-c",
                                         str(RQ_C), "--task-alias", "pyapp.generate=llm.generate",
                                         "-l", "warning"], env=env)]

        def rq_workers(cls):
            def start():
                cmd = [PY, "-m", "rq.cli", "worker", "--burst", "-u", url, "-q"]
                if cls:
                    cmd += ["-w", cls]
                return [Proc("rq-worker", cmd + [queue], env=env, cwd=os.path.join(ROOT, "bench"))
                        for _ in range(RQ_PY_WORKERS)]
            return start
        rows = []
        for _ in range(REPEAT):
            try:
                rows.append(self.rq_run("celeriac", celeriac, RQ_N, queue))
            except RuntimeError as e:
                log("  celeriac rq: %s" % str(e)[:300])
        for label, cls in (("rq-fork", None), ("rq-simple", "rq.worker.SimpleWorker")):
            try:
                rows.append(self.rq_run(label, rq_workers(cls), RQ_PY_N, queue))
            except RuntimeError as e:
                log("  %s: %s" % (label, str(e)[:300]))
        res["rows"] = rows

    # ------------------------------------------------------------ fleet

    def fleet_run(self, label, fake_port, procs_fn, metrics_port=lambda: None):
        """Publishes FLEET_N short llm.generate tasks on a fresh queue, starts
        the workers procs_fn() gives, and waits for every result (or
        FLEET_BOUND_S). The fake enforces
        FLEET_RPM as a provider does; its log says what it answered."""
        base = "http://127.0.0.1:%d" % fake_port

        def fake(path, body=None):
            req = urllib.request.Request(base + path, method="POST" if body is not None else
                                         "GET", data=json.dumps(body).encode()
                                         if body is not None else None)
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        queue = self.new_queue()
        self.redis.cmd("FLUSHDB")  # results, and the shared limits' keys
        fake("/__reset", {})
        fake("/__config", {"rpm": FLEET_RPM, "rl_mode": "bucket"})
        # Published first (the tool waits for the queue to hold them all);
        # the workers start together, and the figures are the provider's,
        # from its first call on.
        self.publish(queue, FLEET_N, "llm.generate", ["bench"], {"model": "fleet"})
        counter = ResultCounter(self.redis_port)
        procs = procs_fn(queue)
        rec = {"label": label, "n": FLEET_N, "rpm": FLEET_RPM, "workers": len(procs)}
        try:
            t0 = time.time()
            for p in procs:
                p.wait_ready()
            done = 0
            while done < FLEET_N and time.time() - t0 < FLEET_BOUND_S:
                done = counter.poll()
                if any(p.p.poll() is not None for p in procs):
                    break
            rec["wall_s"] = round(time.time() - t0, 2)
            if metrics_port():
                time.sleep(1.2)  # the worker reads the fleet's figures once a second
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port(),
                                                timeout=5) as r:
                        text = r.read().decode()
                    for name in ("calls_granted_total", "calls_waited_total",
                                 "wait_seconds_total", "coolings_total", "holds_total"):
                        m = re.search(r"^celeriac_limit_%s\{[^}]*\} (\S+)$" % name, text, re.M)
                        if m:
                            rec["limit_" + name] = float(m.group(1))
                except OSError:
                    pass
        finally:
            for p in procs:
                p.stop()
            counter.close()
            self.tool("publish", self.amqp_port, queue, "purge")
        st = fake("/__stats")
        ok = [e for e in st if e.get("status") == 200]
        rec["requests"] = len(st)
        rec["ok"] = len(ok)
        rec["refused"] = sum(1 for e in st if e.get("status") == 429)
        rec["succeeded"], rec["failed"] = counter.ok, counter.failed
        rec["complete"] = counter.ok + counter.failed >= FLEET_N
        if ok:
            # From the first call at the provider to the last answer it gave,
            # refused ones included (a retried task's last try may fail).
            span = max(e["t_end"] or e["t"] for e in st) - min(e["t"] for e in st)
            per_s = FLEET_RPM / 60.0
            rec["span_s"] = round(span, 2)
            # The most the provider accepts in that time: a second's worth at
            # once, then the pace. Goodput is the calls it answered, as a share.
            rec["ideal_s"] = round(max(0.0, (len(ok) - per_s) / per_s), 2)
            rec["goodput_pct"] = round(100.0 * len(ok) / ((span + 1) * per_s), 1)
        rec["refused_pct"] = round(100.0 * rec["refused"] / max(1, rec["requests"]), 2)
        log("  %-34s %4d ok, %4d refused (%5.2f%% of %d calls), %3d failed tasks; %6.1f s at "
            "the provider (ideal %.1f s): %5.1f%% of the limit" % (
                label, rec["ok"], rec["refused"], rec["refused_pct"], rec["requests"],
                rec["failed"], rec.get("span_s", 0), rec.get("ideal_s", 0),
                rec.get("goodput_pct") or 0))
        return rec

    def fleet_section(self):
        """Section 13 (issue 38): FLEET_WORKERS workers on one queue and one
        provider that enforces FLEET_RPM as providers do (scripts/fake_llm.py
        in bucket mode: a second's worth at once, refilled continuously, 429
        with retry-after beyond), FLEET_N short calls (8 tokens, 50 ms).
        celeriac with the limit shared in Redis, celeriac without it, and
        Python Celery with Celery's rate_limit split between the workers
        (FLEET_RPM / FLEET_WORKERS each, the best a per-worker limit can do)."""
        log("13. fleet (issue 38): %d workers, %d short calls, provider limit %d rpm" % (
            FLEET_WORKERS, FLEET_N, FLEET_RPM))
        fake = Proc("fake_llm", [PY, os.path.join(ROOT, "scripts", "fake_llm.py"),
                                 "--tokens", "8", "--tps", "0", "--latency-ms", "50"],
                    ready=r"^PORT \d+")
        fake.wait_ready(20)
        port = int(fake.lines[0].split()[1])
        llm = "http://127.0.0.1:%d/v1" % port
        share = FLEET_RPM // FLEET_WORKERS
        doc = json.dumps({"providers": {"default": {"limits": {"*": {"rpm": FLEET_RPM}}}}})
        mport = [None]

        def celeriac(shared):
            def start(queue):
                ps = []
                for i in range(FLEET_WORKERS):
                    cmd = [BIN, "worker", "-b", self.broker, "--result-backend", self.backend,
                           "-c", str(FLEET_C), "-Q", queue, "-l", "warning",
                           "-n", "celeriac%d@bench" % i]
                    if shared:
                        cmd += ["--llm-providers", doc]
                        if i == 0:
                            with socket.socket() as so:
                                so.bind(("127.0.0.1", 0))
                                mport[0] = so.getsockname()[1]
                            cmd += ["--metrics-port", str(mport[0])]
                    ps.append(Proc("celeriac", cmd, env=dict(os.environ, OPENAI_BASE_URL=llm),
                                   ready=r" ready\.$"))
                return ps
            return start

        def python(queue):
            env = dict(os.environ, BENCH_BROKER=self.broker, BENCH_BACKEND=self.backend,
                       OPENAI_BASE_URL=llm, PYTHONWARNINGS="ignore",
                       BENCH_RATE_LIMIT="%d/m" % share)
            # prefork, Celery's default pool: with threads, whose timer
            # wakes coarsely, rate-limited tasks went out at a fraction of
            # their rate (60 calls at 3 x 400/m took 38 s in a trial).
            return [Proc("python-prefork",
                         [PY, "-m", "celery", "-A", "pyapp", "worker", "-P", "prefork", "-c",
                          "4", "-Q", queue, "-l", "warning", "--without-gossip",
                          "--without-mingle", "--without-heartbeat", "-n", "py%d@bench" % i],
                         env=env, cwd=os.path.join(ROOT, "bench"), ready=r"BENCH-READY")
                    for i in range(FLEET_WORKERS)]
        rows = []
        try:
            for label, fn, shared in (
                    ("celeriac, limit shared in Redis", celeriac(True), True),
                    ("celeriac, no limit", celeriac(False), False),
                    ("Celery, rate_limit %d/m each" % share, python, False)):
                if fn is python and "python" not in IMPLS:
                    continue
                mport[0] = None
                try:
                    rows.append(self.fleet_run(label, port, fn, lambda: mport[0]))
                except (RuntimeError, OSError) as e:
                    log("  %s: %s" % (label, str(e)[:300]))
        finally:
            fake.stop()
        self.results["fleet"] = {"n": FLEET_N, "rpm": FLEET_RPM, "workers": FLEET_WORKERS,
                                 "c": FLEET_C, "rows": rows}

    # ------------------------------------------------------------ canvas

    def canvas_pool(self):
        """Python's best pool for the canvas runs, as the dispatch rows pick
        it: the fastest at celery.accumulate. Without dispatch rows in this
        run (BENCH_ONLY=canvas), a short dispatch probe of each pool picks it;
        BENCH_CANVAS_POOL skips both. Returns (pool, where from, probe rows)."""
        forced = os.environ.get("BENCH_CANVAS_POOL")
        if forced:
            return forced, "BENCH_CANVAS_POOL", []
        rows = [r for r in self.results.get("dispatch", {}).get("accumulate", [])
                if r["impl"] == "python"]
        if rows:
            return max(rows, key=lambda r: r["rate"])["pool"], "dispatch", []
        log("  no dispatch rows in this run: probing each pool with %d accumulate tasks" %
            CANVAS_PROBE_N)
        rows = [self.run_tasks("python", pool, c, "celery.accumulate", [1], {},
                               CANVAS_PROBE_N, PY_BOUND_S) for pool, c in PY_POOLS]
        for r in rows:
            r.pop("timeline", None)
        return max(rows, key=lambda r: r["rate"])["pool"], "probe", rows

    def canvas_case(self, impl, w, queue, case, size):
        """Runs one canvas case against a ready worker; returns its record.

        Each case has a client of its own (a new Celery app, warmed up by a
        chain of two): after a GroupResult.get() of 1,000, the same client
        took 1.0-1.5 s to see the result of a chain that the worker had
        stored within 0.1 s, for the next few calls, on either worker.

        The clock starts before apply_async (the client publishes the whole
        chord or group itself, so its publishing time is in the wall time of
        both workers alike, and shown apart as apply_s) and stops when the
        result the user waits for is back: the chord body's, the group's
        list, the last chain step's, the map's."""
        from celery import Celery, chain, chord, group
        from celery.canvas import xmap

        app = Celery("canvas", broker=self.broker, backend=self.backend)
        app.conf.update(result_expires=3600)

        def acc(*args, **kw):
            # Every signature names the queue: follow-ups without one would go
            # to `celery`, on celeriac and on Python alike.
            return app.signature("celery.accumulate", args=args, kwargs=kw, queue=queue)

        if case == "chord":
            sig = chord([acc(i, index=0) for i in range(size)], acc(index=0), app=app)
            want = list(range(size))
        elif case == "group":
            sig = group([acc(i, index=0) for i in range(size)], app=app)
            want = list(range(size))
        elif case == "chain":
            # index=0 keeps the value 1 (the result is prepended to each step's args)
            sig = chain(acc(1, index=0), *[acc(index=0) for _ in range(size - 1)], app=app)
            want = 1
        else:  # map, map_big
            sig = xmap(app.signature("llm.generate"),
                       ["canvas %s item %d" % (case, i) for i in range(size)], app=app)
            want = None
        # (xmap.apply_async drops the signature's own options: the queue goes here)
        opts = {"queue": queue} if case.startswith("map") else {}
        try:
            chain(acc(1, index=0), acc(index=0), app=app).apply_async().get(timeout=30)
        except Exception:
            pass  # the case itself will fail and say why
        self.redis.cmd("FLUSHDB")
        settled = self.canvas_settle()
        pids = tree(w.p.pid)
        cpu0, mcpu0, hcpu0 = cpu_s(pids), machine_busy_s(), cpu_s([os.getpid()])
        scpu0 = {k: cpu_s([v]) for k, v in self.svc_pids.items()}
        self.fake_canvas_stats(reset=True)
        pool = "libuv" if impl == "celeriac" else w.name.replace("python-", "")
        rec = {"case": case, "impl": impl, "pool": pool, "size": size, "settle_s": settled}
        t0, wall0 = time.perf_counter(), time.time()
        err = None
        try:
            res = sig.apply_async(**opts)
            rec["apply_s"] = round(time.perf_counter() - t0, 3)
            got = res.get(timeout=CANVAS_TIMEOUT_S)
            if want is None:
                ok = (isinstance(got, list) and len(got) == size and
                      all(isinstance(x, str) and x for x in got))
            else:
                ok = got == want
            if not ok:
                err = "wrong result: %.200r" % (got,)
            done = self.canvas_stored_at(res.results if case == "group" else [res])
            if done is not None:
                rec["stored_s"] = round(done - wall0, 4)
        except Exception as e:  # a timeout or a task's error: the case failed
            err = "%s: %s" % (type(e).__name__, str(e)[:200])
        wall = time.perf_counter() - t0
        rec["wall_s"] = round(wall, 4)
        rec["ok"] = err is None
        if err:
            rec["error"] = err
        rec["cpu_s"] = round(cpu_s(pids) - cpu0, 3)
        rec["harness_cpu_s"] = round(cpu_s([os.getpid()]) - hcpu0, 3)
        for k, v in self.svc_pids.items():
            rec[k + "_cpu_s"] = round(cpu_s([v]) - scpu0[k], 3)
        rec["machine_cpu_s"] = round(machine_busy_s() - mcpu0, 3)
        rec["other_cpu_s"] = round(rec["machine_cpu_s"] - rec["cpu_s"] - rec["harness_cpu_s"]
                                   - sum(rec.get(k + "_cpu_s", 0) for k in self.svc_pids), 3)
        if case.startswith("map"):
            fs = self.fake_canvas_stats()
            rec["llm_calls"] = fs["requests"]
            rec["llm_max_open"] = fs["max_open"]
        try:
            app.backend.result_consumer.stop()
        except Exception:
            pass
        app.close()
        if err:
            # Whatever is left of the case must not run into the next one.
            self.tool("publish", self.amqp_port, queue, "purge")
            time.sleep(1.0)
        log("  %-7s %-8s %-8s %5d: %8.3f s (apply %.3f s, stored %.3f s)  cpu%%: worker %3.0f "
            "rabbit %3.0f redis %3.0f others %3.0f%s" % (
                case, impl, pool, size, wall, rec.get("apply_s", 0), rec.get("stored_s", 0),
                100 * rec["cpu_s"] / wall, 100 * rec.get("rabbitmq_cpu_s", 0) / wall,
                100 * rec.get("redis_cpu_s", 0) / wall, 100 * rec["other_cpu_s"] / wall,
                "" if not err else "  FAILED: " + err))
        return rec

    def canvas_settle(self, limit=0.05, window=0.2, bound_s=5.0):
        """Waits until RabbitMQ and Redis were idle (under `limit` of a core
        together) for `window` seconds, or `bound_s` passed; returns the wait.

        A case must not start while the broker or Redis still work on the
        previous one (its persistent messages, its keys): that would be the
        previous case's cost. The other processes on the machine are not
        waited for (it is shared)."""
        pids = list(self.svc_pids.values())
        t_start = time.time()
        while True:
            c0, t0 = cpu_s(pids), time.time()
            time.sleep(window)
            if (cpu_s(pids) - c0) / (time.time() - t0) < limit or time.time() - t_start > bound_s:
                return round(time.time() - t_start, 2)

    def canvas_stored_at(self, results):
        """The latest date_done (epoch seconds) among these results' metas:
        when the worker stored the last result the client waits for."""
        from datetime import datetime, timezone
        keys = ["celery-task-meta-%s" % r.id for r in results]
        latest = None
        for i in range(0, len(keys), 500):
            got = self.redis_mget(keys[i:i + 500])
            for raw in got:
                if raw is None:
                    return None
                d = datetime.fromisoformat(json.loads(raw)["date_done"].replace("Z", "+00:00"))
                if d.tzinfo is None:  # Python Celery 5.2 stores naive UTC
                    d = d.replace(tzinfo=timezone.utc)
                latest = max(latest or 0.0, d.timestamp())
        return latest

    def redis_mget(self, keys):
        r = self.redis
        out = b"*%d\r\n$4\r\nMGET\r\n" % (len(keys) + 1)
        for k in keys:
            k = k.encode()
            out += b"$%d\r\n%s\r\n" % (len(k), k)
        r.s.sendall(out)
        head = r.f.readline()
        if head[:1] != b"*":
            raise RuntimeError("MGET: %r" % head)
        vals = []
        for _ in range(int(head[1:])):
            line = r.f.readline()
            n = int(line[1:])
            vals.append(None if n < 0 else r.f.read(n + 2)[:-2])
        return vals

    def fake_canvas_stats(self, reset=False):
        req = urllib.request.Request(
            "http://127.0.0.1:%d/%s" % (self.canvas_fake_port, "__reset" if reset else "__stats"),
            data=b"{}" if reset else None, method="POST" if reset else "GET")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def canvas(self):
        log("7. canvas: chord of %d, group of %d, chain of %d, map of %d LLM calls (%d ms each), "
            "map of %d on celeriac" % (CANVAS_N, CANVAS_N, CANVAS_CHAIN, CANVAS_MAP, CANVAS_LLM_MS,
                                       CANVAS_MAP_BIG))
        pool, pool_from, probe = self.canvas_pool() if "python" in IMPLS else (None, None, [])
        if pool:
            log("  Python pool: %s (from %s)" % (pool, pool_from))
        # Map items call the bare task, so the model is the worker's default,
        # not a fake/... name: this server's defaults give every call its delay.
        fake = Proc("fake_canvas", [os.path.join(TOOLS, "fake_fast"), "--defaults",
                                    "ttft_ms=%d,tokens=16,tps=0" % CANVAS_LLM_MS],
                    ready=r"^PORT \d+")
        workers = {}
        rows = []
        try:
            fake.wait_ready(10)
            self.canvas_fake_port = int(fake.lines[0].split()[1])
            base = "http://127.0.0.1:%d/v1" % self.canvas_fake_port
            # Both workers stay up, each on its own queue, and the cases
            # alternate between them: on a shared machine the load drifts,
            # and this way both sides of a ratio see the same drift. An idle
            # worker of either kind costs next to no CPU.
            if "celeriac" in IMPLS:
                q = self.new_queue()
                workers["celeriac"] = (self.celeriac(q, DISPATCH_C, llm_base=base), q)
            if pool:
                q = self.new_queue()
                workers["python"] = (self.python(q, pool, dict(PY_POOLS).get(pool, 1),
                                                 llm_base=base), q)
            for w, _ in workers.values():
                w.wait_ready()
            cases = (("chord", CANVAS_N), ("group", CANVAS_N), ("chain", CANVAS_CHAIN),
                     ("map", CANVAS_MAP), ("map_big", CANVAS_MAP_BIG))
            for _ in range(REPEAT):
                for case, size in cases:
                    for impl, (w, q) in workers.items():
                        if case == "map_big" and impl != "celeriac":
                            continue  # Python: CANVAS_MAP_BIG x 200 ms one after another
                        rows.append(self.canvas_case(impl, w, q, case, size))
        finally:
            for w, q in workers.values():
                w.stop()
            fake.stop()
            for w, q in workers.values():
                self.tool("publish", self.amqp_port, q, "purge")
        summary = {}
        for case, size in cases:
            by = {impl: [r["wall_s"] for r in rows if r["case"] == case and r["impl"] == impl
                         and r["ok"]] for impl in workers}
            st = {impl: [r["stored_s"] for r in rows if r["case"] == case and r["impl"] == impl
                         and r["ok"] and "stored_s" in r] for impl in workers}
            s = {"size": size}
            for impl in workers:
                if by[impl]:
                    s[impl + "_s"] = statistics.median(by[impl])
                if st[impl]:
                    s[impl + "_stored_s"] = statistics.median(st[impl])
            s["failed"] = sum(1 for r in rows if r["case"] == case and not r["ok"])
            # celeriac / Python in tasks (or items) per second: Python's time
            # over celeriac's; to the result in the client's hands, and to
            # the last result stored by the worker.
            if s.get("celeriac_s") and s.get("python_s"):
                s["ratio"] = round(s["python_s"] / s["celeriac_s"], 2)
            if s.get("celeriac_stored_s") and s.get("python_stored_s"):
                s["stored_ratio"] = round(s["python_stored_s"] / s["celeriac_stored_s"], 2)
            summary[case] = s
            f = lambda k, fm="%.3f s": fm % s[k] if k in s else "-"
            log("  %-7s %5d: celeriac %s (stored %s)  python %s (stored %s)  "
                "celeriac/Python %s (stored %s)%s" % (
                    case, size, f("celeriac_s"), f("celeriac_stored_s"), f("python_s"),
                    f("python_stored_s"), f("ratio", "%.1fx"), f("stored_ratio", "%.1fx"),
                    "  (%d failed)" % s["failed"] if s["failed"] else ""))
        self.results["canvas"] = {
            "n": CANVAS_N, "chain": CANVAS_CHAIN, "map": CANVAS_MAP, "map_big": CANVAS_MAP_BIG,
            "llm_ms": CANVAS_LLM_MS, "celeriac_c": DISPATCH_C, "python_pool": pool,
            "python_c": dict(PY_POOLS).get(pool, 1) if pool else None,
            "pool_from": pool_from, "probe": probe, "repeat": REPEAT, "summary": summary,
            "runs": rows}


def tls_section(b):
    """Section 9 (issue 18): the concurrency workload (N_CONC one-second
    streamed calls at once) through a private nginx that terminates TLS and
    speaks HTTP/2 in front of the fake, against the same workload over plain
    HTTP, alternating REPEAT times; then the memory workload's held streams
    over TLS for the RSS per stream. The TLS handshakes are the connections
    nginx accepted (its access log: one line per request with the
    connection's serial number and whether its session was resumed)."""
    import tempfile
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from tls_front import TlsFront
    top = max(CONC_LEVELS)
    log("9. TLS (issue 18): %d LLM tasks, 1 s each, through nginx (TLS, HTTP/2) "
        "against plain HTTP" % N_CONC)
    d = tempfile.mkdtemp(prefix="celeriac-tls.")
    front = TlsFront(b.fake_port, d).start()
    started.append(front.p)
    nginx_pid = lambda: [p for p in tree(front.p.pid) if p != front.p.pid][0]
    tls_args = ("--llm-ca-file", front.ca_file, "--llm-http2", "--llm-max-connections", TLS_MAX_CONN)
    res = {"front": "nginx %s, 1 worker process, http2_max_concurrent_streams %d" % (
        nginx_version(), front.streams), "rows": []}
    try:
        def tls_run(**kw):
            front.reset()
            b.svc_pids["nginx"] = nginx_pid()
            try:
                r = b.run_tasks("celeriac", "libuv", extra=tls_args, llm_base=front.base_url,
                                **kw)
            finally:
                b.svc_pids.pop("nginx", None)
            r["tls"] = front.stats()
            if not r["complete"]:
                log("  nginx's error log ends:\n    %s" % "\n    ".join(
                    front.errors().splitlines()[-10:]))
            r["handshakes"] = r["tls"]["connections"]
            log("  tls: %d requests (%d over HTTP/2) on %d connections (TLS handshakes), "
                "%d of them resumed" % (r["tls"]["requests"], r["tls"]["h2_requests"],
                                        r["tls"]["connections"], r["tls"]["resumed"]))
            return r
        for rep in range(REPEAT):
            plain = b.run_tasks("celeriac", "libuv", top, "llm.generate", ["bench"],
                                {"model": LLM_1S}, N_CONC, 300, quiet=True)
            plain["scheme"] = "http"
            res["rows"].append(plain)
            tls = tls_run(c=top, task="llm.generate", args=["bench"], kwargs={"model": LLM_1S},
                          n=N_CONC, bound_s=300, quiet=True)
            tls["scheme"] = "https"
            res["rows"].append(tls)
        # RSS per stream: every stream held open at once (as section 3).
        q = b.new_queue()
        w = b.celeriac(q, top, tls_args, llm_base=front.base_url)
        try:
            w.wait_ready()
            time.sleep(1.0)
            idle = status_kb(w.p.pid, "VmRSS")
        finally:
            w.stop()
        model = "fake/ttft_ms=%d,tokens=32,tps=0" % MEM_HOLD_MS
        mem = {"idle_kb": idle}
        for scheme in ("http", "https"):
            if scheme == "https":
                r = tls_run(c=top, task="llm.generate", args=["bench"], kwargs={"model": model},
                            n=top, bound_s=120, hold_for=top)
            else:
                r = b.run_tasks("celeriac", "libuv", top, "llm.generate", ["bench"],
                                {"model": model}, top, 120, hold_for=top)
            r["idle_kb"] = idle
            r["per_stream_b"] = round((r["hwm_kb"] - idle) * 1024 / top)
            r["held_per_stream_b"] = round(((r["held_rss_kb"] or 0) - idle) * 1024 / top)
            mem[scheme] = r
            log("  memory %-5s: %d streams held: %d B per stream at peak, %d B held" % (
                scheme, top, r["per_stream_b"], r["held_per_stream_b"]))
        res["memory"] = mem
    finally:
        front.stop()
        shutil.rmtree(d, ignore_errors=True)
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    plain = [r for r in res["rows"] if r["scheme"] == "http" and r["complete"]]
    tls = [r for r in res["rows"] if r["scheme"] == "https" and r["complete"]]
    if plain and tls:
        s = res["summary"] = {
            "plain_wall_s": med(plain, "wall_s"), "tls_wall_s": med(tls, "wall_s"),
            "plain_cpu_ms_per_task": 1000 * med(plain, "cpu_s") / N_CONC,
            "tls_cpu_ms_per_task": 1000 * med(tls, "cpu_s") / N_CONC,
            "nginx_cpu_ms_per_task": 1000 * med(tls, "nginx_cpu_s") / N_CONC,
            "handshakes": med(tls, "handshakes"), "calls": N_CONC,
            "tls_per_stream_b": res["memory"]["https"]["per_stream_b"],
            "plain_per_stream_b": res["memory"]["http"]["per_stream_b"]}
        log("  tls vs plain: wall %.2f s vs %.2f s (%.2fx), worker CPU %.3f vs %.3f ms/task "
            "(%.2fx; nginx %.3f ms/task), %d TLS handshakes for %d calls, "
            "RSS %d vs %d B/stream" % (
                s["tls_wall_s"], s["plain_wall_s"], s["tls_wall_s"] / s["plain_wall_s"],
                s["tls_cpu_ms_per_task"], s["plain_cpu_ms_per_task"],
                s["tls_cpu_ms_per_task"] / s["plain_cpu_ms_per_task"],
                s["nginx_cpu_ms_per_task"], s["handshakes"], N_CONC,
                s["tls_per_stream_b"], s["plain_per_stream_b"]))
    b.results["tls"] = res


def nginx_version():
    r = subprocess.run(["/usr/sbin/nginx", "-v"], capture_output=True, text=True)
    return r.stderr.strip().split("/")[-1]


def machine():
    def first(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                                  shell=True).stdout.strip().splitlines()[0]
        except Exception:
            return "?"
    mem = first("free -m | awk '/Mem:/ {print $2}'")
    return {
        "cpu": first("lscpu | sed -n 's/^Model name: *//p'"),
        "cores": os.cpu_count(),
        "mem_mb": mem,
        "kernel": platform.release(),
        "os": first(". /etc/os-release && echo $PRETTY_NAME"),
        "rabbitmq": first("dpkg-query -W -f='${Version}' rabbitmq-server"),
        "redis": first("dpkg-query -W -f='${Version}' redis-server"),
        "libcurl": first("dpkg-query -W -f='${Version}' libcurl4"),
        "celery": first("dpkg-query -W -f='${Version}' python3-celery"),
        "python": platform.python_version(),
        "gevent": first("dpkg-query -W -f='${Version}' python3-gevent"),
        "load_before": open("/proc/loadavg").read().split()[:3],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git": first("git -C %s rev-parse --short HEAD" % ROOT),
    }


def main():
    svc, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    b = None
    t0 = time.time()
    try:
        b = Bench(svc, out)
        b.results["machine"] = machine()
        only = os.environ.get("BENCH_ONLY",
                              "limits,dispatch,concurrency,memory,latency,cpu,canvas,redis,tls,"
                              "sqs,rq,tracing,fleet")
        for name, fn in (("limits", b.limits), ("dispatch", b.dispatch),
                         ("concurrency", b.concurrency), ("memory", b.memory),
                         ("latency", b.latency), ("cpu", b.cpu_per_token),
                         ("canvas", b.canvas), ("redis", b.redis_section),
                         ("tls", lambda: tls_section(b)), ("sqs", b.sqs_section),
                         ("rq", b.rq_section), ("tracing", b.tracing_section),
                         ("fleet", b.fleet_section)):
            if name in only.split(","):
                fn()
        b.results["elapsed_s"] = round(time.time() - t0, 1)
        b.results["machine"]["load_after"] = open("/proc/loadavg").read().split()[:3]
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(b.results, f, indent=1)
    finally:
        cleanup()
    log("bench: done in %.0f s; results in %s" % (time.time() - t0, out))


if __name__ == "__main__":
    main()
