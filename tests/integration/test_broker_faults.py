"""Issue 13: broker faults the worker must notice and name -- a silent partition,
a reset, a refused login -- and a memory alarm, which blocks publishing but
must never stop the acks."""
import collections
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from conftest import BIN, free_port, wait_until
from tcpproxy import TcpProxy
from test_reliability import count_publishes


def proxied_url(env, proxy):
    return "amqp://guest:guest@127.0.0.1:%d/%s" % (
        proxy.port, urllib.parse.quote(env.vhost, safe=""))


def proxied_worker(env, proxy, *args):
    """A worker whose broker connections go through proxy (the client's do not)."""
    w = env.worker(*args, start=False)
    i = w.args.index("-b")
    w.args[i + 1] = proxied_url(env, proxy)
    return w.start()


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def gauge(port, name):
    _, text = http_get("http://127.0.0.1:%d/metrics" % port)
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def test_silent_partition_is_noticed_and_reconnects(env):
    # Packets dropped, sockets left open: no error ever comes from the socket;
    # only the missing heartbeats tell.
    proxy = TcpProxy(env.services.amqp_port).start()
    try:
        w = proxied_worker(env, proxy, "--heartbeat", "2")
        assert env.app.send_task("celery.accumulate", args=[1]).get(timeout=20) == [1]
        proxy.blackhole(True)
        # a bound, not a speed: two intervals are 4 s
        w.wait_for(r"connection to broker lost: no heartbeat from 127\.0\.0\.1:%d for \d+ s; "
                   r"reconnecting" % proxy.port, timeout=30)
        proxy.blackhole(False)
        w.wait_for(r"Connected to amqp://", timeout=90, count=2)
        assert env.app.send_task("celery.accumulate", args=[2]).get(timeout=30) == [2]
        assert w.count(r"connection to broker lost") == 1, w.log()
    finally:
        proxy.close()


def freeze_until_noticed_then_heal(env, w, proxy, hb, results, seen, stop, counter,
                                   at_cut=None):
    """Freezes the proxied path, runs at_cut, and expects the heartbeat line
    within ten intervals (a bound, not a speed: two intervals make it), then
    once the path is back a reconnect, every task a SUCCESS stored once and
    every delivery acked. Returns the silence the line reports, in seconds."""
    proxy.freeze(True)
    wait_until(proxy.frozen, 10, interval=0.05, what="the path cut")
    if at_cut:
        at_cut()
    lost = (r": (WARNING|ERROR)/.*connection to broker lost: no heartbeat from "
            r"127\.0\.0\.1:%d for (\d+) s; reconnecting$" % proxy.port)
    w.wait_for(lost, timeout=10 * hb)
    silent = int(re.search(lost, [l for l in w.lines if re.search(lost, l)][0]).group(2))
    assert proxy.held, "the cut held no chunk in flight"
    proxy.freeze(False)
    w.wait_for(r"Connected to amqp://", timeout=90, count=2)
    wait_until(lambda: all(env.meta(r.id) and env.meta(r.id)["status"] == "SUCCESS"
                           for r in results),
               180, interval=0.5, what="every result after the reconnect")
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 60,
               what="the queue drained (every delivery acked)")
    time.sleep(1)
    stop.set()
    counter.join(5)
    twice = [k for k, v in seen.items() if v > 1]
    assert not twice, "stored twice: %s" % twice[:5]
    assert len(seen) == len(results)
    assert w.count(r"connection to broker lost") == 1, w.log()
    return silent


