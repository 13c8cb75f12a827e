"""Issue 33: Amazon SQS as the broker. A real Python Celery client sends over
sqs:// to the local emulator (the `sqs_emu` fixture), a real celeriac worker
consumes, and the results come back through Redis. Each test keeps to a
queue_name_prefix of its own; wait_time_seconds is 1 (the emulator answers a
long poll only when it is full or timed out)."""
import base64
import json
import os
import signal
import subprocess
import textwrap
import time
import uuid

import re
import urllib.error
import urllib.request

from conftest import PY, free_port, wait_progress, wait_until


def sqs_worker(env, emu, prefix, *args, **kw):
    opts = emu.transport_options(queue_name_prefix=prefix)
    return env.worker("-b", emu.broker_url, "--broker-transport-options", json.dumps(opts),
                      *args, **kw)


def visible(emu, sqs_name):
    attrs = emu.client().get_queue_attributes(
        QueueUrl=emu.queue_url(sqs_name),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    a = attrs["Attributes"]
    return int(a["ApproximateNumberOfMessages"]), int(a["ApproximateNumberOfMessagesNotVisible"])


def test_python_client_task_runs_and_is_deleted(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    mark = sqs_emu.mark()
    w = sqs_worker(env, sqs_emu, prefix)
    r = app.send_task("llm.generate", args=["hello sqs"])
    assert r.get(timeout=20) == env.fake.expected_text("hello sqs")
    wait_until(lambda: sqs_emu.requests("DeleteMessageBatch", since=mark), 5,
               what="DeleteMessageBatch")
    assert visible(sqs_emu, prefix + "celery") == (0, 0)
    # celeriac created the queue as kombu does, and polls as 5.6.2 does
    created = sqs_emu.requests("CreateQueue", since=mark)
    assert created and created[0]["params"]["Attributes"]["VisibilityTimeout"] == "1800"
    polls = [q for q in sqs_emu.requests("ReceiveMessage", since=mark) if q.get("json")]
    assert polls and all(p["params"]["WaitTimeSeconds"] == 1 for p in polls)
    assert "remote control and events are off" in w.log()


def test_dotted_queue_with_prefix_meets_the_python_client(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    sqs_worker(env, sqs_emu, prefix, "-Q", "llm.high")
    r = app.send_task("llm.generate", args=["dotted"], queue="llm.high")
    assert r.get(timeout=20) == env.fake.expected_text("dotted")
    names = [u.rsplit("/", 1)[1] for u in
             sqs_emu.client().list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])]
    assert prefix + "llm-high" in names
    assert visible(sqs_emu, prefix + "llm-high") == (0, 0)


def test_permanent_failure_is_dead_lettered_and_stored(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    env.fake.script(["status=400;err_msg=nope"])
    sqs_worker(env, sqs_emu, prefix)
    r = app.send_task("llm.generate", args=["doomed"])
    dead = sqs_emu.queue_url(prefix + "celeriac-dead")
    got = []

    def dead_letter():
        m = sqs_emu.client().receive_message(QueueUrl=dead, WaitTimeSeconds=1)
        got.extend(m.get("Messages", []))
        return got

    wait_until(dead_letter, 20, what="dead letter")
    dl = json.loads(base64.b64decode(got[0]["Body"]))
    assert dl["headers"]["id"] == r.id
    assert dl["properties"]["delivery_info"]["routing_key"] == "celeriac.dead"
    wait_until(lambda: env.meta(r.id), 10, what="stored result")
    assert env.meta(r.id)["status"] == "FAILURE"
    wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="deleted")


def test_dlq_list_show_replay_purge(env, sqs_emu):
    # test_reliability.py's test of the same name, over SQS: `celeriac dlq`
    # reads the dead-letter queue without taking it from anyone for long.
    from conftest import BIN
    prefix = sqs_emu.prefix()
    opts = json.dumps(sqs_emu.transport_options(queue_name_prefix=prefix))
    dead = prefix + "celeriac-dead"

    def dlq(*args):
        return subprocess.run([BIN, "dlq", "-b", sqs_emu.broker_url,
                               "--broker-transport-options", opts, *args],
                              capture_output=True, text=True, timeout=60)

    def depth():
        try:
            return visible(sqs_emu, dead)
        except Exception:  # not created yet
            return None

    app = sqs_emu.make_app(env.backend, prefix=prefix)
    env.fake.script(["status=400;err_msg=nope"])
    sqs_worker(env, sqs_emu, prefix, "--max-retries", "0")
    doomed = app.send_task("llm.generate", args=["doomed"])
    unknown = app.send_task("no.such.task", args=[1])
    wait_until(lambda: depth() == (2, 0), 20, what="two dead letters")
    out = dlq("list")
    assert out.returncode == 0, out.stderr
    assert doomed.id in out.stdout and unknown.id in out.stdout
    assert "unregistered task" in out.stdout and "BadRequestError" in out.stdout
    # what list received is visible again at once: a second look sees it all
    lines = dlq("list", "--json").stdout.strip().splitlines()
    assert {json.loads(l)["id"] for l in lines} == {doomed.id, unknown.id}
    assert {json.loads(l)["queue"] for l in lines} == {"celery"}
    shown = dlq("show", doomed.id)
    assert shown.returncode == 0, shown.stderr
    assert "BadRequestError" in shown.stdout and "doomed" in shown.stdout
    assert dlq("show", "no-such-id").returncode != 0
    assert depth() == (2, 0)
    # replay by id: back on its queue, it runs again and succeeds
    out = dlq("replay", doomed.id)
    assert out.returncode == 0 and "replayed 1 of 2" in out.stdout, out.stdout + out.stderr
    wait_until(lambda: env.meta(doomed.id)["status"] == "SUCCESS", 20, what="replayed success")
    assert env.fake.stats()[-1]["prompt"] == "doomed"
    assert depth() == (1, 0)
    # purge by id deletes at once; purge of all is SQS's PurgeQueue (which
    # takes up to 60 s, on the emulator too)
    out = dlq("purge", unknown.id)
    assert out.returncode == 0 and "purged 1 of 1" in out.stdout, out.stdout + out.stderr
    assert depth() == (0, 0)
    mark = sqs_emu.mark()
    out = dlq("purge")
    assert out.returncode == 0 and "purged 0 dead letters" in out.stdout, out.stdout + out.stderr
    assert sqs_emu.requests("PurgeQueue", since=mark)


def test_warm_shutdown_gives_back_what_was_prefetched(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    env.fake.script(["latency_ms=4000;tokens=2"])
    w = sqs_worker(env, sqs_emu, prefix, "-c", "1", "--prefetch-multiplier", "1")
    later = app.send_task("llm.generate", args=["held"], countdown=60)
    first = app.send_task("llm.generate", args=["running"])
    wait_until(lambda: w.count(r"received") == 2, 10, what="both held")
    # (the emulator counts in-flight messages in ApproximateNumberOfMessages too)
    assert visible(sqs_emu, prefix + "celery")[1] == 2
    mark = sqs_emu.mark()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    assert first.get(timeout=5)
    # rows 9 and 13: the requeue is a visibility change to wait_time_seconds
    cmv = sqs_emu.requests("ChangeMessageVisibilityBatch", since=mark)
    assert cmv and all(e["VisibilityTimeout"] == 1 for c in cmv
                       for e in c["params"]["Entries"]), cmv
    # visible again at once, not after the 1800 s visibility timeout
    t0 = time.time()
    wait_until(lambda: visible(sqs_emu, prefix + "celery") == (1, 0), 5, what="given back")
    m = sqs_emu.client().receive_message(QueueUrl=sqs_emu.queue_url(prefix + "celery"),
                                         AttributeNames=["ApproximateReceiveCount"])
    assert time.time() - t0 < 5
    body = json.loads(base64.b64decode(m["Messages"][0]["Body"]))
    assert body["headers"]["id"] == later.id


def test_retry_is_republished_through_sqs(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    env.fake.script(["status=429;ra=1", "tokens=4"])
    mark = sqs_emu.mark()
    w = sqs_worker(env, sqs_emu, prefix)
    r = app.send_task("llm.generate", args=["retry me"])
    assert r.get(timeout=20) == env.fake.expected_text("retry me", tokens=4)
    assert w.count(r"Retry in") >= 1
    # the retry went out through SendMessage before the original was deleted
    sends = [q for q in sqs_emu.requests("SendMessage", since=mark) if q.get("json")]
    assert len(sends) == 1
    body = json.loads(base64.b64decode(sends[0]["params"]["MessageBody"]))
    assert body["headers"]["id"] == r.id and body["headers"]["retries"] == 1
    assert body["properties"]["delivery_info"] == {"exchange": "", "routing_key": "celery"}
    wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="all deleted")
    # row 11: the original's delete (the first) only once SQS had the copy
    deletes = sqs_emu.requests("DeleteMessageBatch", since=mark)
    assert sends[0]["t"] + sends[0]["ms"] <= min(d["t"] for d in deletes)


def test_burst_acked_in_batches_of_ten(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    hold = "b" + prefix
    env.fake.script(["hold=%s;tokens=2" % hold] * 24)
    mark = sqs_emu.mark()
    sqs_worker(env, sqs_emu, prefix, "-c", "24", "--prefetch-multiplier", "1")
    rs = [app.send_task("llm.generate", args=["burst %d" % i]) for i in range(24)]
    wait_until(lambda: env.fake.held(hold) == 24, 15, what="all 24 running")
    # row 7: the window (24) is full, so no poll starts until a slot frees
    full_ms = time.time() * 1000
    time.sleep(1.5)
    env.fake.release(hold)
    for r in rs:
        r.get(timeout=20)
    wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="all deleted")
    batches = [len(q["params"]["Entries"]) for q in
               sqs_emu.requests("DeleteMessageBatch", since=mark)]
    assert sum(batches) == 24 and max(batches) <= 10 and len(batches) < 24, batches
    # a poll is logged when answered: let one started in the window end
    time.sleep(max(0.0, (full_ms + 1400 + 1200) / 1000 - time.time()))
    ours = [q for q in sqs_emu.requests("ReceiveMessage", since=mark) if q.get("json")]
    polls = [q["params"]["MaxNumberOfMessages"] for q in ours]
    assert polls and max(polls) <= 10
    assert not [q for q in ours if full_ms < q["t"] < full_ms + 1400], ours
    # one poll of the queue in flight at a time
    spans = sorted((q["t"], q["t"] + q["ms"]) for q in ours)
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), spans


def test_visibility_extended_while_a_task_runs(env, sqs_emu):
    """A queue made elsewhere with a 3 s visibility timeout (the option, 1800,
    applies only to queues the worker creates): celeriac reads the queue's
    own, and a 4 s task is kept invisible by ChangeMessageVisibilityBatch
    every second, so it runs once."""
    prefix = sqs_emu.prefix()
    sqs_emu.client().create_queue(QueueName=prefix + "celery",
                                  Attributes={"VisibilityTimeout": "3"})
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    env.fake.script(["latency_ms=4000;tokens=2"])
    mark = sqs_emu.mark()
    w = sqs_worker(env, sqs_emu, prefix)
    w.wait_for(r"has a visibility timeout of 3 s")
    r = app.send_task("llm.generate", args=["long one"])
    assert r.get(timeout=20)
    time.sleep(0.5)
    assert w.count(r"Task llm.generate\[%s\] received" % r.id) == 1
    ext = sqs_emu.requests("ChangeMessageVisibilityBatch", since=mark)
    assert len(ext) >= 2
    assert all(e["params"]["Entries"][0]["VisibilityTimeout"] == 3 for e in ext)
    assert not [q for q in sqs_emu.requests("CreateQueue", since=mark)
                if q["params"]["QueueName"] == prefix + "celery"]


def test_kill_9_mid_task_comes_back_after_the_visibility_timeout(env, sqs_emu):
    prefix = sqs_emu.prefix()
    opts = {"visibility_timeout": 3}
    app = sqs_emu.make_app(env.backend, prefix=prefix, transport_options=opts)
    hold = "k" + prefix
    env.fake.script(["hold=%s;tokens=2" % hold, "tokens=2"])
    args = ["--broker-transport-options",
            json.dumps(sqs_emu.transport_options(queue_name_prefix=prefix, **opts))]
    w1 = env.worker("-b", sqs_emu.broker_url, *args)
    r = app.send_task("llm.generate", args=["killed"])
    wait_until(lambda: env.fake.held(hold) == 1, 10, what="running")
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    env.fake.release(hold)
    w2 = env.worker("-b", sqs_emu.broker_url, *args)
    assert r.get(timeout=20)
    assert env.meta(r.id)["status"] == "SUCCESS"
    w2.wait_for(r"Task llm.generate\[%s\] received" % r.id)
    wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="deleted")


