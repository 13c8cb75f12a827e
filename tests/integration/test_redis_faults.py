"""Issue 13: Redis faults a worker must notice and say once -- a silent
partition (packets dropped, sockets left open) under load and on an idle
connection, and credentials Redis refuses at start-up and after it."""
import json
import os
import subprocess
import time

import pytest
import redis

from conftest import free_port, wait_until
from conftest import amqp_unacked as unacked
from tcpproxy import TcpProxy


@pytest.fixture
def proxy(services):
    p = TcpProxy(services.redis_port).start()
    yield p
    p.close()


def proxied(env, proxy):
    return "redis://127.0.0.1:%d/%d" % (proxy.port, env.db)


LOST = r"result backend: connection lost: no reply from redis://127\.0\.0\.1:%d/%d for 2 s; reconnecting"


def test_blackholed_redis_is_dropped_and_nothing_is_acked_or_lost(env, proxy):
    n = 20
    w = env.worker("--redis-timeout", "2", "--result-backend", proxied(env, proxy))
    first = env.app.send_task("llm.generate", args=["before the partition"])
    assert first.get(timeout=30)
    # The client reads the result from Redis directly; the worker acks only
    # when Redis's reply has come back through the proxy. Cut before that
    # and the first task stays unacked too, one more than the n counted.
    wait_until(lambda: unacked(env) == 0, 30, interval=0.2, what="the first task acked")
    proxy.blackhole(True)
    results = [env.app.send_task("llm.generate", args=["hole-%d" % i]) for i in range(n)]
    w.wait_for(LOST % (proxy.port, env.db), timeout=60)
    # Every task ran, and waits for its result to be stored before its ack.
    wait_until(lambda: unacked(env) == n, 30, interval=0.2, what="all tasks unacked")
    assert not any(env.meta(r.id) for r in results)
    # The attempts made during the partition fail (TCP to the proxy, then
    # silence) and are said once, however many there are.
    w.wait_for(r"cannot connect to redis://127\.0\.0\.1:%d/%d: no reply to the handshake"
               % (proxy.port, env.db), timeout=30)
    assert unacked(env) == n
    proxy.blackhole(False)
    wait_until(lambda: all(env.meta(r.id) for r in results), 60, interval=0.2,
               what="every result after the partition")
    assert all(env.meta(r.id)["status"] == "SUCCESS" for r in results)
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30,
               what="every task acked")
    assert w.count(r"connection lost") == 1
    assert w.count(r"no reply to the handshake") == 1
    assert w.count(r"Connected to redis") == 2
    assert env.app.send_task("llm.generate", args=["after"]).get(timeout=30)


def test_idle_connection_is_health_checked(env, proxy):
    w = env.worker("--redis-timeout", "2", "--redis-health-check-interval", "1",
                   "--result-backend", proxied(env, proxy))
    proxy.blackhole(True)
    # No task is running: only the health-check PING can find the partition.
    w.wait_for(LOST % (proxy.port, env.db), timeout=60)
    proxy.blackhole(False)
    w.wait_for(r"Connected to redis", timeout=60, count=2)
    r = env.app.send_task("llm.generate", args=["after an idle partition"])
    assert r.get(timeout=30)
    assert env.meta(r.id)["status"] == "SUCCESS"


def test_idle_connection_is_left_alone_while_redis_answers(env, proxy):
    # The PINGs are answered: no reconnect, however long the worker idles.
    w = env.worker("--redis-timeout", "1", "--redis-health-check-interval", "0.2",
                   "--result-backend", proxied(env, proxy))
    r = redis.Redis(host="127.0.0.1", port=env.services.redis_port)

    def pings():
        return r.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
    before = pings()
    wait_until(lambda: pings() >= before + 5, 30, interval=0.2, what="health-check pings")
    assert w.count("connection lost") == 0 and w.count("Connected to redis") == 1


