"""Issue 15: Redis as the broker -- kombu's Redis transport, exactly, with
Python producers, Python clients (inspect, control, events) and celeriac on
one Redis. The broker shares the result backend's db: kombu's keys and
celery-task-meta-* never collide, and the env fixture flushes it per test."""
import json
import signal
import subprocess
import time
import uuid

import redis
from celery import Celery

from conftest import wait_until

SEP = "\x06\x16"


def rapp(env, **opts):
    app = Celery("rb", broker=env.backend, backend=env.backend)
    app.conf.update(result_expires=3600, broker_connection_retry_on_startup=True)
    if opts:
        app.conf.broker_transport_options = opts
    return app


def rworker(env, *args, opts=None, **kw):
    extra = ["-b", env.backend]
    if opts:
        extra += ["--broker-transport-options", json.dumps(opts)]
    return env.worker(*extra, *args, **kw)


PY_INSPECT = """
import json, sys
from celery import Celery
app = Celery(broker=sys.argv[1])
app.conf.broker_transport_options = json.loads(sys.argv[2])
print(json.dumps(getattr(app.control.inspect(timeout=float(sys.argv[4])), sys.argv[3])()))
"""


def py_inspect(env, method, opts=None, timeout=2):
    """`celery inspect <method>` from a Python process of its own, with the
    given transport options (a visibility timeout, a key prefix)."""
    out = subprocess.run(["/usr/bin/python3", "-c", PY_INSPECT, env.backend,
                          json.dumps(opts or {}), method, str(timeout)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def envelope(task_id, prompt, queue="celery", priority=0, tag=None, eta=None):
    """A task message as kombu 5.2 writes it (protocol 2)."""
    import base64
    body = json.dumps([[prompt], {}, {"callbacks": None, "errbacks": None,
                                      "chain": None, "chord": None}])
    return json.dumps({
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"lang": "py", "task": "llm.generate", "id": task_id, "shadow": None,
                    "eta": eta, "expires": None, "group": None, "group_index": None,
                    "retries": 0, "timelimit": [None, None], "root_id": task_id,
                    "parent_id": None, "argsrepr": repr((prompt,)), "kwargsrepr": "{}",
                    "origin": "test@host", "ignore_result": False},
        "properties": {"correlation_id": task_id, "reply_to": str(uuid.uuid4()),
                       "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue},
                       "priority": priority, "body_encoding": "base64",
                       "delivery_tag": tag or str(uuid.uuid4())}})


def test_send_task_and_delay_over_redis(env):
    app = rapp(env)
    rworker(env)
    r = app.send_task("llm.generate", args=["hello redis"])
    assert r.get(timeout=20) == env.fake.expected_text("hello redis")

    @app.task(name="llm.generate")
    def generate(prompt, **kw):
        raise AssertionError("runs on celeriac")

    r2 = generate.delay("via delay")
    assert r2.get(timeout=20) == env.fake.expected_text("via delay")
    # the binding kombu writes for the default queue, and nothing left unacked
    assert env.redis.smembers("_kombu.binding.celery") >= {
        ("celery" + SEP + SEP + "celery").encode()}
    wait_until(lambda: env.redis.hlen("unacked") == 0, 5, what="unacked emptied")
    assert env.redis.zcard("unacked_index") == 0


def test_unacked_entry_held_while_running(env):
    app = rapp(env)
    env.fake.script(["latency_ms=2500;tokens=3"])
    rworker(env)
    r = app.send_task("llm.generate", args=["slow one"])
    wait_until(lambda: env.redis.hlen("unacked") == 1, 10, what="unacked entry")
    (tag, value), = env.redis.hgetall("unacked").items()
    env_json, exchange, rk = json.loads(value)
    assert env_json["headers"]["id"] == r.id and exchange == "" and rk == "celery"
    assert env_json["properties"]["delivery_tag"] == tag.decode()
    score = env.redis.zscore("unacked_index", tag)
    assert abs(score - time.time()) < 10
    r.get(timeout=20)
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0,
               5, what="acked")