def test_fifo_queue_keeps_order(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    mark = sqs_emu.mark()
    w = sqs_worker(env, sqs_emu, prefix, "-Q", "jobs.fifo", "-c", "1",
                   "--prefetch-multiplier", "1")
    rs = [app.send_task("llm.generate", args=["fifo %d" % i], queue="jobs.fifo")
          for i in range(5)]
    for r in rs:
        assert r.get(timeout=20)
    created = [q for q in sqs_emu.requests("CreateQueue", since=mark) if q.get("json")]
    assert created[0]["params"]["QueueName"] == prefix + "jobs.fifo"
    assert created[0]["params"]["Attributes"]["FifoQueue"] == "true"
    order = [l for l in w.log().splitlines() if "received" in l]
    assert [r.id for r in rs] == [l.split("[")[-1].split("]")[0] for l in order]


def test_metrics_report_queue_depth_from_sqs(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    hold = "m" + prefix
    env.fake.script(["hold=%s;tokens=2" % hold] * 4)
    port = free_port()
    sqs_worker(env, sqs_emu, prefix, "-c", "1", "--prefetch-multiplier", "1",
               "--metrics-port", str(port))
    rs = [app.send_task("llm.generate", args=["depth %d" % i]) for i in range(4)]

    def depth():
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read()
        m = re.search(r'^celeriac_queue_messages\{queue="celery"\} (\S+)$', text.decode(), re.M)
        return m and float(m.group(1))

    # the emulator counts in-flight messages in ApproximateNumberOfMessages
    wait_until(lambda: env.fake.held(hold) == 1 and depth() == visible(sqs_emu, prefix + "celery")[0]
               and depth() >= 3, 20, what="depth polled")
    env.fake.release(hold)
    for r in rs:
        env.fake.release(hold)
        r.get(timeout=20)


def test_queue_deleted_under_the_worker_is_created_again(env, sqs_emu):
    """kombu's worker exits on a 4xx poll; celeriac logs it, finds the queue
    again (creating it as at start) and goes on."""
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    w = sqs_worker(env, sqs_emu, prefix)
    sqs_emu.client().delete_queue(QueueUrl=sqs_emu.queue_url(prefix + "celery"))
    w.wait_for(r"ReceiveMessage on %scelery: HTTP 400" % prefix, 10)
    w.wait_for(r"created queue %scelery" % prefix, 10, count=2)
    r = app.send_task("llm.generate", args=["after the delete"])
    assert r.get(timeout=20) == env.fake.expected_text("after the delete")
    assert w.proc.poll() is None


PYAPP = textwrap.dedent('''
    import json, os, time
    from celery import Celery
    app = Celery("pyfleet", broker=os.environ["SQS_BROKER"], backend=os.environ["SQS_BACKEND"])
    app.conf.update(broker_connection_retry_on_startup=True,
                    broker_transport_options=json.loads(os.environ["SQS_TRANSPORT_OPTIONS"]))

    @app.task(name="llm.generate")
    def generate(prompt, **kw):
        time.sleep(0.05)
        return "py:" + prompt
''')


# Issue 33's mixed fleet: one Python worker (solo pool) and one celeriac on one
# queue, each task run once, none lost.
FLEET_TASKS = 1000
FLEET_CONCURRENCY = "10"
FLEET_LATENCY_MS = 20


def py_done(log_path):
    return sum(1 for l in log_path.read_text(errors="replace").splitlines() if "succeeded" in l)


def start_py_worker(env, emu, tmp_path, opts):
    """A Debian Celery worker (solo pool) running PYAPP's llm.generate on the
    emulator with the transport options `opts`; its process and log path.
    Not waited for: py_ready() does."""
    (tmp_path / "pyfleet.py").write_text(PYAPP)
    log_path = tmp_path / "py.log"
    penv = dict(os.environ, SQS_BROKER=emu.broker_url, SQS_BACKEND=env.backend,
                SQS_TRANSPORT_OPTIONS=json.dumps(opts))
    with open(log_path, "w") as log:
        py = subprocess.Popen([PY, "-m", "celery", "-A", "pyfleet", "worker", "-P", "solo",
                               "--without-gossip", "--without-mingle", "-n",
                               "py-%s@%%h" % uuid.uuid4().hex[:6], "-l", "info"],
                              cwd=str(tmp_path), env=penv, stdout=log,
                              stderr=subprocess.STDOUT)
    return py, log_path


def py_ready(py, log_path):
    wait_until(lambda: "ready." in log_path.read_text() or py.poll() is not None, 60,
               what="the Python worker")
    assert py.poll() is None, log_path.read_text()[-3000:]


def py_stop(py):
    py.terminate()
    try:
        py.wait(20)
    except subprocess.TimeoutExpired:
        py.kill()
        py.wait()


def test_mixed_fleet_with_a_python_worker_each_task_once(env, sqs_emu, tmp_path):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    py, log_path = start_py_worker(env, sqs_emu, tmp_path,
                                   sqs_emu.transport_options(queue_name_prefix=prefix))
    try:
        py_ready(py, log_path)
        env.fake.script(["latency_ms=%d;tokens=2" % FLEET_LATENCY_MS] * FLEET_TASKS)
        w = sqs_worker(env, sqs_emu, prefix, "-c", FLEET_CONCURRENCY, "--prefetch-multiplier", "1")
        t0 = time.time()
        rs = [app.send_task("llm.generate", args=["fleet %d" % i]) for i in range(FLEET_TASKS)]
        sent = time.time()
        wait_progress(lambda: w.count(r"Task llm.generate\[.*\] succeeded") + py_done(log_path),
                      FLEET_TASKS, stall=20, cap=120, what="the fleet's tasks")
        out = [r.get(timeout=30) for r in rs]
        by_py = sum(1 for o in out if o.startswith("py:"))
        print("mixed fleet: %d tasks sent in %.1f s, all done in %.1f s, %d by Python"
              % (FLEET_TASKS, sent - t0, time.time() - t0, by_py))
        assert 0 < by_py < FLEET_TASKS, by_py
        time.sleep(0.5)
        ran_here = w.count(r"Task llm.generate\[.*\] succeeded")
        assert ran_here == FLEET_TASKS - by_py
        assert len([c for c in env.fake.stats() if c["path"].startswith("/v1/")]) == ran_here
        assert py_done(log_path) == by_py
        wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="all deleted")
    finally:
        py_stop(py)


def test_kill_9_mid_task_a_python_worker_completes_it(env, sqs_emu, tmp_path):
    """Row 14: celeriac killed during a task it acks late; the message comes
    back after the queue's visibility timeout (3 s) and a Python worker
    completes it, once."""
    prefix = sqs_emu.prefix()
    opts = sqs_emu.transport_options(queue_name_prefix=prefix, visibility_timeout=3)
    app = sqs_emu.make_app(env.backend, prefix=prefix, transport_options={"visibility_timeout": 3})
    hold = "p" + prefix
    env.fake.script(["hold=%s;tokens=2" % hold])
    w = env.worker("-b", sqs_emu.broker_url, "--broker-transport-options", json.dumps(opts))
    r = app.send_task("llm.generate", args=["killed"])
    wait_until(lambda: env.fake.held(hold) == 1, 10, what="running")
    t_kill = time.time()
    w.signal(signal.SIGKILL)
    w.wait(10)
    env.fake.release(hold)
    py, log_path = start_py_worker(env, sqs_emu, tmp_path, opts)
    try:
        assert r.get(timeout=30) == "py:killed"
        # Not before the visibility timeout: celeriac pushed it back to 3 s
        # every 1 s (vt/3) while it held the message, so it reappears 2 to 3 s
        # after the kill (less a little for the emulator's clock).
        assert time.time() - t_kill >= 1.8
        # The result is in Redis before the Python worker's "succeeded" line
        # reaches its log file: wait for the line, then check it is the only one.
        wait_until(lambda: py_done(log_path) >= 1, 15, interval=0.2,
                   what="the Python worker's succeeded line")
        assert py_done(log_path) == 1
        assert env.meta(r.id)["status"] == "SUCCESS"
        wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="deleted")
    finally:
        py_stop(py)


