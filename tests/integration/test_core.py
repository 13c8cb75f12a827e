"""Issue 2: the core worker, end to end with a real Python Celery client."""
import json
import os
import signal
import subprocess
import time
import uuid

import pytest

from conftest import BIN, wait_until


@pytest.mark.brokers("amqp", "redis", "sqs")
def test_send_task_generate(env):
    env.worker("-c", "10")
    r = env.app.send_task("llm.generate", args=["Explain quantum computing"])
    assert r.get(timeout=20) == env.fake.expected_text("Explain quantum computing")
    meta = env.meta(r.id)
    assert meta["status"] == "SUCCESS" and meta["task_id"] == r.id
    # Celery's exact key set and a TTL of result_expires (default one day)
    assert set(meta) == {"status", "result", "traceback", "children", "date_done", "task_id"}
    assert meta["date_done"].endswith("+00:00")
    ttl = env.redis.ttl("celery-task-meta-" + r.id)
    assert 86000 < ttl <= 86400


@pytest.mark.brokers("amqp", "redis")
def test_delay_on_stub_task(env):
    env.worker()

    @env.app.task(name="llm.generate")
    def generate(prompt, model=None, system=None, template=None, **params):
        raise AssertionError("runs on celeriac, never here")

    r = generate.delay("Write a haiku", max_tokens=8)
    assert r.get(timeout=20) == env.fake.expected_text("Write a haiku")
    body = env.fake.stats()[-1]["body"]
    assert body["max_tokens"] == 8 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Write a haiku"}]


def test_generate_options(env):
    env.worker("--llm-model", "default-model")
    r = env.app.send_task("llm.generate", args=[["first", "second"]],
                          kwargs={"system": "be brief", "template": "Q: {input}\nA:",
                                  "model": "m1", "temperature": 0.5, "stop": ["\n"]})
    r.get(timeout=20)
    body = env.fake.stats()[-1]["body"]
    assert body["model"] == "m1"
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "Q: first\nsecond\nA:"}]
    assert body["temperature"] == 0.5 and body["stop"] == ["\n"]
    r = env.app.send_task("llm.generate", args=["x"])
    r.get(timeout=20)
    assert env.fake.stats()[-1]["body"]["model"] == "default-model"