def test_priority_buckets_and_order_from_a_python_producer(env):
    app = rapp(env)
    # queued before any worker: 9 (least urgent on Redis) first, then 0
    low = app.send_task("llm.generate", args=["p9"], priority=9)
    high = app.send_task("llm.generate", args=["p0"], priority=0)
    assert env.redis.llen("celery" + SEP + "9") == 1 and env.redis.llen("celery") == 1
    w = rworker(env, "-c", "1", "--prefetch-multiplier", "1")
    high.get(timeout=20)
    low.get(timeout=20)
    order = [l for l in w.lines if "Task llm.generate[" in l and "received" in l]
    assert high.id in order[0] and low.id in order[1], order


def test_retry_is_republished_through_redis(env):
    app = rapp(env)
    env.fake.script(["status=429;ra=1", "tokens=4"])
    w = rworker(env)
    r = app.send_task("llm.generate", args=["retry me"], priority=3)
    assert r.get(timeout=20) == env.fake.expected_text("retry me", tokens=4)
    assert w.count(r"Retry in") >= 1 or env.meta(r.id)["status"] == "SUCCESS"
    wait_until(lambda: env.redis.hlen("unacked") == 0, 5, what="acked")


def test_eta_task_lease_refreshed_against_a_short_visibility_timeout(env):
    opts = {"visibility_timeout": 5}
    app = rapp(env, **opts)
    w = rworker(env, opts=opts)
    r = app.send_task("llm.generate", args=["later, once"], countdown=12)
    wait_until(lambda: env.redis.zcard("unacked_index") == 1, 10, what="held")
    time.sleep(7)
    # A Python client with the same 5 s visibility timeout restores what is
    # older than 5 s on its first poll: our lease keeps the score fresh.
    assert py_inspect(env, "ping", opts, timeout=1)
    assert env.redis.llen("celery") == 0
    assert r.get(timeout=20) == env.fake.expected_text("later, once")
    time.sleep(0.5)
    assert w.count(r"Task llm.generate\[%s\] received" % r.id) == 1
    assert len([s for s in env.fake.stats() if "later, once" in json.dumps(s["body"])]) == 1


def test_dead_workers_message_is_restored(env):
    app = rapp(env)
    tid = str(uuid.uuid4())
    tag = str(uuid.uuid4())
    e = envelope(tid, "orphan")
    # what a killed Python worker leaves behind: a record two hours old
    env.redis.hset("unacked", tag, json.dumps([json.loads(e), "", "celery"]))
    env.redis.zadd("unacked_index", {tag: time.time() - 7200})
    rworker(env)
    wait_until(lambda: env.meta(tid) and env.meta(tid)["status"] == "SUCCESS", 20,
               what="restored task ran")
    assert env.meta(tid)["result"] == env.fake.expected_text("orphan")
    wait_until(lambda: env.redis.hlen("unacked") == 0, 5, what="acked")
    assert not env.redis.exists("unacked_mutex")


def test_warm_shutdown_puts_held_messages_back_at_the_head(env):
    app = rapp(env)
    env.fake.script(["latency_ms=1500;tokens=2"])
    # -c 1 x 1: a window of 1, raised by one for each eta task held, so the
    # worker holds exactly these three and leaves the one pushed after them
    later = [app.send_task("llm.generate", args=["waiting %d" % i], countdown=60)
             for i in range(2)]
    first = app.send_task("llm.generate", args=["running"])
    w = rworker(env, "-c", "1", "--prefetch-multiplier", "1")
    wait_until(lambda: env.redis.hlen("unacked") == 3, 10, what="all held")
    env.redis.lpush("celery", envelope(str(uuid.uuid4()), "behind"))
    time.sleep(0.3)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    first.get(timeout=5)
    assert env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0
    queued = [json.loads(x) for x in env.redis.lrange("celery", 0, -1)]
    ids = [q["headers"]["id"] for q in queued]
    # the eta ones at the right end (popped next), the one behind them left alone
    assert set(ids[-2:]) == {r.id for r in later}
    assert all(q["headers"].get("redelivered") for q in queued[-2:])
    assert all(q["properties"]["delivery_info"].get("redelivered") for q in queued[-2:])


