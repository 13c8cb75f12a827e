"""Issue 15: the result backend over Redis Sentinel (discovery, ROLE, a
failover under load), a unix socket, global_keyprefix, and the start-up
errors Celery gives for incomplete Sentinel and TLS settings. Each test that
needs Sentinel starts its own master, replica and three sentinels
(sentinel_util.py) in its tmp dir."""
import json
import os
import subprocess
import threading
import time

import pytest
import redis

from conftest import BIN, free_port, wait_progress, wait_until
from sentinel_util import SentinelCluster


@pytest.fixture
def cluster(tmp_path):
    c = SentinelCluster(tmp_path / "sentinel", sentinel_password="sentinel-secret").start()
    yield c
    c.stop()


def sentinel_worker(env, cluster, *args, **kw):
    return env.worker("--result-backend", cluster.url(db=env.db, first_dead_port=free_port()),
                      "--result-backend-transport-options",
                      json.dumps(cluster.transport_options()), *args, **kw)


def test_results_over_sentinel_read_by_celery(env, cluster):
    """The first sentinel listed is dead: the worker moves on, authenticates
    to the sentinels (sentinel_kwargs), finds the master, and a Python client
    configured the Celery way reads the result through the sentinels."""
    host, port = cluster.master_addr()
    w = sentinel_worker(env, cluster)
    w.wait_for(r"Connected to redis://%s:%d/%d" % (host, port, env.db))
    app = env.make_app(result_backend=cluster.url(db=env.db),
                       result_backend_transport_options=cluster.transport_options())
    r = app.send_task("llm.generate", args=["over sentinel"])
    out = r.get(timeout=30)
    assert isinstance(out, str) and out
    raw = cluster.master_client(env.db).get("celery-task-meta-" + r.id)
    assert json.loads(raw)["status"] == "SUCCESS"


@pytest.mark.slow
@pytest.mark.slow
def test_failover_during_1000_tasks_keeps_every_result(env, tmp_path):
    """SENTINEL FAILOVER while 1,000 quick tasks store their results: the
    worker follows the switch (+switch-master, or the demoted master's
    -READONLY or NOREPLICAS) and every task ends with its one SUCCESS on the
    new master. min-replicas-to-write 1 is what makes this hold: without it,
    192 of 1,000 acknowledged results were lost in one run (written to the
    old master after the replica's promotion), as they would be with a
    Python worker."""
    n = 1000
    cluster = SentinelCluster(tmp_path / "sentinel", sentinel_password="sentinel-secret",
                              min_replicas_to_write=1).start()
    try:
        _failover_run(env, cluster, n)
    finally:
        cluster.stop()


def _failover_run(env, cluster, n):
    w = sentinel_worker(env, cluster, "-c", "50")
    old = cluster.master_addr()
    old_client = cluster.master_client(env.db)
    results = []

    def send():
        # Spread over about 4 s, so that the failover falls in the middle.
        for i in range(n):
            results.append(env.app.send_task("celery.accumulate", args=[i]))
            if i % 25 == 24:
                time.sleep(0.1)
    sender = threading.Thread(target=send)
    sender.start()
    wait_until(lambda: len(old_client.keys("celery-task-meta-*")) >= 100, 30,
               interval=0.02, what="the first results")
    new = cluster.failover()
    assert new != old
    sender.join()
    # The failover fell while tasks were still coming.
    assert len(old_client.keys("celery-task-meta-*")) < n
    w.wait_for(r"Connected to redis://%s:%d/%d" % (new[0], new[1], env.db), timeout=30)
    new_client = cluster.master_client(env.db)
    # The new master refuses every write until the old one is its replica
    # (NOREPLICAS): about 11 s that the worker spends retrying. From then on
    # the worker has to keep storing, however slow the host.
    cluster.wait_writable()
    keys = ["celery-task-meta-" + r.id for r in results]
    try:
        wait_progress(lambda: sum(1 for v in new_client.mget(keys) if v), n,
                      what="every result on the new master")
    except AssertionError:
        missing = [i for i, r in enumerate(results)
                   if not new_client.get("celery-task-meta-" + r.id)]
        repl = new_client.info("replication")
        print("MISSING", len(missing), missing[:20], "depth",
              env.services.queue_depth(env.vhost, "celery"), "new master:",
              {k: repl.get(k) for k in ("role", "connected_slaves", "min_slaves_good_slaves")})
        raise
    for i, r in enumerate(results):
        meta = json.loads(new_client.get("celery-task-meta-" + r.id))
        assert meta["status"] == "SUCCESS", meta
        assert meta["result"] == [i]
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30,
               what="every task acked")
    # Told by the subscription on a sentinel, not by an error.
    assert w.count(r"result backend: connection lost: sentinel: master 'mymaster' "
                   r"switched") == 1


