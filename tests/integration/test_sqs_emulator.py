"""The SQS test harness itself: the local emulator (scripts/sqs_emu.js, the
`sqs_emu` fixture) serves boto3, and a real Debian Celery 5.2.6 worker
(kombu 5.2.4's SQS transport) consumes from it what a Celery client sends
over sqs://, results coming back through the test process's Redis.

These are the base of the SQS transport's own tests: a test that needs a
Python worker on the emulator takes `py_sqs` (one worker for the whole file,
on a queue prefix of its own). The request log shows what each side sent.
"""
import base64
import json
import os
import subprocess
import textwrap
import time
import uuid

import pytest

from conftest import PY, next_result_db, wait_until

# The module fixture's worker is started once: keep the file on one xdist worker.
pytestmark = pytest.mark.xdist_group("sqs_emulator")

SQSAPP = textwrap.dedent('''
    """The Python side: a Debian Celery worker on the SQS emulator."""
    import json
    import os
    import time

    from celery import Celery

    app = Celery("sqsapp", broker=os.environ["SQS_BROKER"], backend=os.environ["SQS_BACKEND"])
    app.conf.update(result_expires=3600, broker_connection_retry_on_startup=True,
                    broker_transport_options=json.loads(os.environ["SQS_TRANSPORT_OPTIONS"]))

    @app.task(name="sqsapp.add")
    def add(x, y):
        return x + y

    @app.task(name="sqsapp.stamp", bind=True)
    def stamp(self):
        """When it ran, and the delivery the worker saw."""
        return {"ran_at": time.time(), "routing_key": self.request.delivery_info.get("routing_key")}
''')

# The queues the worker consumes: the default one, and a dotted name (kombu
# turns the dots into dashes on SQS).
QUEUES = ("celery", "llm.high")


class PySqs:
    """The file's Python worker and a client app, on one queue prefix."""

    def __init__(self, emu, backend, tmp):
        self.emu = emu
        self.prefix = emu.prefix()
        self.backend = backend
        self.log_path = tmp / "worker.log"
        (tmp / "sqsapp.py").write_text(SQSAPP)
        env = dict(os.environ, SQS_BROKER=emu.broker_url, SQS_BACKEND=backend,
                   SQS_TRANSPORT_OPTIONS=json.dumps(
                       emu.transport_options(queue_name_prefix=self.prefix)))
        self._log = open(self.log_path, "w")
        # -P solo, no gossip or mingle (SQS has neither): the setup the
        # emulator's notes were verified with.
        self.proc = subprocess.Popen(
            [PY, "-m", "celery", "-A", "sqsapp", "worker", "-P", "solo", "--without-gossip",
             "--without-mingle", "-Q", ",".join(QUEUES), "-n", "py-%s@%%h" % uuid.uuid4().hex[:6],
             "-l", "info"],
            cwd=str(tmp), env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.app = emu.make_app(backend, prefix=self.prefix)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout=60):
        wait_until(lambda: "ready." in self.log() or self.proc.poll() is not None, timeout,
                   what="the Python worker on SQS")
        assert self.proc.poll() is None, "the Python worker exited:\n" + self.log()[-3000:]

    def get(self, result, timeout=30):
        """The task's result; at once when the worker has died, with why (its log)."""
        deadline = time.time() + timeout
        while not result.ready() and self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if not result.ready():
            raise AssertionError("%s: no result; worker %s, its log ends:\n%s" % (
                result.id, "running" if self.proc.poll() is None else
                "exited %s" % self.proc.returncode, self.log()[-3000:]))
        return result.get(timeout=5)

    def sqs_name(self, queue):
        return (self.prefix + queue).replace(".", "-")

    def stop(self):
        try:
            self.app.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def py_sqs(sqs_emu, services, tmp_path_factory):
    w = PySqs(sqs_emu, services.redis_url(next_result_db()), tmp_path_factory.mktemp("py-sqs"))
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()
        print("\n----- python SQS worker log (end) -----\n" + w.log()[-2000:])


def envelope(send):
    """The kombu envelope of a logged SendMessage (base64 of JSON)."""
    return json.loads(base64.b64decode(send["params"]["MessageBody"]))