def test_cold_stop_restores_the_running_message(env):
    app = rapp(env)
    env.fake.script(["latency_ms=8000;tokens=2"])
    w = rworker(env, "-c", "1")
    r = app.send_task("llm.generate", args=["cut short"], priority=7)
    wait_until(lambda: env.redis.hlen("unacked") == 1, 10, what="running")
    w.signal(signal.SIGTERM)
    time.sleep(0.3)
    w.signal(signal.SIGTERM)   # the second: a cold stop
    w.wait(30)
    assert env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0
    # back at the head of its own bucket (priority 7 -> bucket 6), redelivered
    back = json.loads(env.redis.lindex("celery" + SEP + "6", -1))
    assert back["headers"]["id"] == r.id and back["headers"]["redelivered"] is True


def test_global_keyprefix(env):
    opts = {"global_keyprefix": "pfx:"}
    app = rapp(env, **opts)
    rworker(env, opts=opts)
    r = app.send_task("llm.generate", args=["prefixed"])
    assert r.get(timeout=20) == env.fake.expected_text("prefixed")
    assert env.redis.exists("pfx:_kombu.binding.celery")
    assert not env.redis.exists("_kombu.binding.celery")
    replies = py_inspect(env, "ping", opts)
    assert replies and all(v == {"ok": "pong"} for v in replies.values()), replies
    # the mailbox and the events channel carry the prefix too
    assert env.redis.exists("pfx:_kombu.binding.celery.pidbox")


def test_dead_letters_land_in_the_redis_dead_letter_queue(env):
    app = rapp(env)
    env.fake.script(["status=400;err_msg=nope"])
    rworker(env)
    r = app.send_task("llm.generate", args=["doomed"])
    wait_until(lambda: env.redis.llen("celeriac.dead") == 1, 20, what="dead letter")
    dl = json.loads(env.redis.lindex("celeriac.dead", 0))
    assert dl["headers"]["id"] == r.id
    assert dl["properties"]["delivery_info"]["exchange"] == "celeriac.dlx"
    assert env.meta(r.id)["status"] == "FAILURE"


def test_malformed_envelope_is_set_aside(env):
    rworker(env)
    env.redis.lpush("celery", "this is not json")
    wait_until(lambda: env.redis.llen("celeriac.dead") == 1, 10, what="set aside")
    assert env.redis.lindex("celeriac.dead", 0) == b"this is not json"
    r = rapp(env).send_task("llm.generate", args=["still fine"])
    assert r.get(timeout=20) == env.fake.expected_text("still fine")


def test_pidbox_inspect_and_control_over_redis(env):
    app = rapp(env)
    w = rworker(env)
    wait_until(lambda: env.redis.smembers("_kombu.binding.celery.pidbox"), 5,
               what="mailbox binding")
    replies = app.control.inspect(timeout=2).ping()
    assert replies and any(v == {"ok": "pong"} for v in replies.values()), replies
    env.fake.script(["latency_ms=3000;tokens=2"])
    r = app.send_task("llm.generate", args=["busy"])
    wait_until(lambda: env.redis.hlen("unacked") == 1, 10, what="running")
    active = app.control.inspect(timeout=2).active()
    assert any(t["id"] == r.id for v in active.values() for t in v), active
    later = app.send_task("llm.generate", args=["revoke me"], countdown=30)
    wait_until(lambda: env.redis.hlen("unacked") == 2, 10, what="eta held")
    app.control.revoke(later.id)
    w.wait_for(r"revoked|Discarding revoked", 10)
    r.get(timeout=20)
    # the reply queues were written through their bindings, none left behind
    time.sleep(0.5)
    assert not [k for k in env.redis.keys("*.reply.celery.pidbox")]


