"""Issue 36: start-up as Celery's -- the broker and the result backend tried
again at start-up with a line per attempt and a bound, losses and returns said
at the default level, and the start-up mistakes a new user makes (an alias's
typo, a providers file's syntax error, no API key, transport options that are
not JSON) each said in one clear line."""
import os
import re
import subprocess
import time
import urllib.parse

import pytest

from conftest import BIN, free_port, wait_until
from tcpproxy import TcpProxy

RETRY = (r"WARNING/MainProcess\] cannot connect to broker "
         r"'amqp://guest:\*+@127\.0\.0\.1:%d/[^']*': connection refused; "
         r"trying again in (\d+) s \(retry (\d+) of (\d+)\)$")


def amqp_url(env, port):
    return "amqp://guest:guest@127.0.0.1:%d/%s" % (port, urllib.parse.quote(env.vhost, safe=""))


def worker_on(env, broker, *args, **kw):
    """A worker of env's whose broker URL is broker, started without waiting."""
    w = env.worker(*args, start=False, **kw)
    w.args[w.args.index("-b") + 1] = broker
    return w.start(wait_ready=False)


def run(env, *args, extra_env=None, timeout=60):
    e = dict(os.environ, OPENAI_API_KEY="sk-x", OPENAI_BASE_URL=env.fake.base + "/v1")
    e.update(extra_env or {})
    return subprocess.run([BIN, "worker", "-b", env.broker, "--result-backend", env.backend,
                           *args], capture_output=True, text=True, timeout=timeout, env=e)


def test_broker_down_at_start_is_retried_until_it_opens(env):
    port = free_port()
    w = worker_on(env, amqp_url(env, port))
    # A line per failed attempt, in words, with the wait and the bound.
    w.wait_for(RETRY % port, timeout=30)
    m = re.search(RETRY % port, w.log(), re.M)
    assert m.groups() == ("2", "1", "100"), w.log()
    assert "a socket error occurred" not in w.log()
    # RabbitMQ "comes up": something listens on the port from now on.
    proxy = TcpProxy(env.services.amqp_port, listen_port=port).start()
    try:
        w.wait_for(r" ready\.$", timeout=120)
        assert env.app.send_task("celery.accumulate", args=[7]).get(timeout=30) == [7]
        assert w.proc.poll() is None
    finally:
        w.stop()
        proxy.close()


def test_broker_retries_end_at_the_bound_with_one_line(env):
    port = free_port()
    w = worker_on(env, amqp_url(env, port), "--broker-connection-max-retries", "2")
    assert w.wait(timeout=120) == 1, w.log()
    time.sleep(0.2)  # the log pump reads the last lines
    retries = [l for l in w.lines if re.search(RETRY % port, l)]
    assert [re.search(RETRY % port, l).groups() for l in retries] == \
        [("2", "1", "2"), ("4", "2", "2")], w.log()
    last = [l for l in w.lines if "CRITICAL" in l]
    assert len(last) == 1, w.log()
    assert re.search(r"cannot connect to broker 'amqp://guest:\*+@127\.0\.0\.1:%d/[^']*': "
                     r"connection refused; giving up after 2 retries "
                     r"\(--broker-connection-max-retries\)$" % port, last[0]), last
    assert " ready." not in w.log()


def test_retry_on_startup_off_is_one_attempt(env):
    port = free_port()
    w = worker_on(env, amqp_url(env, port), "--broker-connection-retry-on-startup", "false")
    assert w.wait(timeout=60) == 1, w.log()
    time.sleep(0.2)
    assert w.count("trying again") == 0, w.log()
    assert w.count(r"CRITICAL.*cannot connect to broker .*: connection refused$") == 1, w.log()


def test_backend_down_at_start_is_retried_then_bound(env):
    port = free_port()
    w = env.worker("--result-backend", "redis://127.0.0.1:%d/3" % port,
                   "--broker-connection-max-retries", "2", start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=120) == 1, w.log()
    time.sleep(0.2)
    rx = (r"WARNING/MainProcess\] cannot connect to result backend redis://127\.0\.0\.1:%d/3: "
          r"Connection refused; trying again in (\d+) s \(retry (\d) of 2\)$" % port)
    assert [re.search(rx, l).groups() for l in w.lines if re.search(rx, l)] == \
        [("2", "1"), ("4", "2")], w.log()
    last = [l for l in w.lines if "CRITICAL" in l]
    assert len(last) == 1 and "giving up after 2 retries" in last[0], w.log()
    assert "cannot connect to broker" not in w.log()  # the backend comes first