@pytest.mark.brokers("amqp", "redis")
def test_chat_and_embed(env):
    env.worker()
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello there"}]
    out = env.app.send_task("llm.chat", args=[msgs], kwargs={"model": "chat-m"}).get(timeout=20)
    assert out["content"] == env.fake.expected_text("hello there")
    assert out["model"] == "chat-m" and out["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 16
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 16
    one = env.app.send_task("llm.embed", args=["abc"]).get(timeout=20)
    assert isinstance(one, list) and all(isinstance(x, float) for x in one)
    many = env.app.send_task("llm.embed", args=[["abc", "def"]]).get(timeout=20)
    assert len(many) == 2 and many[0] == one
    assert env.fake.stats()[-1]["path"] == "/v1/embeddings"


@pytest.mark.brokers("amqp", "redis")
def test_accumulate_and_alias(env):
    env.worker("--task-alias", "tasks.process_llm_request=llm.generate")
    assert env.app.send_task("celery.accumulate", args=[1, 2, 3]).get(timeout=20) == [1, 2, 3]
    assert env.app.send_task("celery.accumulate", args=[1, 2, 3], kwargs={"index": 1}).get(timeout=20) == 2
    r = env.app.send_task("tasks.process_llm_request", args=["aliased"])
    assert r.get(timeout=20) == env.fake.expected_text("aliased")


@pytest.mark.brokers("amqp", "redis", "sqs")
def test_unknown_task_and_bad_arguments(env):
    from celery.exceptions import NotRegistered
    w = env.worker()
    r = env.app.send_task("no.such.task", args=[1])
    with pytest.raises(NotRegistered):
        r.get(timeout=20)
    r = env.app.send_task("llm.generate", args=[], kwargs={})
    with pytest.raises(TypeError) as ei:
        r.get(timeout=20)
    assert "missing 1 required positional argument: 'prompt'" in str(ei.value)
    r = env.app.send_task("llm.chat", args=["not a list"])
    with pytest.raises(TypeError):
        r.get(timeout=20)
    assert w.count("Received unregistered task of type 'no.such.task'") == 1
    # the worker keeps serving
    assert env.app.send_task("celery.accumulate", args=[5]).get(timeout=20) == [5]


@pytest.mark.brokers("amqp", "redis")
def test_protocol_v1_message(env):
    env.worker()
    app1 = env.make_app(task_protocol=1)
    r = app1.send_task("llm.generate", args=["v1 prompt"])
    assert r.get(timeout=20) == env.fake.expected_text("v1 prompt")


@pytest.mark.brokers("amqp", "redis", "sqs")
def test_result_extended_track_started_ignore_result(env):
    env.worker("--result-extended", "--track-started")
    env.fake.script(["latency_ms=700;tps=20;tokens=20"])
    states, progress = [], []
    r = env.app.send_task("llm.generate", args=["ext"], queue="celery")

    def seen(m):
        states.append(m["status"])
        if m["status"] == "PROGRESS":
            progress.append(m)

    r.get(timeout=20, on_message=seen)
    assert "STARTED" in states and states[-1] == "SUCCESS"
    # the PROGRESS metas of the running call carry the extended fields too
    assert progress, states
    assert all(m["name"] == "llm.generate" and m["args"] == ["ext"] and m["kwargs"] == {}
               and m["queue"] == "celery" for m in progress), progress[-1]
    meta = env.meta(r.id)
    assert meta["name"] == "llm.generate" and meta["args"] == ["ext"] and meta["kwargs"] == {}
    assert meta["worker"].startswith("celeriac-") and meta["retries"] == 0
    assert meta["queue"] == "celery"
    r = env.app.send_task("llm.generate", args=["ignored"], ignore_result=True)
    wait_until(lambda: len(env.fake.stats()) == 2, what="ignored task to run")
    time.sleep(0.5)
    assert env.meta(r.id) is None


def test_queues_option_and_priority_queue(env):
    # -Q with two queues; one of them declared by the app with x-max-priority
    from kombu import Queue
    env.app.conf.task_queues = [Queue("hipri", queue_arguments={"x-max-priority": 10})]
    with env.app.connection_for_write() as conn:
        Queue("hipri", queue_arguments={"x-max-priority": 10})(conn.default_channel).declare()
    env.worker("-Q", "lopri,hipri")
    a = env.app.send_task("llm.generate", args=["lo"], queue="lopri")
    b = env.app.send_task("llm.generate", args=["hi"], queue="hipri", priority=9)
    assert a.get(timeout=20) and b.get(timeout=20)


def test_redelivered_success_is_not_run_again(env):
    def stored(tid, text):
        env.redis.set("celery-task-meta-" + tid, json.dumps(
            {"status": "SUCCESS", "result": text, "traceback": None, "children": [],
             "date_done": "2026-01-01T00:00:00+00:00", "task_id": tid}))

    # a real redelivery: taken by a consumer that went away without acking
    tid = str(uuid.uuid4())
    stored(tid, "stored before")
    r = env.app.send_task("llm.generate", args=["must not run"], task_id=tid)
    with env.app.connection_for_write() as conn:
        m = conn.default_channel.basic_get("celery", no_ack=False)
        assert m is not None and not m.delivery_info["redelivered"]
    w = env.worker()
    assert r.get(timeout=20) == "stored before"
    w.wait_for("already has SUCCESS stored", 10)
    assert env.fake.stats() == []
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 10)
    # a fresh publish of the same id runs, as with Celery, and SUCCESS stays
    tid2 = str(uuid.uuid4())
    stored(tid2, "first answer")
    r2 = env.app.send_task("llm.generate", args=["runs again"], task_id=tid2)
    wait_until(lambda: len(env.fake.stats()) == 1, 20, what="the second call")
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 10)
    assert r2.get(timeout=20) == "first answer"