def test_events_over_redis(env):
    app = rapp(env)
    rworker(env, "-E")
    got = []

    def collect():
        with app.connection() as conn:
            recv = app.events.Receiver(conn, handlers={"*": got.append})
            try:
                recv.capture(limit=None, timeout=8, wakeup=False)
            except Exception:
                pass

    import threading
    t = threading.Thread(target=collect, daemon=True)
    t.start()
    time.sleep(1.5)
    r = app.send_task("llm.generate", args=["watched"])
    r.get(timeout=20)
    wait_until(lambda: any(e.get("type") == "task-succeeded" for e in got), 10,
               what="task-succeeded event")
    types = {e["type"] for e in got}
    assert {"task-received", "task-started", "task-succeeded"} <= types, types


def test_connections_dropped_mid_task(env):
    """Redis drops every connection (CLIENT KILL; the data stays): the running
    task's record survives, its ack goes once the worker is back, the mailbox
    is subscribed again, and nothing runs twice."""
    app = rapp(env)
    env.fake.script(["tokens=3", "latency_ms=2500;tokens=3"])
    w = rworker(env)
    # acked just before the drop: its ack is sent again after the reconnect
    # (a server that crashed or failed over may have lost it)
    first = app.send_task("llm.generate", args=["before the drop"])
    assert first.get(timeout=20) == env.fake.expected_text("before the drop", tokens=3)
    wait_until(lambda: env.redis.hlen("unacked") == 0, 10, what="the first acked")
    r = app.send_task("llm.generate", args=["across a drop"])
    wait_until(lambda: env.redis.hlen("unacked") == 1, 10, what="running")
    time.sleep(0.5)
    env.redis.client_kill_filter(_type="normal", skipme=True)
    env.redis.client_kill_filter(_type="pubsub")
    assert r.get(timeout=20) == env.fake.expected_text("across a drop", tokens=3)
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0,
               10, what="acked after the reconnect")
    w.wait_for(r"connection to .* lost", 5)
    assert w.count(r"broker: sending again 1 ack\(s\) of the last 10 s") == 1
    replies = wait_until(lambda: py_inspect(env, "ping", timeout=1), 15, what="ping after")
    assert any(v == {"ok": "pong"} for v in replies.values())
    r2 = app.send_task("llm.generate", args=["after the drop"])
    assert r2.get(timeout=20) == env.fake.expected_text("after the drop")
    assert len([s for s in env.fake.stats() if "across a drop" in json.dumps(s["body"])]) == 1
    assert len([s for s in env.fake.stats() if "before the drop" in json.dumps(s["body"])]) == 1


def test_ack_refused_by_redis_is_sent_again(env):
    """Redis refuses writes when the ack is due (NOREPLICAS: what a master
    with min-replicas-to-write says while its replica is away, as in a
    failover): the worker keeps the ack and sends it again until Redis takes
    it, so no record is left behind to be restored and run a second time.
    (ignore_result: no result write, so the ack is the first write after the
    call.)"""
    app = rapp(env)
    env.fake.script(["latency_ms=1500;tokens=3"])
    w = rworker(env)
    r = app.send_task("llm.generate", args=["ack refused"], ignore_result=True)
    wait_until(lambda: env.redis.hlen("unacked") == 1, 10, what="running")
    env.redis.config_set("min-replicas-to-write", "1")
    try:
        w.wait_for(r"Task llm.generate\[%s\] succeeded" % r.id, 20)
        w.wait_for(r"broker: ack refused", 10)
        time.sleep(1)
        assert env.redis.hlen("unacked") == 1
    finally:
        env.redis.config_set("min-replicas-to-write", "0")
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0,
               10, what="the ack taken once Redis writes again")
    assert w.count(r"broker: ack refused") == 1  # said once, however many tries
    r2 = app.send_task("llm.generate", args=["after the refusal"])
    assert r2.get(timeout=20) == env.fake.expected_text("after the refusal")


def _quiet(fn):
    """fn(), or False while Redis is still loading."""
    try:
        return fn()
    except redis.exceptions.BusyLoadingError:
        return False


def _loading(r):
    try:
        r.ping()
    except redis.exceptions.BusyLoadingError:
        return True
    except redis.exceptions.ConnectionError:
        pass
    return False