def test_backend_that_comes_up_later_is_waited_for(env, tmp_path):
    port = free_port()
    w = env.worker("--result-backend", "redis://127.0.0.1:%d/3" % port, start=False)
    w.start(wait_ready=False)
    w.wait_for(r"cannot connect to result backend .*; trying again in 2 s \(retry 1 of 100\)",
               timeout=30)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        w.wait_for(r" ready\.$", timeout=120)
    finally:
        w.stop()
        proc.terminate()
        proc.wait(timeout=20)


def test_lost_and_back_are_said_at_the_default_level(env):
    """A reset broker connection and a reset result-backend connection: each
    said once when lost and once when back, at WARNING (-l warning)."""
    bproxy = TcpProxy(env.services.amqp_port).start()
    rproxy = TcpProxy(env.services.redis_port).start()
    try:
        w = env.worker("-l", "warning", start=False)
        w.args[w.args.index("-b") + 1] = amqp_url(env, bproxy.port)
        w.args[w.args.index("--result-backend") + 1] = \
            "redis://127.0.0.1:%d/%d" % (rproxy.port, env.db)
        w.start()
        assert env.app.send_task("celery.accumulate", args=[1]).get(timeout=20) == [1]
        bproxy.reset_all()
        w.wait_for(r"WARNING/MainProcess\] consumer: connection to broker lost: ", timeout=30)
        w.wait_for(r"WARNING/MainProcess\] Connected to amqp://guest:\*+@127\.0\.0\.1:%d/.* "
                   r"again: the broker connection is back$" % bproxy.port, timeout=60)
        rproxy.reset_all()
        w.wait_for(r"WARNING/MainProcess\] result backend: connection lost: ", timeout=30)
        w.wait_for(r"WARNING/MainProcess\] Connected to redis://127\.0\.0\.1:%d/%d again: "
                   r"the result backend connection is back$" % (rproxy.port, env.db),
                   timeout=60)
        assert env.app.send_task("celery.accumulate", args=[2]).get(timeout=30) == [2]
        assert w.count("connection to broker lost") == 1, w.log()
        assert w.count("the broker connection is back") == 1, w.log()
        assert w.count("result backend: connection lost") == 1, w.log()
        assert w.count("the result backend connection is back") == 1, w.log()
    finally:
        bproxy.close()
        rproxy.close()


def test_alias_to_an_unknown_task_is_a_start_up_error(env):
    out = run(env, "--task-alias", "tasks.summarize=llm.generat")
    assert out.returncode == 1, out.stderr
    said = [l for l in out.stderr.splitlines() if "--task-alias" in l]
    assert len(said) == 1, out.stderr
    assert said[0].endswith("--task-alias 'tasks.summarize=llm.generat': 'llm.generat' is "
                            "not a built-in task (did you mean llm.generate?)"), said
    assert " ready." not in out.stderr


def test_unregistered_task_line_names_task_alias(env):
    w = env.worker()
    r = env.app.send_task("tasks.summarize", args=["x"])
    with pytest.raises(Exception):
        r.get(timeout=30)
    w.wait_for(r"Received unregistered task of type 'tasks\.summarize'\. To run it on a "
               r"built-in task, start the worker with --task-alias "
               r"tasks\.summarize=llm\.generate", timeout=10)


def test_providers_file_syntax_error_says_where(env, tmp_path):
    f = tmp_path / "providers.json"
    f.write_text('{\n  "providers": {\n    "local": {"type": "ollama",, }\n  }\n}\n')
    out = run(env, "--llm-providers", str(f))
    assert out.returncode == 1, out.stderr
    said = [l for l in out.stderr.splitlines() if "CRITICAL" in l]
    assert len(said) == 1, out.stderr
    assert re.search(r"--llm-providers file %s: bad JSON near line 3, column \d+ "
                     r"\(byte \d+\)$" % re.escape(str(f)), said[0]), said


def test_missing_api_key_is_one_warning(env):
    w = env.worker("-l", "warning", env={"OPENAI_API_KEY": ""})
    base = re.escape(env.fake.base + "/v1")
    assert w.count(r"WARNING/MainProcess\] LLM provider default \(%s\): no API key; set "
                   r"OPENAI_API_KEY \(or --llm-api-key\)" % base) == 1, w.log()
    assert w.count("no API key") == 1
    w.stop()
    w2 = env.worker("-l", "warning")
    assert w2.count("no API key") == 0, w2.log()


@pytest.mark.brokers("redis")
def test_broker_transport_options_not_json_is_one_line(env):
    out = run(env, "--broker-transport-options", '{"visibility_timeout": 10,}')
    assert out.returncode == 1, out.stderr
    said = [l for l in out.stderr.splitlines() if "transport options" in l]
    assert len(said) == 1, out.stderr
    assert said[0].endswith("broker transport options are not JSON: bad JSON at byte 26: "
                            "expected key"), said
