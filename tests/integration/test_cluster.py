"""Issue 17: a broker URL list over a RabbitMQ cluster. Three private nodes are
started here (their own names, ports and data dirs; joined with `rabbitmqctl
join_cluster`), the Python producer declares the queue quorum, and the node the
worker is connected to is killed with SIGKILL in the middle of the run."""
import os
import shutil
import signal
import subprocess
import time
import uuid

import pytest
from kombu import Exchange, Queue

from conftest import free_port, wait_until
from erlctl import registered


def _run(args, env=None, timeout=180, check=True):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                          check=check, cwd="/tmp")


class Node:
    def __init__(self, base, tag, i):
        self.name = "celeriac_cl%s_%d@localhost" % (tag, i)
        self.port = free_port()
        self.dir = os.path.join(base, "n%d" % i)
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "rabbitmq.conf"), "w") as f:
            f.write("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n" % self.port)
        with open(os.path.join(self.dir, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        self.env = dict(os.environ)
        self.env.update(RABBITMQ_NODENAME=self.name, RABBITMQ_NODE_PORT=str(self.port),
                        RABBITMQ_DIST_PORT=str(free_port()),
                        RABBITMQ_MNESIA_BASE=os.path.join(self.dir, "mnesia"),
                        RABBITMQ_LOG_BASE=os.path.join(self.dir, "log"),
                        RABBITMQ_PID_FILE=os.path.join(self.dir, "pid"),
                        RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(self.dir, "enabled_plugins"),
                        RABBITMQ_CONFIG_FILE=os.path.join(self.dir, "rabbitmq"))
        self.killed = False

    def url(self):
        return "amqp://guest:guest@127.0.0.1:%d//" % self.port

    def ctl(self, *args, check=True, timeout=180):
        return _run(["rabbitmqctl", "-q", "-n", self.name, *args], timeout=timeout,
                    check=check)

    def start(self):
        _run(["rabbitmq-server", "-detached"], env=self.env)

    def pid(self):
        with open(os.path.join(self.dir, "pid")) as f:
            return int(f.read().strip() or 0)

    def kill(self):
        os.kill(self.pid(), signal.SIGKILL)
        self.killed = True

    def stop(self):
        if self.killed:
            return
        pid = None
        try:
            pid = self.pid()
        except (OSError, ValueError):
            pass
        self.ctl("stop", check=False, timeout=120)
        if pid:
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.2)
            else:
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster(services):
    base = os.path.join(services.dir, "cluster-" + uuid.uuid4().hex[:6])
    os.makedirs(base)
    nodes = [Node(base, uuid.uuid4().hex[:6], i) for i in range(1, 4)]
    if shutil.which("chown"):
        _run(["chown", "-R", "rabbitmq:rabbitmq", base], check=False)
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            # await_startup needs a node that answers already
            wait_until(lambda: registered(n.name),
                       timeout=120, interval=0.5, what="node %s to answer" % n.name)
            n.ctl("await_startup", "--timeout", "180", timeout=200)
        for n in nodes[1:]:
            n.ctl("stop_app")
            n.ctl("join_cluster", nodes[0].name)
            n.ctl("start_app")
        out = nodes[0].ctl("cluster_status").stdout
        assert all(n.name in out for n in nodes), out
        yield nodes
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.slow
def test_node_killed_under_a_quorum_queue_loses_nothing_and_pays_once(env, cluster):
    n1, n2, n3 = cluster
    q = Queue("celery", Exchange("celery", "direct"), routing_key="celery",
              queue_arguments={"x-queue-type": "quorum"})
    # The producer is on the second node: only the worker loses its node.
    app = env.make_app(broker_url=n2.url(), task_queues=[q])
    with app.connection_for_write() as conn:
        q(conn.default_channel).declare()
    env.fake.reset()
    # 2,000 calls of 250 ms at -c 50: ten seconds of work, so the kill lands mid-run
    env.fake._req("POST", "/__config", {"defaults": "latency_ms=250;tokens=2"})
    # Published before the worker starts: on a loaded machine a worker already
    # running could finish each task about as soon as Python had sent it, and
    # the run be over before the kill.
    n = 2000
    with app.producer_or_acquire() as prod:
        results = [app.send_task("llm.generate", args=["cl%d" % i], producer=prod)
                   for i in range(n)]
    w = env.worker("-b", ";".join(n.url() for n in cluster), "--queue-type", "quorum",
                   "--delayed-delivery", "off", "-c", "50")
    # round-robin starts with the first node of the list: the one killed below
    w.wait_for(r"Connected to .*:%d/.* \(node 1 of 3" % n1.port)

    def done():
        # one round trip: 2,000 of them would take a good part of the run
        pipe = env.redis.pipeline(transaction=False)
        for r in results:
            pipe.exists("celery-task-meta-" + r.id)
        return sum(pipe.execute())

    wait_until(lambda: done() >= 300, timeout=180, interval=0.2, what="300 results")
    assert done() < n, "the run ended before the node could be killed"
    n1.kill()
    w.wait_for(r"connection to broker lost", timeout=60)
    w.wait_for(r"Connected to .*:(%d|%d)/.* \(node [23] of 3" % (n2.port, n3.port),
               timeout=120)
    for r in results:
        assert r.get(timeout=300) is not None
    assert w.proc.poll() is None
    for r in results:
        assert env.meta(r.id)["status"] == "SUCCESS"
    prompts = [e["prompt"] for e in env.fake.stats() if e.get("prompt")]
    counts = {}
    for p in prompts:
        counts[p] = counts.get(p, 0) + 1
    twice = sorted(p for p, c in counts.items() if c > 1)
    assert not twice, "billed more than once: %s" % twice[:10]
    assert len(counts) == n
    app.close()


def test_first_node_down_starts_on_the_next(env):
    """No cluster needed: a dead first URL is passed over, at start and after."""
    dead = "amqp://guest:guest@127.0.0.1:%d//" % free_port()
    w = env.worker("-b", dead + ";" + env.broker, "--broker-failover-strategy", "round-robin")
    w.wait_for(r"Connected to .*node 2 of 2")
    assert "trying the next node" in w.log()
    assert env.app.send_task("llm.generate", args=["after a dead node"]).get(timeout=30)


@pytest.mark.parametrize("url,strategy,says", [
    ("amqp://a;;amqp://b", "round-robin", "entry 2 is empty"),
    ("amqp://a;amqp://b:0", "round-robin", "entry 2"),
    ("amqp://a;amqp://b", "random", "round-robin or shuffle"),
])
def test_bad_lists_are_refused_at_start(env, url, strategy, says):
    w = env.worker("-b", url, "--broker-failover-strategy", strategy, start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=30) != 0
    assert says in w.log()