def test_restart_that_loads_a_while_loses_nothing(env, tmp_path):
    """Redis killed mid-run and restarted with a large dataset to load: for a
    second or more it takes connections and answers every command with
    LOADING. What the worker does meanwhile -- the acks of the tasks it went
    on running (ignore_result: no result write holds them back), records,
    giving back what a lost pop took -- is refused, and must be done again
    once Redis has loaded, not dropped: every task runs, and nothing is left
    in unacked or the queue."""
    from test_redis_fleet import OwnRedis, prompt_calls
    n = 60
    own = OwnRedis(tmp_path)
    try:
        own.ballast(15, 400000)
        br = own.client(1)
        w = env.worker("-b", own.url(1), "--result-backend", own.url(2), "-c", "10")
        app = Celery("rl", broker=own.url(1), backend=own.url(2))
        env.fake.script(["latency_ms=300;tokens=3"] * (n * 3))
        for i in range(n):
            app.send_task("llm.generate", args=["rl-%d" % i], ignore_result=True)
        wait_until(lambda: len(prompt_calls(env.fake, "rl-")) >= n // 4, 60,
                   what="a quarter of the calls")
        own.kill9()
        own.start(wait=False)
        wait_until(lambda: _loading(br), 10, interval=0.05, what="Redis loading")
        wait_until(lambda: len(prompt_calls(env.fake, "rl-")) == n, 90, interval=0.3,
                   what="every task called")
        sep = "\x06\x16"
        wait_until(lambda: _quiet(lambda: not br.hlen("unacked") and
                                  not br.zcard("unacked_index") and
                                  sum(br.llen(k) for k in ["celery"] + [
                                      "celery%s%d" % (sep, p) for p in (3, 6, 9)]) == 0),
                   30, what="queue and unacked empty")
        assert w.count(r"broker: ack refused: .*LOADING") == 1 or \
            w.count(r"broker: ack refused") == 1, w.log()
        assert w.proc.poll() is None
        app.close()
    finally:
        own.close()


def push_burst(env, n, prompt="burst %d"):
    """n task envelopes on 'celery', as a Python producer leaves them; their
    task ids in order."""
    ids, pipe = [], env.redis.pipeline()
    for i in range(n):
        tid = str(uuid.uuid4())
        ids.append(tid)
        pipe.lpush("celery", envelope(tid, prompt % i))
    pipe.execute()
    return ids


def test_burst_consumed_in_batches_every_record_present(env):
    """500 messages queued before the worker: popped by the pop script a batch
    at a time (a wide window: 1,500, so large batches, several calls in flight
    and each reply read whole), each one recorded byte for byte as kombu
    writes it while it is held, every one run exactly once, nothing left
    behind."""
    app = rapp(env)
    env.fake.script(["hold=burst;tokens=2"] * 500)
    ids = push_burst(env, 500)
    raw = {json.loads(e)["properties"]["delivery_tag"]: e.decode()
           for e in env.redis.lrange("celery", 0, -1)}
    rworker(env, "-c", "50", "--prefetch-multiplier", "30")
    wait_until(lambda: env.redis.hlen("unacked") == 500, 20, what="all 500 held")
    assert env.redis.llen("celery") == 0
    assert env.redis.zcard("unacked_index") == 500
    held = env.redis.hgetall("unacked")
    for tag, value in held.items():
        # kombu's [envelope, exchange, routing_key], the envelope as it lay
        assert value.decode() == "[%s, \"\", \"celery\"]" % raw[tag.decode()]
    assert {json.loads(v)[0]["headers"]["id"] for v in held.values()} == set(ids)
    env.fake.release("burst")
    wait_until(lambda: all(env.meta(t) and env.meta(t)["status"] == "SUCCESS" for t in ids),
               60, what="all 500 ran")
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0,
               10, what="all acked")
    runs = [s for s in env.fake.stats() if "burst " in json.dumps(s["body"])]
    assert len(runs) == 500