def test_results_survive_a_script_cache_flush(env):
    # results and progress go by EVALSHA; after SCRIPT FLUSH Redis answers
    # NOSCRIPT and the worker must send the script itself
    env.worker()
    r = env.app.send_task("llm.generate", args=["before flush"])
    assert r.get(timeout=20) == env.fake.expected_text("before flush")
    assert env.redis.script_exists("0" * 40) == [False]
    env.redis.script_flush()
    r = env.app.send_task("llm.generate", args=["after flush"])
    assert r.get(timeout=20) == env.fake.expected_text("after flush")
    states = [f[b"state"] for _, f in env.redis.xrange("celeriac:progress:" + r.id)]
    assert states[0] == b"STARTED" and states[-1] == b"SUCCESS"
    # and accumulate, which has no progress stream at all
    r = env.app.send_task("celery.accumulate", args=[1, 2])
    assert r.get(timeout=20) == [1, 2]
    assert not env.redis.exists("celeriac:progress:" + r.id)


def two_bursts(env, n, tag):
    """Runs two bursts of n side-by-side LLM calls of 400 ms, one after the
    other; returns the connection of every call the fake has seen so far."""
    for burst in range(2):
        env.fake.script(["latency_ms=400"] * n)
        rs = [env.app.send_task("llm.generate", args=["%s%d-%d" % (tag, burst, i)])
              for i in range(n)]
        assert all(r.get(timeout=30) for r in rs)
    return [s["conn"] for s in env.fake.stats()]


def test_llm_connections_are_reused(env):
    # one connection for calls one after another, and a second burst as wide
    # as the first rides on the first one's connections (the worker skips
    # libcurl's search for an idle connection only when none can exist)
    env.worker("-c", "50")
    for i in range(10):
        assert env.app.send_task("llm.generate", args=["seq%d" % i]).get(timeout=20)
    seq_conns = {s["conn"] for s in env.fake.stats()}
    assert len(seq_conns) == 1, seq_conns
    conns = two_bursts(env, 40, "b")
    assert len(conns) == 90
    assert len(set(conns[10:50])) >= 30          # the first burst ran side by side
    assert len(set(conns[50:]) - set(conns[:50])) <= 5, "second burst reconnected"


def test_llm_connections_kept_are_bounded(env):
    # past --llm-keep-connections calls in flight, a call that needs a new
    # connection closes it when done: only the first ones serve the next burst
    env.worker("-c", "50", "--llm-keep-connections", "4")
    conns = two_bursts(env, 12, "k")
    assert len(conns) == 24
    first, second = set(conns[:12]), set(conns[12:])
    assert len(first) == 12 and len(second) == 12
    assert len(first & second) == 4, "kept %d connections, not 4" % len(first & second)