class FaultyFront:
    """An HTTP front to the emulator that answers the first calls of chosen
    actions with a 5xx (as SQS does when throttled or failing) and passes
    everything else on. SigV4 is not checked by the emulator, so the host the
    worker signs for can be the front's."""

    def __init__(self, emu, faults):
        import http.server
        import threading
        self.faults = dict(faults)  # action -> (status, count)
        self.seen = []
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action = (self.headers.get("X-Amz-Target") or "").split(".")[-1]
                status, left = front.faults.get(action, (0, 0))
                if left > 0:
                    front.faults[action] = (status, left - 1)
                    front.seen.append((action, status))
                    out = json.dumps({"__type": "com.amazonaws.sqs#InternalError",
                                      "message": "injected"}).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-amz-json-1.0")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                req = urllib.request.Request(emu.endpoint + "/", data=body, method="POST")
                for k in ("Content-Type", "X-Amz-Target", "Authorization", "X-Amz-Date"):
                    if self.headers.get(k):
                        req.add_header(k, self.headers[k])
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        status, out = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, out = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_sqs_5xx_on_every_call_is_retried(env, sqs_emu):
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    front = FaultyFront(sqs_emu, {"ReceiveMessage": (503, 2), "DeleteMessageBatch": (500, 2),
                                  "SendMessage": (503, 1)})
    try:
        env.fake.script(["status=429;ra=1", "tokens=4"])
        opts = sqs_emu.transport_options(queue_name_prefix=prefix)
        w = env.worker("-b", "sqs://test:test@127.0.0.1:%d" % front.port,
                       "--broker-transport-options", json.dumps(opts))
        r = app.send_task("llm.generate", args=["through faults"])
        assert r.get(timeout=30) == env.fake.expected_text("through faults", tokens=4)
        wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 10,
                   what="deleted in the end")
        assert sorted(set(front.seen)) == [("DeleteMessageBatch", 500),
                                           ("ReceiveMessage", 503), ("SendMessage", 503)]
        assert w.count(r"ReceiveMessage on %scelery: HTTP 503" % prefix) == 2
        assert w.proc.poll() is None
    finally:
        front.close()


