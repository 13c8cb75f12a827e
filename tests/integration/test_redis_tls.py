"""rediss://: the Redis broker and the Redis result backend over TLS.

Each test module gets a CA, a server certificate (SAN 127.0.0.1 and
localhost), a client certificate and a second, unrelated CA, made with the
openssl CLI, and private redis-server processes that speak TLS only (Debian's
redis-server 7.0 has TLS built in): one that asks for no client certificate
and one that requires it. Python Celery 5.2.6 (kombu, redis-py over ssl) is the
producer and reads the results; celeriac runs the tasks."""
import gc
import os
import subprocess
import time

import pytest
from celery import Celery

from conftest import free_port, wait_until

# Its module fixtures (certificates, a TLS Redis) start once: the file runs on one worker.
pytestmark = pytest.mark.xdist_group("redis_tls")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    cwd = str(d)
    for ca in ("ca", "other"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca + ".key",
                 "-out", ca + ".pem", "-days", "2", "-subj", "/CN=celeriac test " + ca,
                 cwd=cwd)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".csr", "-subj", "/CN=" + name, cwd=cwd)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", name + ".pem", "-days", "2", *ext, cwd=cwd)
    return {k: str(d / f) for k, f in (("ca", "ca.pem"), ("other_ca", "other.pem"),
                                       ("cert", "server.pem"), ("key", "server.key"),
                                       ("client_cert", "client.pem"),
                                       ("client_key", "client.key"), ("dir", ""))}


class TlsRedis:
    """A redis-server on a TLS port only (the plain port is 0: closed)."""

    def __init__(self, pki, auth_clients, workdir):
        self.pki = pki
        self.auth = auth_clients
        self.dir = workdir
        self.port = free_port()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--tls-port", str(self.port),
             "--bind", "127.0.0.1", "--tls-cert-file", self.pki["cert"],
             "--tls-key-file", self.pki["key"], "--tls-ca-cert-file", self.pki["ca"],
             "--tls-auth-clients", "yes" if self.auth else "no", "--dir", self.dir,
             "--save", "", "--appendonly", "yes", "--databases", "4"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.ping(), timeout=20, interval=0.1,
                   what="redis-server on TLS port %d" % self.port)
        return self

    def cli(self, *args):
        cmd = ["redis-cli", "--tls", "--cacert", self.pki["ca"], "-p", str(self.port)]
        if self.auth:
            cmd += ["--cert", self.pki["client_cert"], "--key", self.pki["client_key"]]
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=20)

    def ping(self):
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited (%s)" % self.proc.returncode)
        return self.cli("PING").stdout.strip() == "PONG"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis writes its append-only file and exits
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def url(self, db=0, **query):
        q = "&".join("%s=%s" % kv for kv in query.items())
        return "rediss://127.0.0.1:%d/%d%s" % (self.port, db, "?" + q if q else "")


@pytest.fixture(scope="module")
def tls_redis(pki, tmp_path_factory):
    r = TlsRedis(pki, False, str(tmp_path_factory.mktemp("redis-tls"))).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def mtls_redis(pki, tmp_path_factory):
    r = TlsRedis(pki, True, str(tmp_path_factory.mktemp("redis-mtls"))).start()
    yield r
    r.stop()


@pytest.fixture(autouse=True)
def _flush(request):
    for name in ("tls_redis", "mtls_redis"):
        if name in request.fixturenames:
            request.getfixturevalue(name).cli("FLUSHALL")
    yield
    # An AsyncResult left in a cycle says goodbye to its backend when
    # collected: let that happen while the server is still up.
    gc.collect()


def tls_app(broker, backend):
    app = Celery("tls", broker=broker, backend=backend)
    app.conf.update(result_expires=3600, broker_connection_retry_on_startup=True)
    return app


def verified(r, db, pki, **extra):
    return r.url(db, ssl_cert_reqs="required", ssl_ca_certs=pki["ca"], **extra)


def run_both_tasks(env, app):
    acc = app.send_task("celery.accumulate", args=[1, 2, 3])
    gen = app.send_task("llm.generate", args=["hello over tls"])
    assert acc.get(timeout=30) == [1, 2, 3]
    assert gen.get(timeout=30) == env.fake.expected_text("hello over tls")


def test_broker_and_backend_over_rediss(env, tls_redis, pki):
    broker, backend = verified(tls_redis, 1, pki), verified(tls_redis, 2, pki)
    w = env.worker("-b", broker, "--result-backend", backend)
    app = tls_app(broker, backend)
    try:
        run_both_tasks(env, app)
        # Many at once: both directions of the pump under load.
        rs = [app.send_task("celery.accumulate", args=[i]) for i in range(300)]
        assert [r.get(timeout=60) for r in rs] == [[i] for i in range(300)]
    finally:
        app.close()
    # Nothing went over plain TCP: the server has no plain port at all, and
    # the worker says where it went.
    assert w.count(r"Connected to rediss://127\.0\.0\.1:%d/2" % tls_redis.port) == 1
    assert w.count("TLS:") == 0
    # The private sockets of the pump are gone once hiredis is connected.
    assert not [n for n in os.listdir("/tmp") if n.startswith("celeriac-tls-")
                and os.stat(os.path.join("/tmp", n)).st_uid == os.getuid()
                and os.path.exists(os.path.join("/tmp", n, "s"))]