def test_a_frozen_path_under_load_is_noticed_and_every_task_ends_once(env):
    # The path stops forwarding both ways while the worker is busy: the proxy
    # reads neither side any more and the chunk it read at the cut never
    # arrives. The worker keeps finishing tasks and, with -E, publishing their
    # events. Only the broker's silence can tell that the link is dead, and it
    # must tell in two heartbeat intervals, busy or not (main's worker never
    # did: its first publish after two silent intervals waited for a byte
    # from the broker, forever).
    n, hb = 300, 2
    proxy = TcpProxy(env.services.amqp_port).start()
    stop = threading.Event()
    seen, counter = count_publishes(env, stop)
    try:
        env.fake.script(["latency_ms=1500;tokens=3"] * (2 * n))
        w = proxied_worker(env, proxy, "-E", "-c", "50", "--heartbeat", str(hb))
        results = [env.app.send_task("llm.generate", args=["cut-%d" % i]) for i in range(n)]
        # cut once the first tasks are done, the next ones running and the
        # rest prefetched
        wait_until(lambda: len(seen) >= 50, 60, interval=0.1, what="a first wave done")
        silent = freeze_until_noticed_then_heal(env, w, proxy, hb, results, seen, stop,
                                                counter)
        assert silent >= 2 * hb
        calls = {}
        for e in env.fake.stats():
            if e["path"].startswith("/v1/"):
                calls[e["prompt"]] = calls.get(e["prompt"], 0) + 1
        # the calls running at the cut finished; their redeliveries were not
        # called again
        assert len(calls) == n and set(calls.values()) == {1}, \
            sorted(collections.Counter(calls.values()).items())
    finally:
        stop.set()
        proxy.close()


def test_a_full_send_buffer_never_holds_up_the_heartbeat_check(env):
    # Fifty running calls answer 503 just after the path froze: fifty retries
    # of a 256 KiB task go out at once, far more than the kernel buffers on
    # the way take. No write may wait for them to drain (none ever would), so
    # the heartbeat check still runs and finds the link dead; after the
    # reconnect each task runs again and ends with one result.
    n, hb = 50, 2
    proxy = TcpProxy(env.services.amqp_port).start()
    stop = threading.Event()
    seen, counter = count_publishes(env, stop)
    try:
        env.fake.script(["hold=cut;status=503"] * n)
        w = proxied_worker(env, proxy, "-c", str(n), "--heartbeat", str(hb))
        pad = "x" * (256 * 1024)
        results = [env.app.send_task("llm.generate", args=["big-%d %s" % (i, pad)])
                   for i in range(n)]
        wait_until(lambda: env.fake.held("cut") == n, 60, interval=0.1,
                   what="every call running")
        freeze_until_noticed_then_heal(env, w, proxy, hb, results, seen, stop, counter,
                                       at_cut=lambda: env.fake.release("cut"))
    finally:
        stop.set()
        proxy.close()


def test_reset_connection_is_named_as_such(env):
    # A broker that dies resets the connection: say so, once, and not as the
    # "bad file descriptor" libuv reports for any socket error.
    proxy = TcpProxy(env.services.amqp_port).start()
    try:
        w = proxied_worker(env, proxy, "--heartbeat", "30")
        assert env.app.send_task("celery.accumulate", args=[1]).get(timeout=20) == [1]
        proxy.reset_all()
        w.wait_for(r"connection to broker lost: ", timeout=30)
        w.wait_for(r"Connected to amqp://", timeout=60, count=2)
        lost = [l for l in w.lines if "connection to broker lost" in l]
        assert len(lost) == 1, lost
        assert re.search(r"lost: (connection reset by peer|connection closed by peer); "
                         r"reconnecting$", lost[0]), lost
        assert "bad file descriptor" not in w.log().lower()
        assert env.app.send_task("celery.accumulate", args=[2]).get(timeout=30) == [2]
    finally:
        proxy.close()


def test_refused_login_is_one_whole_line(env):
    url = "amqp://guest:not-the-password@127.0.0.1:%d/%s" % (
        env.services.amqp_port, urllib.parse.quote(env.vhost, safe=""))
    out = subprocess.run([BIN, "worker", "-b", url, "--result-backend", env.backend],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, OPENAI_API_KEY="sk-x"))
    assert out.returncode != 0
    lines = [l for l in out.stderr.splitlines() if "login" in l.lower()]
    assert len(lines) == 1, out.stderr
    assert re.search(r"cannot connect to broker 'amqp://guest:\*+@127\.0\.0\.1:\d+/[^']*': "
                     r"login refused: ACCESS_REFUSED - Login was refused using "
                     r"authentication mechanism PLAIN", lines[0]), lines[0]
    assert lines[0].count("cannot connect to broker") == 1, lines[0]
    assert "not-the-password" not in out.stderr