@pytest.fixture
def locked_redis(tmp_path):
    """A Redis of the test's own, with a password."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--requirepass", "right-pw", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(host="127.0.0.1", port=port, password="right-pw")
    wait_until(lambda: _pings(r), 20, interval=0.1, what="the test's redis")
    yield port, r
    proc.terminate()
    proc.wait(timeout=20)


def _pings(r):
    try:
        return r.ping()
    except redis.exceptions.ConnectionError:
        return False


def test_wrong_redis_password_at_start_is_one_line_and_no_ready(env, locked_redis):
    port, _ = locked_redis
    w = env.worker("--result-backend", "redis://:hunter2-wrong@127.0.0.1:%d/3" % port,
                   start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=30) != 0
    time.sleep(0.2)  # the log pump reads the last lines
    log = w.log()
    assert w.count(r"WRONGPASS") == 1, log
    assert w.count(r"cannot connect to result backend redis://127\.0\.0\.1:%d/3: WRONGPASS"
                   % port) == 1, log
    assert "Connected to redis" not in log and " ready." not in log, log
    assert "hunter2" not in log


def test_password_changed_under_a_running_worker_is_said_once(env, locked_redis):
    port, admin = locked_redis
    w = env.worker("--result-backend", "redis://:right-pw@127.0.0.1:%d/2" % port)
    store = redis.Redis(host="127.0.0.1", port=port, db=2, password="right-pw")
    r = env.app.send_task("llm.generate", args=["before the rotation"])
    wait_until(lambda: store.get("celery-task-meta-" + r.id), 30, what="the first result")
    admin.config_set("requirepass", "rotated-pw")
    admin = redis.Redis(host="127.0.0.1", port=port, password="rotated-pw")
    seen = admin.info("stats")["total_connections_received"]
    admin.client_kill_filter(_type="normal", skipme=True)
    w.wait_for(r"result backend: cannot connect to redis://127\.0\.0\.1:%d/2: WRONGPASS" % port,
               timeout=30)
    # backoff 0.25, 0.5, 1, 2 s: several refused attempts in this time
    wait_until(lambda: admin.info("stats")["total_connections_received"] >= seen + 5, 30,
               interval=0.2, what="several reconnect attempts")
    assert w.count("WRONGPASS") == 1
    r = env.app.send_task("llm.generate", args=["after the rotation"])
    admin.config_set("requirepass", "right-pw")
    w.wait_for(r"Connected to redis", timeout=30, count=2)
    wait_until(lambda: store.get("celery-task-meta-" + r.id), 30, what="the result after")
    assert "right-pw" not in w.log() and "rotated-pw" not in w.log()


HEALTH = "celeriac:gateway-health"


def test_gateway_subscriber_finds_a_silent_partition(env, proxy):
    from test_gateway import Gateway, read_all
    env.worker()
    gw = Gateway(env, "--result-backend", proxied(env, proxy), "--redis-timeout", "2",
                 "--redis-health-check-interval", "1")
    try:
        # The subscriber is up once its first probe is answered.
        wait_until(lambda: env.redis.pubsub_numsub(HEALTH)[0][1] >= 1, 30, interval=0.1,
                   what="the gateway's subscriber")
        proxy.blackhole(True)
        # Idle: only the probe of the subscriber connection can find it.
        gw.wait_for(r"gateway: redis pub/sub connection lost: no reply from "
                    r"127\.0\.0\.1:%d for 2 s; reconnecting" % proxy.port, timeout=60)
        proxy.blackhole(False)
        r = env.app.send_task("llm.generate", args=["streamed after the partition"])
        msgs = read_all(gw.stream(r.id))
        assert msgs[-1]["type"] == "result" and msgs[-1]["state"] == "SUCCESS", msgs[-1]
    finally:
        assert gw.stop() == 0, "\n".join(gw.lines[-30:])


def test_results_a_server_lost_are_written_again(env, tmp_path):
    """What Redis acknowledged can still be lost: replication is asynchronous,
    so the master a failover leaves behind takes with it what its replica had
    not synced, and the worker has acked those tasks. Shown here with a result
    backend restarted empty (no persistence), as such a promoted replica
    would be: once reconnected, the worker writes again the results it had
    confirmed in the last 10 s, and no task is left without its result."""
    port = free_port()

    def start():
        return subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    proc = start()
    store = redis.Redis(host="127.0.0.1", port=port, db=3)
    try:
        wait_until(lambda: _pings(store), 20, interval=0.1, what="the test's redis")
        w = env.worker("--result-backend", "redis://127.0.0.1:%d/3" % port)
        rs = [env.app.send_task("llm.generate", args=["kept-%d" % i]) for i in range(20)]
        keys = ["celery-task-meta-" + r.id for r in rs]
        wait_until(lambda: all(store.mget(keys)), 30, what="20 results")
        proc.kill()
        proc.wait()
        proc = start()
        wait_until(lambda: _pings(store), 20, interval=0.1, what="the test's redis again")
        w.wait_for(r"result backend: writing again \d+ result\(s\) of the last 10 s", timeout=30)
        wait_until(lambda: all(store.mget(keys)), 30, what="the 20 results written again")
        for i, v in enumerate(store.mget(keys)):
            m = json.loads(v)
            assert m["status"] == "SUCCESS", m
            assert m["result"] == env.fake.expected_text("kept-%d" % i), m
        # written again, not run again
        calls = [e.get("prompt") for e in env.fake.stats()]
        assert all(calls.count("kept-%d" % i) == 1 for i in range(20)), calls
    finally:
        proc.kill()
        proc.wait(timeout=20)