def test_no_ssl_options_verify_nothing(env, tls_redis, pki):
    """kombu's rule for the broker: rediss:// with no ssl option warns and
    checks no certificate; the backend says ssl_cert_reqs=none itself."""
    broker = tls_redis.url(1)
    backend = tls_redis.url(2, ssl_cert_reqs="none")
    w = env.worker("-b", broker, "--result-backend", backend)
    app = tls_app(broker, backend)
    try:
        run_both_tasks(env, app)
    finally:
        app.close()
    assert w.count(r"broker: rediss:// without ssl_cert_reqs verifies no certificate") == 1


def test_backend_rediss_without_cert_reqs_is_a_startup_error(env, tls_redis):
    w = env.worker("--result-backend", tls_redis.url(2), start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=30) != 0
    assert w.count("rediss:// without ssl_cert_reqs") == 1


def test_wrong_ca_is_one_clear_line(env, tls_redis, pki):
    good = verified(tls_redis, 2, pki)
    bad = tls_redis.url(1, ssl_cert_reqs="required", ssl_ca_certs=pki["other_ca"])
    w = env.worker("-b", bad, "--result-backend", good,
                   "--broker-connection-retry-on-startup", "false", start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=60) != 0
    lines = [l for l in w.lines if "TLS: certificate verify failed" in l]
    assert len(lines) == 1, w.log()
    assert "cannot connect to broker" in lines[0]


def test_missing_ca_file_is_a_startup_error(env, tls_redis, tmp_path):
    missing = str(tmp_path / "nope.pem")
    w = env.worker("-b", tls_redis.url(1, ssl_cert_reqs="required", ssl_ca_certs=missing),
                   start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=30) != 0
    assert w.count("cannot load ssl_ca_certs '%s': No such file or directory" % missing) == 1


def test_client_certificate(env, mtls_redis, pki):
    client = {"ssl_certfile": pki["client_cert"], "ssl_keyfile": pki["client_key"]}
    broker = verified(mtls_redis, 1, pki, **client)
    backend = verified(mtls_redis, 2, pki, **client)
    w = env.worker("-b", broker, "--result-backend", backend)
    app = tls_app(broker, backend)
    try:
        run_both_tasks(env, app)
    finally:
        app.close()
    assert w.count("TLS:") == 0
    # Without one, the server's refusal is the reason given. Under TLS 1.3 the
    # client's handshake ends before the server has checked its certificate:
    # the server's alert, or (when the client's first write meets the closed
    # socket first) the reset that follows it, is what the client sees.
    w2 = env.worker("--result-backend", verified(mtls_redis, 2, pki),
                    "--broker-connection-retry-on-startup", "false", start=False)
    w2.start(wait_ready=False)
    assert w2.wait(timeout=60) != 0
    assert w2.count(r"cannot connect to result backend rediss://.*TLS: .*(certificate "
                    r"required|connection reset by peer)") == 1, w2.log()


def test_redis_restart_over_tls(env, tls_redis, pki):
    """Redis goes away under a running worker: every connection is lost,
    retried over TLS, and comes back; no task sent before or after is lost."""
    broker, backend = verified(tls_redis, 1, pki), verified(tls_redis, 2, pki)
    w = env.worker("-b", broker, "--result-backend", backend)
    app = tls_app(broker, backend)
    try:
        assert app.send_task("celery.accumulate", args=[0]).get(timeout=30) == [0]
        # Queued while the worker's prefetch is full of held LLM calls? Not
        # needed: tasks sent before the restart are simply in Redis's lists,
        # which the append-only file keeps.
        before = [app.send_task("celery.accumulate", args=[i]).id for i in range(20)]
    finally:
        app.close()
    tls_redis.stop()
    w.wait_for(r"lost: TLS: connection closed by the server; reconnecting", timeout=30)
    time.sleep(1)  # a failed attempt or two with the server down
    tls_redis.start()
    w.wait_for(r"broker: connection to rediss://.* is back", timeout=60)
    app = tls_app(broker, backend)
    try:
        after = [app.send_task("celery.accumulate", args=[i]) for i in range(20, 40)]
        assert [r.get(timeout=60) for r in after] == [[i] for i in range(20, 40)]
        for i, tid in enumerate(before):
            assert app.AsyncResult(tid).get(timeout=60) == [i]
    finally:
        app.close()
    assert w.proc.poll() is None


def test_dlq_cli_over_rediss(tls_redis, pki):
    """`celeriac dlq` (blocking hiredis) carries its commands through the
    same pump, on a thread of its own."""
    from conftest import BIN
    tls_redis.cli("-n", "1", "LPUSH", "celeriac.dead", "not an envelope")

    def dlq(url, *args):
        return subprocess.run([BIN, "dlq", "-b", url, *args], capture_output=True,
                              text=True, timeout=60)

    out = dlq(verified(tls_redis, 1, pki), "purge")
    assert out.returncode == 0, out.stderr
    assert tls_redis.cli("-n", "1", "LLEN", "celeriac.dead").stdout.strip() == "0"
    out = dlq(tls_redis.url(1, ssl_cert_reqs="required", ssl_ca_certs=pki["other_ca"]),
              "list")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith(
        "celeriac dlq: redis: TLS: certificate verify failed ("), out.stderr