def test_kill_9_while_popping_loses_nothing(env):
    """A worker killed (SIGKILL) while it takes in a burst: every message is
    either still in its list or recorded in unacked, never in neither; a
    worker with a short visibility timeout then restores and runs them all."""
    app = rapp(env)
    env.fake.script(["hold=k9;tokens=2"] * 400)
    ids = push_burst(env, 400, prompt="kill9 %d")
    w = rworker(env, "-c", "40", "--prefetch-multiplier", "10")
    wait_until(lambda: env.redis.hlen("unacked") >= 10, 20, what="popping")
    w.proc.kill()
    w.proc.wait()
    queued = {json.loads(e)["headers"]["id"] for e in env.redis.lrange("celery", 0, -1)}
    recorded = {json.loads(v)[0]["headers"]["id"]
                for v in env.redis.hgetall("unacked").values()}
    assert queued | recorded == set(ids), "lost: %d" % len(set(ids) - queued - recorded)
    assert env.redis.zcard("unacked_index") == len(recorded)
    env.fake.release("k9")
    env.fake.script(["tokens=2"])
    time.sleep(1.5)  # older than the visibility timeout below
    rworker(env, "-c", "40", opts={"visibility_timeout": 1})
    wait_until(lambda: all(env.meta(t) and env.meta(t)["status"] == "SUCCESS" for t in ids),
               60, what="all 400 ran")
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.llen("celery") == 0,
               10, what="nothing left")


def test_prefetch_bounds_the_batch(env):
    """The pop script takes no more than the prefetch window has room for:
    -c 3 x 5 holds exactly 15 of 100 queued, however long it waits."""
    app = rapp(env)
    env.fake.script(["hold=pf;tokens=2"] * 100)
    ids = push_burst(env, 100, prompt="window %d")
    rworker(env, "-c", "3", "--prefetch-multiplier", "5")
    wait_until(lambda: env.redis.hlen("unacked") == 15, 20, what="window full")
    time.sleep(1.0)
    assert env.redis.hlen("unacked") == 15 and env.redis.zcard("unacked_index") == 15
    assert env.redis.llen("celery") == 85
    env.fake.release("pf")
    env.fake.script(["tokens=2"])
    wait_until(lambda: all(env.meta(t) and env.meta(t)["status"] == "SUCCESS" for t in ids),
               60, what="all 100 ran")
    assert env.redis.hlen("unacked") == 0


def test_heavy_envelopes_cut_a_pop_call_by_bytes_not_by_a_dry_queue(env):
    """A pop script call returns about 1 MB of envelopes at most: 24 messages
    of 300 KB each take several calls, each cut by its byte bound and marked
    so. The worker keeps calling the script; it waits on a BRPOP only once the
    queue is dry (a call read as "the queue ran dry" would send one BRPOP per
    cut call). The window is wide (1,200), so the replies, near 1 MB each, are
    read whole. Every message is held with its record, runs once, and nothing
    is left behind."""
    app = rapp(env)
    n = 24
    env.fake.script(["hold=heavy;tokens=2"] * n)
    pad = "x" * (300 * 1024)
    ids = push_burst(env, n, prompt="heavy %d " + pad)
    env.redis.config_resetstat()
    rworker(env, "-c", str(n), "--prefetch-multiplier", "50")
    wait_until(lambda: env.redis.hlen("unacked") == n, 20, what="all %d held" % n)
    stats = env.redis.info("commandstats")
    calls = sum(v.get("calls", 0) for k, v in stats.items()
                if k in ("cmdstat_evalsha", "cmdstat_eval"))
    brpops = stats.get("cmdstat_brpop", {}).get("calls", 0)
    assert calls >= 7, "each call should stop near 1 MB: %d script calls for %d" % (calls, n)
    assert brpops <= 2, "%d BRPOPs: cut calls were taken for a dry queue" % brpops
    env.fake.release("heavy")
    wait_until(lambda: all(env.meta(t) and env.meta(t)["status"] == "SUCCESS" for t in ids),
               60, what="all %d ran" % n)
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0,
               10, what="all acked")
    runs = [s for s in env.fake.stats() if "heavy " in json.dumps(s["body"])]
    assert len(runs) == n