def sqs_gateway(env, emu, prefix, *args):
    from test_gateway import Gateway
    opts = emu.transport_options(queue_name_prefix=prefix)
    # the later -b wins over the env's broker that Gateway() puts first
    return Gateway(env, "-b", emu.broker_url, "--broker-transport-options", json.dumps(opts),
                   *args)


def test_gateway_submits_through_sqs_and_streams(env, sqs_emu):
    from test_gateway import read_all, text_of
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    sqs_worker(env, sqs_emu, prefix)
    gw = sqs_gateway(env, sqs_emu, prefix)
    try:
        env.fake.script(["tps=40;tokens=12"])
        tid = gw.submit(task="llm.generate", args=["through the gateway"])
        msgs = read_all(gw.stream(tid))
        final = msgs[-1]
        assert final["type"] == "result" and final["state"] == "SUCCESS", final
        assert text_of(msgs) == final["result"]
        assert app.AsyncResult(tid).get(timeout=10) == final["result"]
        wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="deleted")
        # nothing the gateway does needs fanout: no line about it
        assert "fanout" not in "\n".join(gw.lines)
    finally:
        assert gw.stop() == 0, "\n".join(gw.lines[-30:])


def test_gateway_message_on_sqs_matches_python(env, sqs_emu):
    """No worker: both envelopes read raw from the mangled queue."""
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    gw = sqs_gateway(env, sqs_emu, prefix, "-Q", "celery,llm.high")
    try:
        tid = gw.submit(task="llm.generate", args=["raw", 2], kwargs={"k": 1.5},
                        queue="llm.high", priority=2)
        py = app.send_task("llm.generate", args=("raw", 2), kwargs={"k": 1.5},
                           queue="llm.high", priority=2)
        url = sqs_emu.queue_url(prefix + "llm-high")
        got = []

        def both():
            m = sqs_emu.client().receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                 WaitTimeSeconds=1)
            got.extend(json.loads(base64.b64decode(x["Body"])) for x in m.get("Messages", []))
            return len(got) >= 2
        wait_until(both, 10, what="both messages")
        ours, theirs = sorted(got, key=lambda e: e["headers"]["id"] != tid)
        assert ours["headers"]["id"] == tid and theirs["headers"]["id"] == py.id
        assert ours["body"] == theirs["body"]
        assert sorted(ours) == sorted(theirs)
        for k in ("content-type", "content-encoding"):
            assert ours[k] == theirs[k], k
        added = [h for h in theirs["headers"] if h not in ours["headers"]]
        assert set(added) <= {"replaced_task_nesting", "stamped_headers", "stamps"}, added
        for k in ("lang", "task", "retries", "argsrepr", "kwargsrepr", "root_id"):
            assert ours["headers"][k] == (tid if k == "root_id" else theirs["headers"][k]), k
        po, pt = ours["properties"], theirs["properties"]
        assert po["delivery_info"] == pt["delivery_info"]
        assert po["delivery_info"]["routing_key"] == "llm.high"
        for k in ("delivery_mode", "priority", "body_encoding"):
            assert po.get(k) == pt.get(k), k
    finally:
        assert gw.stop() == 0, "\n".join(gw.lines[-30:])


