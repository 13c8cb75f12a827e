"""A private Redis Sentinel deployment for one test: a master, a replica and
three sentinels on free ports, all under the test's tmp dir, started with
Debian's redis-server (and redis-server --sentinel).

    cluster = SentinelCluster(tmp_path).start()
    cluster.url(db=3)            # "sentinel://127.0.0.1:P1/3;sentinel://...;..."
    cluster.master_name          # "mymaster"
    cluster.master_client(db=3)  # redis-py client of the current master
    cluster.failover()           # SENTINEL FAILOVER, waits for the new master
    cluster.stop()

Reusable by any test (the broker over Sentinel uses the same helpers)."""
import os
import subprocess
import time

import redis

from conftest import free_port, wait_until

REDIS_SERVER = "/usr/bin/redis-server"


class _Proc:
    def __init__(self, name, conf_path, args, log_path):
        self.name = name
        self.log_path = log_path
        self.proc = subprocess.Popen([REDIS_SERVER, conf_path, *args],
                                     stdout=open(log_path, "w"), stderr=subprocess.STDOUT)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SentinelCluster:
    """One master, one replica, three sentinels (quorum 2) on 127.0.0.1.

    sentinel_password: when given, every sentinel requires it (Celery's
    sentinel_kwargs={'password': ...}). down_after_ms is how fast the
    sentinels judge a silent master down. min_replicas_to_write (Redis's
    min-replicas-to-write, with min-replicas-max-lag 2) makes a master that
    lost its replica refuse writes (NOREPLICAS): without it, what a demoted
    master accepts between the replica's promotion and its own demotion is
    acknowledged and then lost (asynchronous replication)."""

    def __init__(self, tmp_path, master_name="mymaster", sentinel_password=None,
                 down_after_ms=1000, n_sentinels=3, min_replicas_to_write=0):
        self.dir = str(tmp_path)
        self.master_name = master_name
        self.sentinel_password = sentinel_password
        self.down_after_ms = down_after_ms
        self.ports = [free_port(), free_port()]  # master, replica at start
        self.sentinel_ports = [free_port() for _ in range(n_sentinels)]
        self.min_replicas_to_write = min_replicas_to_write
        self.procs = []

    # ---------------------------------------------------------- start / stop

    def _server(self, name, port, extra=""):
        d = os.path.join(self.dir, name)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "redis.conf")
        with open(conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndir %s\nsave \"\"\nappendonly no\n"
                    "protected-mode no\n%s" % (port, d, extra))
            if self.min_replicas_to_write:
                # With no delay before a full sync's transfer (Redis waits 5 s
                # for more replicas to join it by default, and there is only
                # one), the demoted master is a good replica again 5 s sooner
                # after a failover, and the new master takes writes again.
                f.write("min-replicas-to-write %d\nmin-replicas-max-lag 2\n"
                        "repl-diskless-sync-delay 0\n" % self.min_replicas_to_write)
        return _Proc(name, conf, [], os.path.join(d, "log"))

    def _sentinel(self, i, port):
        d = os.path.join(self.dir, "sentinel%d" % i)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "sentinel.conf")
        with open(conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndir %s\nprotected-mode no\n"
                    "sentinel monitor %s 127.0.0.1 %d 2\n"
                    "sentinel down-after-milliseconds %s %d\n"
                    "sentinel failover-timeout %s 10000\n"
                    "sentinel parallel-syncs %s 1\n"
                    % (port, d, self.master_name, self.ports[0], self.master_name,
                       self.down_after_ms, self.master_name, self.master_name))
            if self.sentinel_password:
                f.write("requirepass %s\nsentinel sentinel-pass %s\n"
                        % (self.sentinel_password, self.sentinel_password))
        return _Proc("sentinel%d" % i, conf, ["--sentinel"], os.path.join(d, "log"))

    def start(self, timeout=20):
        self.procs.append(self._server("master", self.ports[0]))
        self.procs.append(self._server("replica", self.ports[1],
                                       "replicaof 127.0.0.1 %d\n" % self.ports[0]))
        for p in self.ports:
            c = redis.Redis(host="127.0.0.1", port=p, socket_timeout=2)
            wait_until(lambda: self._ping(c), timeout, what="redis on %d" % p)
        replica = redis.Redis(host="127.0.0.1", port=self.ports[1], socket_timeout=2)
        wait_until(lambda: replica.info("replication").get("master_link_status") == "up",
                   timeout, what="the replica in sync")
        for i, p in enumerate(self.sentinel_ports):
            self.procs.append(self._sentinel(i, p))
        # Ready when every sentinel knows the master, the replica and the
        # other sentinels: only then can a failover be agreed and done.
        def ready():
            for p in self.sentinel_ports:
                try:
                    s = self.sentinel_client(p)
                    m = s.execute_command("SENTINEL", "MASTER", self.master_name)
                    m = dict(zip(m[::2], m[1::2]))
                    if int(m[b"num-slaves"]) < 1 or \
                            int(m[b"num-other-sentinels"]) < len(self.sentinel_ports) - 1:
                        return False
                except redis.RedisError:
                    return False
            return True
        wait_until(ready, timeout, interval=0.2, what="the sentinels to see everything")
        return self

    def stop(self):
        for p in reversed(self.procs):
            p.stop()
        self.procs = []

    @staticmethod
    def _ping(c):
        try:
            return c.ping()
        except redis.RedisError:
            return False

    # ---------------------------------------------------------------- access

    def url(self, db=0, first_dead_port=None):
        """The sentinel:// URL Celery takes; first_dead_port puts a sentinel
        nobody listens on first, to test moving on to the next one."""
        entries = ["sentinel://127.0.0.1:%d/%d" % (p, db) for p in self.sentinel_ports]
        if first_dead_port:
            entries.insert(0, "sentinel://127.0.0.1:%d/%d" % (first_dead_port, db))
        return ";".join(entries)

    def transport_options(self):
        """Celery's {broker,result_backend}_transport_options for this cluster."""
        o = {"master_name": self.master_name}
        if self.sentinel_password:
            o["sentinel_kwargs"] = {"password": self.sentinel_password}
        return o

    def sentinel_client(self, port=None):
        return redis.Redis(host="127.0.0.1", port=port or self.sentinel_ports[0],
                           password=self.sentinel_password, socket_timeout=2)

    def master_addr(self):
        host, port = self.sentinel_client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        return host.decode(), int(port)

    def master_client(self, db=0):
        host, port = self.master_addr()
        return redis.Redis(host=host, port=port, db=db, socket_timeout=5)

    # -------------------------------------------------------------- failover

    def failover(self, timeout=30):
        """Forces a failover and waits until the sentinels name the other
        server and it says it is the master. Returns its (host, port)."""
        old = self.master_addr()
        self.sentinel_client().execute_command("SENTINEL", "FAILOVER", self.master_name)

        def switched():
            try:
                addr = self.master_addr()
                if addr == old:
                    return None
                role = redis.Redis(host=addr[0], port=addr[1], socket_timeout=2).execute_command("ROLE")
                return addr if role[0] == b"master" else None
            except redis.RedisError:
                return None
        return wait_until(switched, timeout, interval=0.1, what="the failover")

    def wait_writable(self, timeout=60):
        """With min_replicas_to_write, waits until the current master takes
        writes. A promoted replica refuses them (NOREPLICAS) until a sentinel
        has made the old master its replica (the sentinels send INFO to a
        replica every 10 s, and reconfigure one only once it has said it is a
        master for 8 s) and that one has synced: about 11 s after a failover
        here, longer on a loaded host. This is
        Redis's time, not the worker's: tests wait for it first, then bound the
        worker's own progress."""
        if not self.min_replicas_to_write:
            return

        def good():
            try:
                info = self.master_client().info("replication")
            except redis.RedisError:
                return False
            return info.get("role") == "master" and \
                info.get("min_slaves_good_slaves", 0) >= self.min_replicas_to_write
        wait_until(good, timeout, interval=0.2,
                   what="the master to take writes again (a replica in sync)")
