"""What RabbitMQ 4.3's defaults ask of a worker, on whichever node the run has.

`make test` runs these on Debian's RabbitMQ 3.10; `make test-rabbitmq4` runs them
(with the core, reliability, monitoring, canvas and quorum files) on RabbitMQ 4
configured as 4.3 ships: transient non-exclusive queues and global QoS denied
(CELERIAC_RABBITMQ_43=1, scripts/services.sh). Each test holds on both nodes."""
import os
import signal
import uuid

import amqp

from conftest import wait_until

DENIED = bool(os.environ.get("CELERIAC_RABBITMQ_43"))


def _amqp_conn(env):
    c = amqp.Connection(host="127.0.0.1:%d" % env.services.amqp_port, userid="guest",
                        password="guest", virtual_host=env.vhost)
    c.connect()
    return c


def _ping(app, name, timeout=2.0):
    return (app.control.inspect(destination=[name], timeout=timeout).ping() or {}).get(name)


def _queues(env):
    """name -> (durable, exclusive, auto_delete) of the test's vhost."""
    out = env.services.ctl("list_queues", "-p", env.vhost, "name", "durable", "exclusive",
                           "auto_delete").stdout
    res = {}
    for line in out.splitlines():
        p = line.split("\t")
        if len(p) >= 2 and p[0] != "name":
            # a quorum queue leaves the last columns empty on some versions
            res[p[0]] = tuple((p[i] if i < len(p) else "") == "true" for i in (1, 2, 3))
    return res


def test_every_queue_the_worker_declares_is_durable_or_exclusive(env):
    """RabbitMQ 4.3 refuses a queue that is neither durable nor exclusive; the
    worker's mailbox is exclusive (as Celery 5.7's kombu declares it), and its
    other queues (task, park, dead-letter, delayed-delivery) are durable."""
    name = "celeriac-q43-%s@h" % uuid.uuid4().hex[:6]
    w = env.worker("-n", name, "--delayed-delivery", "on")
    assert _ping(env.app, name) == {"ok": "pong"}
    qs = wait_until(lambda: (lambda q: q if name + ".celery.pidbox" in q else None)(_queues(env)),
                    timeout=20, what="the mailbox queue")
    assert qs[name + ".celery.pidbox"][1], qs  # exclusive
    for q, (durable, exclusive, _) in qs.items():
        assert durable or exclusive, "transient shared queue %s: %r" % (q, qs)
    assert {"celery", "celeriac.dead"} <= set(qs), qs
    assert any(q.startswith("celery_delayed_") for q in qs), qs
    assert w.count(r"connection to broker lost|cannot connect") == 0, w.log()


def test_mailbox_held_by_another_connection_is_consumed_under_a_name_of_its_own(env):
    """A worker killed with -9 (or cut off) and started again at once under the
    same name finds its exclusive mailbox still held by the old connection
    until the broker drops it: 405 RESOURCE_LOCKED. A Python connection holding
    that queue stands in for the old one, deterministically. The worker must
    come up and answer remote control all the same, and serve tasks."""
    name = "celeriac-lock-%s@h" % uuid.uuid4().hex[:6]
    holder = _amqp_conn(env)
    try:
        ch = holder.channel()
        ch.queue_declare(name + ".celery.pidbox", durable=False, exclusive=True,
                         auto_delete=True)
        w = env.worker("-n", name)
        assert w.count(r"still held by an earlier connection; consuming it as") == 1, w.log()
        assert _ping(env.app, name) == {"ok": "pong"}
        assert env.app.send_task("llm.generate", args=["locked mailbox"]).get(timeout=30)
        assert w.count(r"connection to broker lost|cannot connect") == 0, w.log()
    finally:
        holder.close()


def test_killed_and_started_again_at_once_under_the_same_name_answers_ping(env):
    name = "celeriac-k9-%s@h" % uuid.uuid4().hex[:6]
    w = env.worker("-n", name)
    assert _ping(env.app, name) == {"ok": "pong"}
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait(timeout=10)
    w2 = env.worker("-n", name)
    wait_until(lambda: _ping(env.app, name) == {"ok": "pong"}, timeout=30, interval=0.5,
               what="the restarted worker to answer ping")
    assert env.app.send_task("llm.generate", args=["after kill -9"]).get(timeout=30)
    assert w2.proc.poll() is None


def test_a_consumer_the_broker_cancels_is_consumed_again_without_a_reconnect(env):
    """The broker cancels a consumer when its queue is deleted and, on RabbitMQ
    4.3, when a delivery outlives a quorum queue's consumer timeout. The worker
    answers, declares the queue again and consumes it again on the same
    connection; before, it dropped both connections and reconnected."""
    w = env.worker("-c", "4")
    assert env.app.send_task("llm.generate", args=["before"]).get(timeout=30)
    env.services.ctl("delete_queue", "-p", env.vhost, "celery")
    w.wait_for(r"broker cancelled the consumer of queue 'celery'; consuming it again",
               timeout=30)
    wait_until(lambda: env.queue_depth("celery") is not None, timeout=30,
               what="the queue declared again")
    rs = [env.app.send_task("llm.generate", args=["after %d" % i]) for i in range(10)]
    for r in rs:
        assert r.get(timeout=60)
    assert w.count(r"connection to broker lost") == 0, w.log()


def test_global_qos_is_decided_by_what_the_broker_does(env):
    """Global QoS is asked of the broker, not read from its version: a node
    that denies it (4.3's default) gets per-consumer windows with one warning;
    one that honours it keeps the channel-wide window, silently."""
    w = env.worker("-c", "4")
    said = w.count(r"broker applies global QoS per consumer")
    if DENIED:
        assert said == 1, w.log()
    else:
        assert said == 0, w.log()
    # Either way, the window holds: 4 running at most, every task answered.
    rs = [env.app.send_task("llm.generate", args=["qos %d" % i]) for i in range(12)]
    for r in rs:
        assert r.get(timeout=60)


def _node_version(env):
    out = env.services.ctl("version").stdout.strip()
    major, minor = (int(x) for x in out.split(".")[:2])
    return major, minor


def test_task_consumers_carry_a_consumer_timeout_a_minute_past_the_park(env):
    """A delivery held past --park-after is parked and acked so that the
    broker's consumer timeout never fires; a node whose consumer_timeout is
    shorter would close the channel first. On a node that takes a
    per-consumer timeout (3.12+), each task consumer asks for one a minute
    past the park; the mailbox (no acks) asks for none."""
    w = env.worker("--park-after", "120")
    assert env.app.send_task("llm.generate", args=["timeout arg"]).get(timeout=30)
    out = env.services.ctl("list_consumers", "-p", env.vhost, "queue_name",
                           "arguments").stdout
    rows = [l.split("\t") for l in out.splitlines() if "\t" in l]
    task = [r for r in rows if r[0] == "celery"]
    mailbox = [r for r in rows if r[0].endswith(".celery.pidbox")]
    assert task and mailbox, out
    if _node_version(env) >= (3, 12):
        assert "x-consumer-timeout" in task[0][1] and "180000" in task[0][1], out
    else:
        assert "x-consumer-timeout" not in task[0][1], out
    assert "x-consumer-timeout" not in mailbox[0][1], out
    assert w.proc.poll() is None