def test_memory_alarm_blocks_publishes_not_acks(env):
    # RabbitMQ stops reading a connection that publishes during an alarm. With
    # -E the worker publishes events, so on a single connection its acks would
    # stop too and nothing would complete past the prefetch window.
    n = 12
    port = free_port()
    env.fake.script(["latency_ms=100;tokens=2"] * n)
    results = [env.app.send_task("llm.generate", args=["alarm-%d" % i]) for i in range(n)]
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == n, 20,
               what="tasks queued")
    env.services.ctl("set_vm_memory_high_watermark", "0.0000001")
    try:
        t0 = time.time()
        w = env.worker("-E", "-c", "2", "--prefetch-multiplier", "1", "--heartbeat", "2",
                       "--metrics-port", str(port))
        wait_until(lambda: all(env.meta(r.id) for r in results), 60, interval=0.2,
                   what="every result during the alarm")
        assert all(env.meta(r.id)["status"] == "SUCCESS" for r in results)
        wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30,
                   what="the queue drained (all acked)")
        # blocked from the first event on (worker-online), and still blocked
        w.wait_for(r"publishing blocked by the broker \(low on memory\)", timeout=10)
        status, body = http_get("http://127.0.0.1:%d/healthz" % port)
        assert status == 200 and json.loads(body)["status"] == "degraded", body
        assert json.loads(body)["broker_blocked"] is True, body
        assert gauge(port, "celeriac_broker_blocked") == 1
        # still connected through a few heartbeat intervals of alarm
        time.sleep(max(0.0, 8 - (time.time() - t0)))
        assert "connection to broker lost" not in w.log()
    finally:
        env.services.ctl("set_vm_memory_high_watermark", "0.4")
    w.wait_for(r"broker: publishing unblocked", timeout=30)
    status, body = http_get("http://127.0.0.1:%d/healthz" % port)
    assert status == 200 and json.loads(body)["status"] == "ok", body
    assert json.loads(body)["broker_blocked"] is False
    assert gauge(port, "celeriac_broker_blocked") == 0
    assert w.count(r"publishing blocked by the broker") == 1
    assert w.count(r"publishing unblocked") == 1
    assert "connection to broker lost" not in w.log()


def test_a_retry_published_during_an_alarm_waits_and_goes_out_after(env):
    # The retry's publish is held while publishing is blocked, not written to
    # a socket the broker does not read; it goes out on unblock and the task
    # then succeeds.
    env.fake.script(["latency_ms=1500;status=503", "tokens=3"])
    r = env.app.send_task("llm.generate", args=["held retry"])
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 1, 20,
               what="task queued")
    env.services.ctl("set_vm_memory_high_watermark", "0.0000001")
    try:
        w = env.worker("-c", "1", "--retry-backoff", "0.2", "--retry-jitter", "false")
        # the worker-online event is what gets the publishing connection blocked
        w.wait_for(r"publishing blocked by the broker", timeout=30)
        w.wait_for(r"Task llm\.generate\[%s\] retry" % r.id, timeout=30)
        time.sleep(2)
        assert (env.meta(r.id) or {}).get("status") != "SUCCESS"
    finally:
        env.services.ctl("set_vm_memory_high_watermark", "0.4")
    w.wait_for(r"broker: publishing unblocked; sending [1-9]\d* held publishes", timeout=30)
    wait_until(lambda: (env.meta(r.id) or {}).get("status") == "SUCCESS", 30,
               what="the retried task succeeded")
    assert "connection to broker lost" not in w.log()
