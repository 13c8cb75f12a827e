"""tls_front.py -- a private nginx as the TLS and HTTP/2 front of a plain-HTTP
fake LLM server, for the TLS bench row and the HTTP/2 integration test.

    front = TlsFront(upstream_port, workdir)   # writes a CA, a cert, the config
    front.start()                              # nginx on a free port
    front.base_url                             # https://127.0.0.1:<port>/v1
    front.ca_file                              # the CA the worker must trust
    front.stats()   # {"requests", "connections", "resumed", "h2_requests"}
    front.stop()

The CA and the server certificate (for 127.0.0.1 and localhost) are made with
openssl at start, in workdir, which also holds the config, the pid file and
the logs. nginx runs in the foreground as a child of the caller (daemon off),
never as a system service. The access log has one line per request with the
connection's serial number and whether its TLS session was resumed, so
stats() can tell how many connections (each one TLS handshake) the requests
took, and how many of those handshakes were resumptions."""

import os
import socket
import subprocess
import time

NGINX = os.environ.get("CELERIAC_NGINX", "/usr/sbin/nginx")

CONF = """daemon off;
worker_processes {workers};
worker_rlimit_nofile 200000;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 60000;
    multi_accept on;
}}
http {{
    log_format front '$connection $ssl_session_reused $server_protocol $status';
    access_log {d}/access.log front;
    client_body_temp_path {d}/tmp-body;
    proxy_temp_path {d}/tmp-proxy;
    fastcgi_temp_path {d}/tmp-fastcgi;
    uwsgi_temp_path {d}/tmp-uwsgi;
    scgi_temp_path {d}/tmp-scgi;
    upstream fake {{
        server 127.0.0.1:{up};
        keepalive 2048;
    }}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {d}/server.pem;
        ssl_certificate_key {d}/server.key;
        ssl_session_cache shared:front:10m;
        ssl_session_timeout 1h;
        http2_max_concurrent_streams {streams};
        keepalive_requests 10000000;
        keepalive_timeout 600s;
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class TlsFront:
    def __init__(self, upstream_port, workdir, streams=1000, workers=1):
        self.d = os.path.abspath(workdir)
        os.makedirs(self.d, exist_ok=True)
        os.chmod(self.d, 0o755)  # nginx's workers read nothing here, but may stat
        self.upstream_port = upstream_port
        self.streams = streams
        self.workers = workers
        self.port = None
        self.p = None
        self.ca_file = os.path.join(self.d, "ca.pem")

    def _certs(self):
        d = self.d
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                 "-subj", "/CN=celeriac test CA", cwd=d)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
        with open(os.path.join(d, "ext.cnf"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                    "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf",
                 cwd=d)

    @property
    def base_url(self):
        return "https://127.0.0.1:%d/v1" % self.port

    def start(self, timeout=30):
        self._certs()
        self.port = free_port()
        conf = os.path.join(self.d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(CONF.format(d=self.d, up=self.upstream_port, port=self.port,
                                streams=self.streams, workers=self.workers))
        self.p = subprocess.Popen([NGINX, "-p", self.d, "-e", self.d + "/error.log",
                                   "-c", conf], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("nginx exited (%s): %s" % (self.p.returncode, self.errors()))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("nginx did not listen on %d: %s" % (self.port, self.errors()))

    def errors(self):
        try:
            with open(os.path.join(self.d, "error.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def stats(self):
        """Counts from the access log: requests, connections they used (each
        one TLS handshake), handshakes that resumed a session, HTTP/2 ones."""
        conns, resumed = set(), set()
        n = h2 = 0
        try:
            with open(os.path.join(self.d, "access.log")) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 4:
                        continue
                    n += 1
                    conns.add(parts[0])
                    if parts[1] == "r":
                        resumed.add(parts[0])
                    if parts[2] == "HTTP/2.0":
                        h2 += 1
        except OSError:
            pass
        return {"requests": n, "connections": len(conns), "resumed": len(resumed),
                "h2_requests": h2}

    def reset(self):
        """Empties the access log (nginx keeps writing to the same file)."""
        open(os.path.join(self.d, "access.log"), "w").close()

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.terminate()  # SIGTERM: nginx's fast shutdown
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.p = None