def test_long_prompts_arrive_whole(env):
    # the client frees its copy of a request body once the response has come:
    # a body sent with the headers (< 64 KB), one uploaded after them, and one
    # sent after "100-continue" (> 1 MB) must each arrive whole
    env.worker("-c", "4")
    prompts = ["%d:" % n + "abcdefghij" * (n // 10) for n in (10 << 10, 100 << 10, 1200 << 10)]
    rs = [env.app.send_task("llm.generate", args=[p]) for p in prompts]
    got = [r.get(timeout=60) for r in rs]
    seen = {s["prompt"]: s["text"] for s in env.fake.stats()}
    for p, text in zip(prompts, got):
        assert p in seen, "a prompt of %d bytes did not arrive whole" % len(p)
        assert text == seen[p]


@pytest.mark.brokers("amqp", "redis")
def test_thousand_concurrent_tasks(env):
    env.worker("-c", "1000", "--loglevel", "warning")
    env.fake.script(["latency_ms=1000;tokens=4"] * 1000)
    t0 = time.time()
    results = [env.app.send_task("llm.generate", args=["p%d" % i]) for i in range(1000)]
    got = [r.get(timeout=120) for r in results]
    elapsed = time.time() - t0
    for i in range(0, 1000, 97):
        assert got[i] == env.fake.expected_text("p%d" % i, tokens=4)
    assert all(got)
    assert len(env.fake.stats()) == 1000
    print("1000 tasks at -c 1000 with 1 s latency: %.2fs" % elapsed)


def test_kill9_loses_nothing_and_pays_once(env):
    n = 200
    w = env.worker("-c", "40", "--loglevel", "warning")
    env.fake.script(["latency_ms=300;tokens=4"] * (n * 2))
    results = [env.app.send_task("llm.generate", args=["kill-%d" % i]) for i in range(n)]
    wait_until(lambda: sum(1 for r in results if env.meta(r.id)) >= n // 4, 60,
               what="a quarter of the results")
    w.proc.kill()
    w.wait()
    done_before = {r.id for r in results if env.meta(r.id)}
    assert 0 < len(done_before) < n
    env.worker("-c", "40", "--loglevel", "warning")
    for i, r in enumerate(results):
        assert r.get(timeout=120) == env.fake.expected_text("kill-%d" % i, tokens=4)
    metas = {r.id: env.meta(r.id) for r in results}
    assert all(m and m["status"] == "SUCCESS" for m in metas.values())
    calls = {}
    for e in env.fake.stats():
        calls[e["prompt"]] = calls.get(e["prompt"], 0) + 1
    prompts = {r.id: "kill-%d" % i for i, r in enumerate(results)}
    for tid in done_before:
        assert calls[prompts[tid]] == 1, "task %s called again after its result was stored" % tid
    assert all(calls.get(p, 0) >= 1 for p in prompts.values())
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30)


@pytest.mark.brokers("amqp", "redis")
def test_warm_shutdown_finishes_in_flight(env):
    w = env.worker("-c", "20")
    env.fake.script(["latency_ms=1500;tokens=4"] * 20)
    results = [env.app.send_task("llm.generate", args=["warm-%d" % i]) for i in range(20)]
    wait_until(lambda: len(env.fake.stats()) == 20, 20, what="20 calls in flight")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    assert "Warm shutdown" in w.log()
    for r in results:
        assert env.meta(r.id)["status"] == "SUCCESS"
    assert env.services.queue_depth(env.vhost, "celery") == 0


@pytest.mark.brokers("amqp", "redis")
def test_cold_shutdown_requeues_unacked(env):
    w = env.worker("-c", "5")
    env.fake.script(["latency_ms=5000;tokens=4"] * 5 + ["tokens=4"] * 10)
    results = [env.app.send_task("llm.generate", args=["cold-%d" % i]) for i in range(10)]
    wait_until(lambda: len(env.fake.stats()) == 5, 20, what="5 calls in flight")
    w.signal(signal.SIGTERM)
    time.sleep(0.3)
    w.signal(signal.SIGTERM)
    assert w.wait(10) == 1
    assert "Cold shutdown" in w.log()
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 10, 20)
    env.worker("-c", "10")
    for r in results:
        r.get(timeout=30)


def test_command_line_errors():
    out = subprocess.run([BIN, "worker", "--no-such-option"], capture_output=True, text=True)
    assert out.returncode != 0 and "no-such-option" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run([BIN, "worker", "-c", "zero"], capture_output=True, text=True)
    assert out.returncode != 0 and "--concurrency" in out.stderr
    out = subprocess.run([BIN, "worker", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for opt in ("--broker", "--result-backend", "--queues", "--concurrency", "--hostname",
                "--loglevel", "--prefetch-multiplier", "--task-alias", "--acks-early",
                "CELERY_BROKER_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        assert opt in out.stdout


def test_unreachable_broker_is_one_clear_line(services):
    from conftest import free_port
    port = free_port()
    e = dict(os.environ, OPENAI_API_KEY="sk-very-secret")
    out = subprocess.run([BIN, "worker", "-b", "amqp://user:hunter2@127.0.0.1:%d//" % port,
                          "--result-backend", services.redis_url(0),
                          "--broker-connection-retry-on-startup", "false"],
                         capture_output=True, text=True, env=e, timeout=60)
    assert out.returncode != 0
    assert "cannot connect to broker" in out.stderr
    assert "hunter2" not in out.stderr and "sk-very-secret" not in out.stderr


def test_heartbeats_keep_idle_worker_connected(env):
    w = env.worker("--heartbeat", "1")
    time.sleep(4)
    assert env.app.send_task("celery.accumulate", args=[1]).get(timeout=20) == [1]
    assert "connection to broker lost" not in w.log()


def test_readme_lists_every_option():
    import os
    from conftest import ROOT
    out = subprocess.run([BIN, "worker", "--help"], capture_output=True, text=True).stdout
    readme = open(os.path.join(ROOT, "README.md")).read()
    import re
    opts = re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", out, re.M)
    assert len(opts) > 30
    missing = [o for o in opts if o != "--help" and "`" + o not in readme and ", " + o not in readme]
    assert not missing, "README lacks %s (run scripts/readme-options.py)" % missing