def test_global_keyprefix_on_every_result_key(env):
    """global_keyprefix (Celery 5.3+) goes before every result key and its
    channel, with Celery's '_'. Debian's Celery 5.2.6 has no such option on
    the result backend, so the keys are read with redis-py."""
    w = env.worker("--result-backend-transport-options",
                   json.dumps({"global_keyprefix": "tenant1", "socket_timeout": 30,
                               "health_check_interval": 10,
                               "retry_policy": {"max_retries": 3}}))
    p = env.redis.pubsub()
    p.psubscribe("tenant1_celery-task-meta-*")
    r = env.app.send_task("llm.generate", args=["prefixed"])
    wait_until(lambda: env.redis.get("tenant1_celery-task-meta-" + r.id), 30,
               what="the prefixed result")
    assert json.loads(env.redis.get("tenant1_celery-task-meta-" + r.id))["status"] == "SUCCESS"
    assert env.redis.get("celery-task-meta-" + r.id) is None
    msgs = []
    wait_until(lambda: msgs.extend(m for m in [p.get_message(timeout=0.1)]
                                   if m and m["type"] == "pmessage") or msgs, 10,
               what="the published result")
    assert msgs[0]["channel"] == ("tenant1_celery-task-meta-" + r.id).encode()
    # A prefix that ends in one of ":_-." is taken as it is.
    w.stop()
    env.worker("--result-backend-transport-options", json.dumps({"global_keyprefix": "t2:"}))
    r = env.app.send_task("llm.generate", args=["prefixed again"])
    wait_until(lambda: env.redis.get("t2:celery-task-meta-" + r.id), 30,
               what="the result under t2:")


def test_unix_socket_result_backend(env, tmp_path):
    sock = str(tmp_path / "redis.sock")
    conf = tmp_path / "redis.conf"
    conf.write_text("port 0\nunixsocket %s\nunixsocketperm 700\ndir %s\nsave \"\"\n"
                    % (sock, tmp_path))
    srv = subprocess.Popen(["/usr/bin/redis-server", str(conf)], stdout=subprocess.DEVNULL)
    try:
        c = redis.Redis(unix_socket_path=sock, db=3)
        wait_until(lambda: os.path.exists(sock), 10, what="the socket")
        env.worker("--result-backend", "redis+socket://%s?virtual_host=3" % sock)
        r = env.app.send_task("llm.generate", args=["over a unix socket"])
        wait_until(lambda: c.get("celery-task-meta-" + r.id), 30, what="the result")
        assert json.loads(c.get("celery-task-meta-" + r.id))["status"] == "SUCCESS"
    finally:
        srv.terminate()
        srv.wait()