def test_gateway_refuses_a_bad_sqs_option_at_once(sqs_emu):
    from conftest import BIN
    # a dead result backend: the option is what the gateway reports, at once,
    # not a wait for Redis followed by it
    dead = "redis://127.0.0.1:%d/0" % free_port()
    for opts, want in ((dict(region="us-east-1", visiblity_timeout=60),
                        "unknown broker transport option 'visiblity_timeout'"),
                       (dict(region="us-east-1", wait_time_seconds=30),
                        "'wait_time_seconds' is out of range")):
        t0 = time.time()
        p = subprocess.run([BIN, "gateway", "-b", sqs_emu.broker_url, "--result-backend", dead,
                            "--broker-transport-options", json.dumps(opts), "--port", "0"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 1 and want in p.stdout + p.stderr, p.stdout + p.stderr
        assert time.time() - t0 < 3


# ------------------------------------------------- the checklist's other rows
# (sqs-broker.md section 13; the row -> test table is in the README's SQS section)

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fixtures", "sqs")


def fixture_envelope(task, args, eta=None, **props):
    """The envelope a Celery 5.6.3 client sends (tests/fixtures/sqs), made
    fresh: new ids, our task and args, `eta` (a datetime or None), and extra
    properties (5.6 copies apply_async's DelaySeconds there too)."""
    from datetime import timezone
    with open(os.path.join(FIXTURES, "env_celery563_countdown.json")) as f:
        env = json.load(f)
    tid = str(uuid.uuid4())
    body = [list(args), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    env["body"] = base64.b64encode(json.dumps(body).encode()).decode()
    h = env["headers"]
    h.update(task=task, id=tid, root_id=tid, argsrepr=repr(tuple(args)),
             eta=eta.astimezone(timezone.utc).isoformat() if eta else None)
    env["properties"].update(correlation_id=tid, delivery_tag=str(uuid.uuid4()), **props)
    return tid, env


def decoded(body):
    """A MessageBody as text: base64 decoded, or as it is (a raw envelope)."""
    try:
        return base64.b64decode(body, validate=True).decode()
    except ValueError:
        return body


def sent_and_received(emu, body, since):
    """When the emulator answered the SendMessage of `body`, and the first
    ReceiveMessage that handed it out (ms since the epoch; None: not yet)."""
    sent = [e["t"] + e["ms"] for e in emu.requests("SendMessage", since)
            if e["params"].get("MessageBody") == body]
    got = [e["t"] + e["ms"] for e in emu.requests("ReceiveMessage", since)
           if body in (e.get("response") or "")]
    return (sent[0] if sent else None), (min(got) if got else None)


def test_celery_563_raw_json_and_countdown_messages_execute(env, sqs_emu):
    """Rows 6 and 12: a 5.6.3 client's message with DelaySeconds (base64
    envelope, sent as boto3 sends it) waits in SQS for its delay, then runs
    at its eta; a raw-JSON envelope runs; a Debian client's countdown task
    is received at once, held unacked (invisible, not deleted) until its eta,
    run, then deleted."""
    from datetime import datetime, timedelta, timezone
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    w = sqs_worker(env, sqs_emu, prefix)
    url = sqs_emu.queue_url(prefix + "celery")
    mark = sqs_emu.mark()
    t0 = time.time()
    held = app.send_task("llm.generate", args=["held here"], countdown=3)
    eta = datetime.now(timezone.utc) + timedelta(seconds=2)
    delayed_id, delayed = fixture_envelope("llm.generate", ["delayed by sqs"], eta=eta,
                                           DelaySeconds=2)
    delayed_body = base64.b64encode(json.dumps(delayed).encode()).decode()
    raw_id, raw = fixture_envelope("llm.generate", ["raw json"])
    sqs = sqs_emu.client()
    sqs.send_message(QueueUrl=url, MessageBody=delayed_body, DelaySeconds=2)
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(raw))
    # the raw one runs at once; the countdown one is held meanwhile
    r_raw = app.AsyncResult(raw_id)
    assert r_raw.get(timeout=10) == env.fake.expected_text("raw json")
    w.wait_for(r"Task llm.generate\[%s\] received" % held.id, 5)
    assert env.meta(held.id) is None
    assert visible(sqs_emu, prefix + "celery")[1] >= 1  # in flight, unacked
    r_delayed = app.AsyncResult(delayed_id)
    assert r_delayed.get(timeout=10) == env.fake.expected_text("delayed by sqs")
    assert held.get(timeout=10) == env.fake.expected_text("held here")
    by_prompt = {e["prompt"]: e["t"] for e in env.fake.stats() if e["path"].startswith("/v1/")}
    assert by_prompt["held here"] - t0 >= 2.9
    assert by_prompt["delayed by sqs"] >= eta.timestamp() - 0.05
    # SQS held the 5.6 message for its DelaySeconds: no receive of it before
    sent, got = sent_and_received(sqs_emu, delayed_body, mark)
    assert sent and got and got - sent >= 1900, (sent, got)
    # the countdown task was deleted only after it ran
    wait_until(lambda: visible(sqs_emu, prefix + "celery") == (0, 0), 5, what="all deleted")
    ran = by_prompt["held here"] * 1000
    held_send = [e for e in sqs_emu.requests("SendMessage", mark)
                 if held.id in decoded(e["params"]["MessageBody"])]
    _, held_got = sent_and_received(sqs_emu, held_send[0]["params"]["MessageBody"], mark)
    assert held_got and held_got < ran - 1500  # received well before its eta
    deletes = [e["t"] for e in sqs_emu.requests("DeleteMessageBatch", mark)]
    assert deletes and max(deletes) >= ran
    assert w.count(r"Task llm.generate\[.*\] succeeded") == 3


def test_countdown_retry_carries_delay_seconds_except_on_fifo(env, sqs_emu):
    """Section 14: a retry celeriac publishes with a 2-s countdown carries
    DelaySeconds 1 (the whole seconds to its eta; the worker holds the rest)
    on a standard queue, and SQS keeps it out of sight that long; on a FIFO
    queue, which refuses a per-message delay, it carries none and the worker
    holds it. Both run at their eta, once."""
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    w = sqs_worker(env, sqs_emu, prefix, "-Q", "celery,jobs.fifo")
    for queue, sqs_name in (("celery", prefix + "celery"), ("jobs.fifo", prefix + "jobs.fifo")):
        env.fake.script(["status=429;ra=2", "tokens=4"])
        mark = sqs_emu.mark()
        r = app.send_task("llm.generate", args=["later on " + queue], queue=queue)
        assert r.get(timeout=20) == env.fake.expected_text("later on " + queue, tokens=4)
        sends = [e for e in sqs_emu.requests("SendMessage", mark) if e["json"]]
        assert len(sends) == 1, sends
        p = sends[0]["params"]
        assert p["QueueUrl"] == sqs_emu.queue_url(sqs_name)
        envl = json.loads(base64.b64decode(p["MessageBody"]))
        assert envl["headers"]["id"] == r.id and envl["headers"]["retries"] == 1
        from datetime import datetime
        eta = datetime.fromisoformat(envl["headers"]["eta"]).timestamp()
        calls = [e for e in env.fake.stats() if e["path"].startswith("/v1/")]
        assert calls[-1]["t"] >= eta - 0.05
        if queue == "celery":
            assert p["DelaySeconds"] == 1, p
            sent, got = sent_and_received(sqs_emu, p["MessageBody"], mark)
            assert got - sent >= 950, (sent, got)
        else:
            assert "DelaySeconds" not in p and p["MessageGroupId"] == "default", p
        assert w.count(r"Task llm.generate\[%s\] succeeded" % r.id) == 1
        wait_until(lambda: visible(sqs_emu, sqs_name) == (0, 0), 5, what="deleted")


def test_no_remote_control_or_events_on_sqs(env, sqs_emu, tmp_path):
    """Rows 17 and 18: with task events asked for (-E), celeriac sends no
    event traffic to SQS (no queue, no SendMessage: SQS has no fanout), and
    `celery inspect ping` against it times out as against Python workers
    (exit 69, "No nodes replied"), celeriac never touching the client's
    `<uuid>-reply-celery-pidbox` queue."""
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    mark = sqs_emu.mark()
    w = sqs_worker(env, sqs_emu, prefix, "-E")
    assert "remote control and events are off" in w.log()
    r = app.send_task("llm.generate", args=["no events"])
    assert r.get(timeout=20) == env.fake.expected_text("no events")
    (tmp_path / "pingapp.py").write_text(textwrap.dedent('''
        import json, os
        from celery import Celery
        app = Celery("pingapp", broker=os.environ["SQS_BROKER"])
        app.conf.update(broker_transport_options=json.loads(os.environ["SQS_TRANSPORT_OPTIONS"]))
    '''))
    penv = dict(os.environ, SQS_BROKER=sqs_emu.broker_url, SQS_TRANSPORT_OPTIONS=json.dumps(
        sqs_emu.transport_options(queue_name_prefix=prefix)))
    t0 = time.time()
    ping = subprocess.run([PY, "-m", "celery", "-A", "pingapp", "inspect", "ping", "-t", "1"],
                          cwd=str(tmp_path), env=penv, capture_output=True, text=True,
                          timeout=60)
    assert ping.returncode == 69, (ping.returncode, ping.stdout, ping.stderr)
    assert "No nodes replied within time constraint" in ping.stdout + ping.stderr
    assert time.time() - t0 < 30
    time.sleep(1.5)  # one more poll of the worker's, logged
    names = [u.rsplit("/", 1)[1] for u in
             sqs_emu.client().list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])]
    assert any(n.endswith("-reply-celery-pidbox") for n in names), names  # the client's
    # celeriac's requests (the JSON protocol; Debian's boto3 speaks the query one)
    ours = [e for e in sqs_emu.requests(since=mark) if e["json"]]
    assert ours and all(prefix in json.dumps(e["params"]) for e in ours)
    touched = {e["params"].get("QueueUrl") or e["params"].get("QueueName") for e in ours}
    assert touched <= {sqs_emu.queue_url(prefix + "celery"), prefix + "celery",
                       sqs_emu.queue_url(prefix + "celeriac-dead"), prefix + "celeriac-dead"}, \
        touched
    assert not [e for e in ours if e["action"] == "SendMessage"]
    assert not [e for e in ours if re.search("celeryev|pidbox", e["body"] or "")]
    assert w.proc.poll() is None


