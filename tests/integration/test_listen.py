"""Issue 36: the gateway and the worker's /metrics listen only where --host
(--metrics-host) says, as the kernel's own table of listening sockets shows,
and a port already taken ends the command with status 1 and one clear line."""
import os
import re
import socket
import subprocess
import urllib.request

import pytest

from conftest import BIN, LineReader, free_port


def listeners(port):
    """The addresses with a TCP socket listening on port, from the kernel's
    tables (an IPv6 socket on :: shows as "::")."""
    found = set()
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not os.path.exists(path):
            continue
        with open(path) as f:
            next(f)
            for line in f:
                fields = line.split()
                addr, hexport = fields[1].split(":")
                if fields[3] != "0A" or int(hexport, 16) != port:
                    continue
                # Each 32-bit word is in the host's (little-endian) order.
                raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
                found.add(socket.inet_ntop(family, raw))
    return found


def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def resolved(name):
    return {ai[4][0] for ai in socket.getaddrinfo(name, 0, 0, socket.SOCK_STREAM, 0,
                                                  socket.AI_PASSIVE)}


def url_host(addr):
    return "[%s]" % addr if ":" in addr else addr


def get(host, port, path="/healthz"):
    with urllib.request.urlopen("http://%s:%d%s" % (url_host(host), port, path),
                                timeout=20) as r:
        return r.status


def refused(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam) as s:
        s.settimeout(10)
        try:
            s.connect((host, port))
        except OSError:
            return True
    return False


class Proc(LineReader):
    """A gateway or worker with its log (stdout and stderr) read line by line."""

    def __init__(self, args):
        self.read_lines(subprocess.Popen(args, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True,
                                         errors="replace"))

    def wait_for(self, pattern, timeout=60):
        return LineReader.wait_for(self, pattern, timeout)



@pytest.fixture
def gateway(env):
    procs = []

    def start(*args):
        p = Proc([BIN, "gateway", "-b", env.broker, "--result-backend", env.backend, *args])
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.stop()


HOSTS = ["127.0.0.1", "::1", "localhost"]


def expected(host):
    if host == "::1" and not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    return resolved(host)


@pytest.mark.parametrize("host", HOSTS)
def test_gateway_listens_only_where_told(gateway, host):
    want = expected(host)
    port = free_port()
    g = gateway("--host", host, "--port", str(port))
    # The line names what was asked for, as a URL one can paste (brackets
    # around an IPv6 address).
    g.wait_for(r"gateway listening on http://%s:%d/" % (re.escape(url_host(host)), port))
    assert listeners(port) == want
    for addr in want:
        assert get(addr, port) == 200
    for addr in {"127.0.0.1", "::1"} - want:
        if addr == "127.0.0.1" or has_ipv6_loopback():
            assert refused(addr, port), addr
    assert g.stop() == 0, "\n".join(g.lines)


def test_gateway_every_address_one_port(gateway):
    # "" is every address: 0.0.0.0 and, apart from it, ::, both on the one
    # port that port 0 picked.
    g = gateway("--host", "", "--port", "0")
    port = int(g.wait_for(r"gateway listening on http://0\.0\.0\.0:(\d+)/").group(1))
    want = {"0.0.0.0", "::"} if has_ipv6_loopback() else {"0.0.0.0"}
    assert listeners(port) == want
    assert get("127.0.0.1", port) == 200
    if has_ipv6_loopback():
        assert get("::1", port) == 200
    assert g.stop() == 0, "\n".join(g.lines)


def run_until_exit(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("still running 90 s after its port was found taken:\n%s"
                             % (e.stderr or b"").decode(errors="replace")[-3000:])


def taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_gateway_port_in_use_exits_1_with_one_line(env):
    blocker, port = taken_port()
    with blocker:
        r = run_until_exit([BIN, "gateway", "-b", env.broker, "--result-backend", env.backend,
                            "--host", "127.0.0.1", "--port", str(port)])
    assert r.returncode == 1, (r.returncode, r.stderr)
    said = [l for l in r.stderr.splitlines() if "in use" in l]
    assert len(said) == 1 and "127.0.0.1:%d: address already in use" % port in said[0], \
        r.stderr
    assert "listening" not in r.stderr + r.stdout, r.stderr
    assert "lws" not in r.stderr, r.stderr


def test_metrics_listen_only_where_told(env):
    for host in HOSTS:
        if host == "::1" and not has_ipv6_loopback():
            continue
        want = resolved(host)
        port = free_port()
        w = env.worker("--metrics-port", str(port), "--metrics-host", host)
        w.wait_for(r"metrics: serving /metrics and /healthz on http://%s:%d"
                   % (re.escape(url_host(host)), port))
        assert listeners(port) == want, host
        for addr in want:
            assert get(addr, port) == 200
        for addr in {"127.0.0.1", "::1"} - want:
            if addr == "127.0.0.1" or has_ipv6_loopback():
                assert refused(addr, port), (host, addr)
        w.stop()
        assert w.proc.returncode == 0, w.log()


def test_metrics_port_in_use_exits_1_with_one_line(env):
    blocker, port = taken_port()
    with blocker:
        w = env.worker("--metrics-port", str(port), start=False)
        w.start(wait_ready=False)
        rc = w.wait(timeout=90)
    assert rc == 1, w.log()
    said = [l for l in w.lines if "in use" in l]
    assert len(said) == 1 and "127.0.0.1:%d: address already in use" % port in said[0], \
        w.log()
    assert " ready." not in w.log() and "serving /metrics" not in w.log(), w.log()