def test_script_flushed_and_odd_routing_keys(env):
    """The pop script's record of a routing key JSON must escape is still one
    Python reads back the same; a SCRIPT FLUSH meanwhile (NOSCRIPT) only makes
    the worker load it again."""
    app = rapp(env)
    odd = 'odd/key "quoted" \u00e9\\'
    env.fake.script(["hold=odd;tokens=2"])
    e = json.loads(envelope(str(uuid.uuid4()), "odd one"))
    e["properties"]["delivery_info"]["routing_key"] = odd
    env.redis.lpush("celery", json.dumps(e))
    w = rworker(env)
    wait_until(lambda: env.redis.hlen("unacked") == 1, 10, what="held")
    (tag, value), = env.redis.hgetall("unacked").items()
    got_env, exchange, rk = json.loads(value)
    assert got_env == e and exchange == "" and rk == odd
    env.fake.release("odd")
    wait_until(lambda: env.redis.hlen("unacked") == 0, 10, what="acked")
    env.redis.script_flush()
    ids = push_burst(env, 50, prompt="after flush %d")
    wait_until(lambda: all(env.meta(t) and env.meta(t)["status"] == "SUCCESS" for t in ids),
               30, what="all 50 ran after the flush")
    assert env.redis.hlen("unacked") == 0
    assert w.count("pop script refused") <= 3


def test_pop_records_envelopes_not_laid_out_as_kombu_writes_them(env):
    """The pop script reads the tag, exchange and routing key straight from an
    envelope laid out as kombu writes it; any other layout (compact separators,
    properties not last, a tag given twice, values with escapes) is decoded
    instead. Every one is held under the tag celeriac's decoder reads, with the
    exchange and routing key it reads, runs once, and leaves nothing behind."""
    app = rapp(env)
    env.fake.script(["hold=lay;tokens=2"] * 5)
    ids, raws = [], []
    for i in range(5):
        tid = str(uuid.uuid4())
        ids.append(tid)
        e = json.loads(envelope(tid, "layout %d" % i))
        if i == 0:
            raw = json.dumps(e, separators=(",", ":"))
        elif i == 1:
            props = e.pop("properties")
            raw = json.dumps({"properties": props, **e})
        elif i == 2:
            raw = json.dumps(e)[:-2] + ', "delivery_tag": "second-%s"}}' % tid
        elif i == 3:
            e["properties"]["delivery_info"]["exchange"] = "caf\u00e9"
            raw = json.dumps(e)
        else:
            # a decoy of the properties' layout inside a header value
            e["headers"]["argsrepr"] = ('"properties": {"delivery_info": {"exchange": "x", '
                                        '"routing_key": "y"}, "delivery_tag": "decoy"}}')
            raw = json.dumps(e)
        raws.append(raw)
        env.redis.lpush("celery", raw)
    rworker(env, "-c", "10")
    wait_until(lambda: env.redis.hlen("unacked") == 5, 10, what="all 5 held")
    held = {k.decode(): json.loads(v) for k, v in env.redis.hgetall("unacked").items()}
    assert env.redis.zcard("unacked_index") == 5
    for i, tid in enumerate(ids):
        rec = [v for v in held.values() if v[0]["headers"]["id"] == tid]
        assert len(rec) == 1, (i, held.keys())
        got_env, exchange, rk = rec[0]
        assert rk == "celery"
        assert exchange == ("caf\u00e9" if i == 3 else "")
        assert "decoy" not in held
    env.fake.release("lay")
    wait_until(lambda: all(env.meta(t) and env.meta(t)["status"] == "SUCCESS" for t in ids),
               30, what="all 5 ran")
    wait_until(lambda: env.redis.hlen("unacked") == 0 and env.redis.zcard("unacked_index") == 0,
               10, what="all acked")
    runs = [s for s in env.fake.stats() if "layout " in json.dumps(s["body"])]
    assert len(runs) == 5