def test_acks_late_by_default_early_with_acks_early(env, sqs_emu):
    """Row 8: celeriac acks after the result is stored (Celery's acks_late),
    so no DeleteMessageBatch while the task runs; with --acks-early the
    delete is sent when the task starts, while it still runs."""
    prefix = sqs_emu.prefix()
    app = sqs_emu.make_app(env.backend, prefix=prefix)
    for early in (False, True):
        hold = ("e" if early else "l") + prefix
        env.fake.script(["hold=%s;tokens=2" % hold])
        w = sqs_worker(env, sqs_emu, prefix, *(["--acks-early"] if early else []))
        mark = sqs_emu.mark()
        r = app.send_task("llm.generate", args=["ack %s" % early])
        wait_until(lambda: env.fake.held(hold) == 1, 10, what="running")
        if early:
            wait_until(lambda: sqs_emu.requests("DeleteMessageBatch", mark), 5,
                       what="the early ack")
        else:
            time.sleep(1.0)
            assert not sqs_emu.requests("DeleteMessageBatch", mark)
        assert env.meta(r.id) is None  # still running
        env.fake.release(hold)
        assert r.get(timeout=10)
        wait_until(lambda: sqs_emu.requests("DeleteMessageBatch", mark), 5, what="the ack")
        assert len(sqs_emu.requests("DeleteMessageBatch", mark)) == 1
        w.stop()