@pytest.mark.parametrize("backend,options,says", [
    ("sentinel://127.0.0.1:26379/0", "",
     "result backend sentinel:// needs master_name in --result-backend-transport-options"),
    ("redis://127.0.0.1:6379/0", '{"visibility_timeout": 3}',
     "unknown result backend transport option 'visibility_timeout'"),
    ("redis://127.0.0.1:6379/0", "{not json",
     "result backend transport options are not JSON: bad JSON at byte 1"),
    ("rediss://127.0.0.1:6379/0", "",
     "rediss:// without ssl_cert_reqs: add ?ssl_cert_reqs=required"),
    ("sentinel://127.0.0.1:26379/0;redis://h", '{"master_name": "m"}',
     "entry 2 is not sentinel://"),
])
def test_start_up_errors(env, backend, options, says):
    e = dict(os.environ, CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS=options)
    p = subprocess.run([BIN, "worker", "-b", env.broker, "--result-backend", backend],
                       env=e, capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert says in p.stdout + p.stderr, p.stdout + p.stderr


def _leftovers(broker, qkeys, w):
    """What is left on the new master, and what the worker said of it."""
    out = []
    ids = set()
    for k in qkeys:
        for raw in broker.lrange(k, 0, -1):
            tid = json.loads(raw)["headers"]["id"]
            ids.add(tid)
            out.append("queued in %r: %s" % (k, tid))
    for tag, raw in broker.hgetall("unacked").items():
        tid = json.loads(raw)[0]["headers"]["id"]
        ids.add(tid)
        out.append("unacked %s (score %s): %s" % (tag.decode(), broker.zscore(
            "unacked_index", tag), tid))
    for tid in sorted(ids)[:5]:
        out += ["  " + l for l in w.lines if tid in l]
    out += [l for l in w.lines if "broker:" in l or "result backend" in l][-40:]
    return "left on the new master:\n" + "\n".join(out)


@pytest.mark.slow
def test_broker_over_sentinel_failover_during_1000_tasks(env, tmp_path):
    """Broker and result backend both on one Sentinel-managed master (dbs of
    their own), 1,000 tasks published by a Python producer through the
    sentinels, SENTINEL FAILOVER while the worker consumes them: the worker
    moves its three broker connections and the backend to the new master and
    every task ends with exactly one final result there, none lost. A task
    popped on the old master after the promotion is still in the new master's
    list and runs again: its one final state is SUCCESS all the same."""
    n = 1000
    cluster = SentinelCluster(tmp_path / "sentinel", sentinel_password="sentinel-secret",
                              min_replicas_to_write=1).start()
    try:
        broker_db = 0  # the cluster is the test's own; results go to env.db
        opts = cluster.transport_options()
        app = env.make_app(broker_url=cluster.url(db=broker_db),
                           broker_transport_options=opts,
                           result_backend=cluster.url(db=env.db),
                           result_backend_transport_options=opts)
        # 100 ms calls at -c 20: about 5 s of work, so the failover falls mid-run.
        env.fake.script(["latency_ms=100;tokens=4"] * (2 * n))
        results = [app.send_task("llm.generate", args=["p%d" % i]) for i in range(n)]
        old = cluster.master_addr()
        old_client = cluster.master_client(env.db)
        w = env.worker("-b", cluster.url(db=broker_db), "--broker-transport-options",
                       json.dumps(opts), "--result-backend", cluster.url(db=env.db),
                       "--result-backend-transport-options", json.dumps(opts), "-c", "20")
        wait_until(lambda: len(old_client.keys("celery-task-meta-*")) >= 100, 30,
                   interval=0.01, what="the first results")
        new = cluster.failover()
        assert new != old
        new_client = cluster.master_client(env.db)
        # The failover fell while tasks were still being consumed.
        assert len(new_client.keys("celery-task-meta-*")) < n
        cluster.wait_writable()  # see _failover_run()
        keys = ["celery-task-meta-" + r.id for r in results]
        wait_progress(lambda: sum(1 for v in new_client.mget(keys) if v), n,
                      what="every result on the new master")
        for r in results:
            meta = json.loads(new_client.get("celery-task-meta-" + r.id))
            assert meta["status"] == "SUCCESS", meta
        broker = cluster.master_client(broker_db)
        qkeys = ("celery", "celery\x06\x163", "celery\x06\x166", "celery\x06\x169")
        try:
            wait_until(lambda: sum(broker.llen(k) for k in qkeys) == 0 and
                       broker.hlen("unacked") == 0,
                       30, what="every task taken and acked on the new master")
        except AssertionError:
            raise AssertionError(_leftovers(broker, qkeys, w))
        # All three broker connections were moved by the sentinels' word.
        for conn in ("consumer", "commands", "pub/sub"):
            assert w.count(r"broker: %s connection .* lost: sentinel: master 'mymaster' "
                           r"switched" % conn) == 1, conn
        assert w.proc.poll() is None
        app.close()
    finally:
        cluster.stop()