def sends_of(emu, task_id, since=0):
    return [s for s in emu.requests("SendMessage", since)
            if envelope(s)["headers"]["id"] == task_id]


def test_boto3_round_trip(sqs_emu):
    sqs = sqs_emu.client()
    name = sqs_emu.prefix() + "plain"
    mark = sqs_emu.mark()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == sqs_emu.queue_url(name)
    sent = sqs.send_message(QueueUrl=url, MessageBody="hello sqs")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1,
                              AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert [m["Body"] for m in got] == ["hello sqs"]
    assert got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesNotVisible"]) \
        == ("0", "0")
    # boto3 names the queue in every request: the front leaves them alone.
    log = sqs_emu.requests(since=mark)
    assert [e["action"] for e in log] == ["CreateQueue", "SendMessage", "ReceiveMessage",
                                          "DeleteMessage", "GetQueueAttributes"]
    assert all(e["status"] == 200 and e["added_queue_url"] is None and not e["json"]
               for e in log), log


def test_python_worker_runs_a_task(sqs_emu, py_sqs):
    mark = sqs_emu.mark()
    r = py_sqs.app.send_task("sqsapp.add", (2, 3))
    assert py_sqs.get(r) == 5
    q = py_sqs.sqs_name("celery")
    (send,) = sends_of(sqs_emu, r.id, mark)
    assert send["params"]["QueueUrl"] == sqs_emu.queue_url(q)
    assert envelope(send)["properties"]["delivery_info"] == {"exchange": "", "routing_key": "celery"}
    # The worker's receive goes to the queue's URL without QueueUrl: the front
    # added it (without it the emulator answers NonExistentQueue and the
    # worker stops), and the message came back in one of those.
    polls = [e for e in sqs_emu.requests("ReceiveMessage", mark)
             if e["path"] == "/%s/%s" % (sqs_emu.ACCOUNT, q)]
    assert polls and all(e["added_queue_url"] == sqs_emu.queue_url(q) for e in polls)
    assert any(send["params"]["MessageBody"] in e["response"] for e in polls)
    # Acked after the task (solo pool): one DeleteMessage on that queue.
    wait_until(lambda: any(d["params"].get("QueueUrl") == sqs_emu.queue_url(q)
                           for d in sqs_emu.requests("DeleteMessage", mark)),
               10, what="the ack")


def test_countdown_task_completes(sqs_emu, py_sqs):
    mark = sqs_emu.mark()
    t0 = time.time()
    r = py_sqs.app.send_task("sqsapp.stamp", countdown=2)
    ran_at = py_sqs.get(r)["ran_at"]
    assert ran_at >= t0 + 2 - 0.05  # held by the worker until its ETA
    (send,) = sends_of(sqs_emu, r.id, mark)
    # The countdown travels only as the eta header, never as SQS DelaySeconds.
    assert envelope(send)["headers"]["eta"]
    assert "DelaySeconds" not in send["params"]


def test_dotted_queue_name_mangled(sqs_emu, py_sqs):
    """Celery's `llm.high` under the prefix is SQS's `<prefix>llm-high`; the
    envelope keeps the Celery name."""
    mark = sqs_emu.mark()
    r = py_sqs.app.send_task("sqsapp.stamp", queue="llm.high")
    assert py_sqs.get(r)["routing_key"] == "llm.high"
    q = py_sqs.sqs_name("llm.high")
    assert q == py_sqs.prefix + "llm-high"
    # Both sides created it under the mangled name (the client at its first
    # publish, or the worker at its start, before this test's mark).
    created = [e["params"]["QueueName"] for e in sqs_emu.requests("CreateQueue")]
    assert q in created and not any("." in n for n in created if n.startswith(py_sqs.prefix))
    (send,) = sends_of(sqs_emu, r.id, mark)
    assert send["params"]["QueueUrl"] == sqs_emu.queue_url(q)
    assert envelope(send)["properties"]["delivery_info"]["routing_key"] == "llm.high"
    assert any(e["path"] == "/%s/%s" % (sqs_emu.ACCOUNT, q)
               for e in sqs_emu.requests("ReceiveMessage", mark))