def test_predefined_queues_are_taken_as_given(env, sqs_emu):
    """Row 5: with predefined_queues the worker sends no ListQueues,
    CreateQueue or GetQueueUrl, and a queue not defined there is refused."""
    from conftest import BIN
    name = sqs_emu.prefix() + "jobs"
    defined = {q: {"url": sqs_emu.client().create_queue(QueueName=q)["QueueUrl"]}
               for q in (name, name + "-dead")}
    opts = sqs_emu.transport_options(predefined_queues=defined)
    app = sqs_emu.make_app(env.backend, transport_options={"predefined_queues": defined})
    mark = sqs_emu.mark()
    env.worker("-b", sqs_emu.broker_url, "--broker-transport-options", json.dumps(opts),
               "-Q", name, "--dead-letter-queue", name + "-dead")
    r = app.send_task("llm.generate", args=["predefined"], queue=name)
    assert r.get(timeout=20) == env.fake.expected_text("predefined")
    # the ack goes in the next batch, after the result is stored
    wait_until(lambda: sqs_emu.requests("DeleteMessageBatch", mark), 5, what="the ack")
    ours = [e["action"] for e in sqs_emu.requests(since=mark) if e["json"]]
    assert "ReceiveMessage" in ours and "DeleteMessageBatch" in ours, ours
    assert not set(ours) & {"ListQueues", "CreateQueue", "GetQueueUrl"}, ours
    p = subprocess.run([BIN, "worker", "-b", sqs_emu.broker_url, "--result-backend",
                        env.backend, "--broker-transport-options", json.dumps(opts),
                        "-Q", name + "," + name + "-other", "--dead-letter-queue",
                        name + "-dead"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0, p.stdout + p.stderr
    assert name + "-other" in p.stdout + p.stderr and "predefined" in p.stdout + p.stderr, \
        p.stdout + p.stderr
