"""Issue 36: celeriac as a systemd service -- the sd_notify protocol (READY,
STATUS, WATCHDOG, RELOADING, STOPPING) spoken to a socket the test listens on,
the SIGHUP warm restart behind ExecReload, and the unit file."""
import configparser
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import uuid

import pytest

from conftest import ROOT, free_port, wait_until
from tcpproxy import TcpProxy


class NotifySocket:
    """The manager's end: an AF_UNIX datagram socket (a path, or an abstract
    '@' name) collecting every message the worker sends, with when it came."""

    def __init__(self, abstract=False):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dir = None
        if abstract:
            self.name = "@celeriac-test-%s" % uuid.uuid4().hex
            self.sock.bind("\0" + self.name[1:])
        else:
            self.dir = tempfile.mkdtemp(prefix="celeriac-notify-")
            self.name = os.path.join(self.dir, "notify")
            self.sock.bind(self.name)
        self.sock.settimeout(0.2)
        self.msgs = []  # (time.monotonic(), {key: value})

    def env(self, watchdog_usec=None):
        e = {"NOTIFY_SOCKET": self.name}
        if watchdog_usec:
            e["WATCHDOG_USEC"] = str(watchdog_usec)
        return e

    def drain(self):
        while True:
            try:
                raw = self.sock.recv(4096)
            except socket.timeout:
                return
            fields = dict(l.split("=", 1) for l in raw.decode().split("\n") if l)
            self.msgs.append((time.monotonic(), fields))

    def wait(self, key, value=None, count=1, timeout=60):
        """The first `count` messages carrying key (=value) once that many came."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            got = [(t, m) for t, m in self.msgs
                   if key in m and (value is None or m[key] == value)]
            if len(got) >= count:
                return got
            assert time.monotonic() < deadline, \
                "no %d× %s=%s in %r" % (count, key, value, [m for _, m in self.msgs])

    def keys(self):
        self.drain()
        return [k for _, m in self.msgs for k in m if k != "WATCHDOG"]

    def close(self):
        self.sock.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify():
    sockets = []

    def make(abstract=False):
        s = NotifySocket(abstract)
        sockets.append(s)
        return s
    yield make
    for s in sockets:
        s.close()


def test_ready_after_broker_and_backend_then_watchdog_then_stopping(env, notify):
    ns = notify()
    w = env.worker(env=ns.env(watchdog_usec=1000000), wait_ready=False)
    [(_, ready)] = ns.wait("READY", "1")
    w.wait_for(r" ready\.$", timeout=10)
    assert ready["MAINPID"] == str(w.proc.pid)
    assert "consuming 1 queue" in ready["STATUS"]
    # Pings every half period (0.5 s). Only that they keep coming and are
    # spaced by a timer, not a burst: exact gaps are not asked of a loaded
    # machine.
    pings = ns.wait("WATCHDOG", "1", count=5, timeout=30)
    assert pings[-1][0] - pings[0][0] >= 1.0
    r = env.app.send_task("llm.generate", args=["under systemd"])
    assert r.get(timeout=30) == env.fake.expected_text("under systemd")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0
    ns.wait("STOPPING", "1", timeout=5)
    keys = ns.keys()
    assert keys.index("READY") < keys.index("STOPPING")
    assert "RELOADING" not in keys


def test_ready_only_once_the_broker_is_up(env, notify):
    """A broker down at start: the worker retries (Celery's start-up), feeding
    the watchdog meanwhile, and says READY=1 only once it connected."""
    ns = notify()
    port = free_port()
    w = env.worker(env=ns.env(watchdog_usec=1000000), start=False)
    w.args[w.args.index("-b") + 1] = "amqp://guest:guest@127.0.0.1:%d/%s" % (
        port, urllib.parse.quote(env.vhost, safe=""))
    w.start(wait_ready=False)
    w.wait_for(r"cannot connect to broker .* trying again", timeout=30)
    # the loop runs during the retry's wait, so systemd does not kill a
    # worker that waits for its broker
    ns.wait("WATCHDOG", "1", count=2, timeout=30)
    assert "READY" not in ns.keys()
    proxy = TcpProxy(env.services.amqp_port, listen_port=port).start()
    try:
        w.wait_for(r" ready\.$", timeout=120)
        [(_, ready)] = ns.wait("READY", "1", timeout=30)
        assert ready["MAINPID"] == str(w.proc.pid)
        w.stop()
    finally:
        proxy.close()


def test_no_watchdog_unless_asked_and_for_us(env, notify):
    ns = notify()
    e = ns.env(watchdog_usec=200000)
    e["WATCHDOG_PID"] = "1"  # the watchdog is another process's
    w = env.worker(env=e)
    ns.wait("READY", "1")
    time.sleep(1.5)
    ns.drain()
    assert not [m for _, m in ns.msgs if "WATCHDOG" in m]
    w.stop()


def test_abstract_socket_name(env, notify):
    ns = notify(abstract=True)
    w = env.worker(env=ns.env(watchdog_usec=1000000), wait_ready=False)
    [(_, ready)] = ns.wait("READY", "1")
    assert ready["MAINPID"] == str(w.proc.pid)
    ns.wait("WATCHDOG", "1", count=2, timeout=30)
    w.stop()


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_sighup_is_a_warm_restart_in_the_same_process(env, notify):
    ns = notify()
    port = free_port()
    w = env.worker("--metrics-port", str(port), env=ns.env(watchdog_usec=2000000),
                   wait_ready=False)
    ns.wait("READY", "1")
    pid = w.proc.pid
    fds = open_fds(pid)
    # A task in flight when the restart is asked for finishes before the exec.
    held = env.app.send_task("llm.generate", args=["across a reload"],
                             kwargs={"model": "fake/hold=reload"})
    wait_until(lambda: env.fake.held("reload") == 1, timeout=30)
    w.signal(signal.SIGHUP)
    [(t_rel, rel)] = ns.wait("RELOADING", "1", timeout=30)
    w.wait_for(r"Restarting celeriac \(SIGHUP\)", timeout=10)
    # Warm: while the task is held the old image waits for it, not ready again.
    time.sleep(1.0)
    assert ns.keys().count("READY") == 1 and w.count(r" ready\.$") == 1
    # systemd 253+ wants the time of the reload with it: CLOCK_MONOTONIC in µs
    mono_us = int(rel["MONOTONIC_USEC"])
    assert abs(mono_us / 1e6 - time.clock_gettime(time.CLOCK_MONOTONIC)) < 60
    env.fake.release("reload")
    held.get(timeout=30)
    assert held.successful()
    readies = ns.wait("READY", "1", count=2, timeout=60)
    assert readies[1][0] >= t_rel
    assert readies[1][1]["MAINPID"] == str(pid)  # exec keeps the pid
    assert w.proc.poll() is None and w.proc.pid == pid
    w.wait_for(r" ready\.$", count=2, timeout=30)
    # The new image feeds the watchdog and runs tasks.
    n = len([1 for _, m in ns.msgs if "WATCHDOG" in m])
    ns.wait("WATCHDOG", "1", count=n + 2, timeout=30)
    r = env.app.send_task("llm.generate", args=["after the reload"])
    assert r.get(timeout=30) == env.fake.expected_text("after the reload")
    # The new image bound the metrics port again, and nothing of the old one
    # leaked through the exec (its connections closed, not inherited).
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as m:
        assert m.status == 200
    assert open_fds(pid) <= fds + 2, os.listdir("/proc/%d/fd" % pid)
    keys = ns.keys()
    assert "STOPPING" not in keys
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0
    ns.wait("STOPPING", "1", timeout=5)


def test_stop_during_the_restart_wins(env, notify):
    ns = notify()
    w = env.worker(env=ns.env(), wait_ready=False)
    ns.wait("READY", "1")
    held = env.app.send_task("llm.generate", args=["stop wins"],
                             kwargs={"model": "fake/hold=stopwins"})
    wait_until(lambda: env.fake.held("stopwins") == 1, timeout=30)
    w.signal(signal.SIGHUP)
    ns.wait("RELOADING", "1", timeout=30)
    w.signal(signal.SIGTERM)
    ns.wait("STOPPING", "1", timeout=30)
    # still warm: the held task finishes, then the process ends for good
    env.fake.release("stopwins")
    held.get(timeout=30)
    assert held.successful()
    assert w.wait(timeout=60) == 0
    assert ns.keys().count("READY") == 1


def test_sighup_without_systemd_still_restarts(env):
    w = env.worker()
    pid = w.proc.pid
    w.signal(signal.SIGHUP)
    w.wait_for(r" ready\.$", count=2, timeout=60)
    assert w.proc.poll() is None and w.proc.pid == pid
    r = env.app.send_task("llm.generate", args=["no manager"])
    assert r.get(timeout=30) == env.fake.expected_text("no manager")
    w.stop()
    assert w.proc.returncode == 0


UNIT = os.path.join(ROOT, "packaging", "celeriac.service")


def test_unit_file():
    u = configparser.ConfigParser(strict=False, interpolation=None)
    u.optionxform = str
    u.read(UNIT)
    s = u["Service"]
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"
    assert int(s["WatchdogSec"]) > 0
    assert s["ExecStart"].split()[:2] == ["/usr/bin/celeriac", "worker"]
    assert s["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert s["KillSignal"] == "SIGTERM" and s["Restart"] == "on-failure"
    assert s["User"] == "celeriac"
    assert s["EnvironmentFile"] == "-/etc/default/celeriac"
    assert s["NoNewPrivileges"] == "yes" and s["ProtectSystem"] == "strict"
    assert u["Install"]["WantedBy"] == "multi-user.target"
    verify = shutil.which("systemd-analyze")
    if verify:
        # Offline check of the unit's syntax; the binary it names need not exist.
        p = subprocess.run([verify, "verify", UNIT], capture_output=True, text=True)
        bad = [l for l in p.stderr.splitlines()
               if "celeriac.service" in l and "Command /usr/bin/celeriac" not in l
               and "is not executable" not in l]
        assert not bad, p.stderr
