"""Issue 5: progress written by the worker (Redis Stream per task, PROGRESS meta)."""
import time

import pytest

from conftest import wait_until

KEY = "celeriac:progress:"


def entries(env, task_id):
    out = []
    for eid, f in env.redis.xrange(KEY + task_id):
        e = {k.decode(): v.decode() for k, v in f.items()}
        e["id"] = eid.decode()
        out.append(e)
    return out


def attempt_text(es, attempt):
    return "".join(e["text"] for e in es if int(e["attempt"]) == attempt)


@pytest.mark.brokers("amqp", "redis")
def test_stream_entries_are_batched_and_complete(env):
    env.worker("--progress-interval", "100")
    env.fake.script(["tps=80;tokens=60"])
    r = env.app.send_task("llm.generate", args=["stream me"])
    # PROGRESS shows up in the backend while the task runs, for plain Celery
    info = wait_until(lambda: r.state == "PROGRESS" and r.info, timeout=20,
                      what="PROGRESS state")
    assert set(info) == {"text", "tokens"} and info["tokens"] > 0
    assert env.fake.expected_text("stream me", 60).startswith(info["text"])
    out = r.get(timeout=30)
    assert out == env.fake.expected_text("stream me", 60)
    es = entries(env, r.id)
    assert [int(e["seq"]) for e in es] == list(range(1, len(es) + 1))
    assert [e["id"] for e in es] == ["0-%d" % i for i in range(1, len(es) + 1)]
    assert es[0]["state"] == "STARTED" and es[0]["text"] == ""
    assert es[-1]["state"] == "SUCCESS" and int(es[-1]["tokens"]) == 60
    assert all(e["state"] == "PROGRESS" for e in es[1:-1])
    assert all(e["attempt"] == "1" for e in es)
    assert attempt_text(es, 1) == out
    # batched: far fewer entries than tokens, but more than one while streaming
    assert 3 <= len(es) - 2 < 60
    print("\n60 tokens at 80/s with --progress-interval 100: %d PROGRESS entries"
          % (len(es) - 2))
    tokens = [int(e["tokens"]) for e in es[1:-1]]
    assert tokens == sorted(tokens) and tokens[-1] == 60
    ttl = env.redis.ttl(KEY + r.id)
    assert 86000 < ttl <= 86400
    assert env.meta(r.id)["status"] == "SUCCESS"


def test_on_message_sees_progress_states(env):
    env.worker()
    env.fake.script(["tps=40;tokens=40"])
    seen = []
    r = env.app.send_task("llm.generate", args=["watch"])
    r.get(timeout=30, on_message=lambda m: seen.append((m["status"], m["result"])))
    progress = [res for st, res in seen if st == "PROGRESS"]
    assert progress, seen
    texts = [p["text"] for p in progress]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert seen[-1][0] == "SUCCESS"


@pytest.mark.brokers("amqp", "redis")
def test_retry_starts_a_new_attempt(env):
    env.worker("--retry-backoff", "0.2", "--retry-jitter", "0")
    env.fake.script(["tps=200;tokens=30;cut_after_tokens=7", "tps=200;tokens=30"])
    r = env.app.send_task("llm.generate", args=["again"])
    out = r.get(timeout=30)
    es = entries(env, r.id)
    states = [(e["attempt"], e["state"]) for e in es]
    assert states[0] == ("1", "STARTED")
    assert ("1", "RETRY") in states and ("2", "STARTED") in states
    assert states.index(("1", "RETRY")) < states.index(("2", "STARTED"))
    assert states[-1] == ("2", "SUCCESS")
    retry = [e for e in es if e["state"] == "RETRY"][0]
    assert retry["error"]
    # the failed attempt's text is a prefix of the answer, and never mixed in
    assert out.startswith(attempt_text(es, 1)) and len(attempt_text(es, 1)) < len(out)
    assert attempt_text(es, 2) == out
    assert [int(e["seq"]) for e in es] == list(range(1, len(es) + 1))


def test_attempts_without_text_still_open_and_close(env):
    # the stream's state is made at the first token; an attempt that fails
    # before one still gets its STARTED and RETRY, under the right attempt
    env.worker("--retry-backoff", "0.2", "--retry-jitter", "0")
    env.fake.script(["status=503", "tps=200;tokens=5"])
    r = env.app.send_task("llm.generate", args=["no text first"])
    assert r.get(timeout=30) == env.fake.expected_text("no text first", 5)
    es = entries(env, r.id)
    states = [(e["attempt"], e["state"]) for e in es]
    assert states[:3] == [("1", "STARTED"), ("1", "RETRY"), ("2", "STARTED")], states
    assert states[-1] == ("2", "SUCCESS") and attempt_text(es, 2) == r.result
    assert [int(e["seq"]) for e in es] == list(range(1, len(es) + 1))


@pytest.mark.brokers("amqp", "redis")
def test_failure_ends_the_stream_with_its_error(env):
    env.worker("--max-retries", "0")
    env.fake.script(["tps=200;tokens=30;status=400"])
    r = env.app.send_task("llm.generate", args=["bad"])
    wait_until(lambda: r.state == "FAILURE", timeout=20, what="FAILURE")
    es = entries(env, r.id)
    assert es[0]["state"] == "STARTED" and es[-1]["state"] == "FAILURE"
    assert es[-1]["error"]


def test_meta_mode_has_no_stream_and_off_has_nothing(env):
    env.worker("--progress", "meta")
    env.fake.script(["tps=40;tokens=40"])
    seen = []
    r = env.app.send_task("llm.generate", args=["meta only"])
    r.get(timeout=30, on_message=lambda m: seen.append(m["status"]))
    assert "PROGRESS" in seen
    assert env.redis.exists(KEY + r.id) == 0
    for w in env.workers:
        w.stop()
    env.worker("--progress", "off")
    env.fake.script(["tps=40;tokens=40"])
    seen = []
    r = env.app.send_task("llm.generate", args=["silent"])
    r.get(timeout=30, on_message=lambda m: seen.append(m["status"]))
    assert "PROGRESS" not in seen
    assert env.redis.exists(KEY + r.id) == 0


def test_ignore_result_puts_the_result_in_the_stream(env):
    env.worker()
    r = env.app.send_task("llm.generate", args=["ignored"], ignore_result=True)
    wait_until(lambda: entries(env, r.id) and entries(env, r.id)[-1]["state"] == "SUCCESS",
               timeout=20, what="final entry")
    time.sleep(0.2)
    assert env.meta(r.id) is None
    import json
    assert json.loads(entries(env, r.id)[-1]["result"]) == env.fake.expected_text("ignored")


def test_redis_refusing_writes_loses_no_text(env):
    # Redis says no for a while (here OOM; READONLY and LOADING go the same
    # way): the refused writes are sent again in order once it says yes, and
    # a write made meanwhile waits behind them rather than overtaking them
    # (the stream would then drop the older ones as already written).
    w = env.worker("--progress-interval", "100", "--loglevel", "warning")
    env.fake.script(["tps=10;tokens=50"] * 3)
    rs = [env.app.send_task("llm.generate", args=["refused %d" % i]) for i in range(3)]
    wait_until(lambda: all(len(entries(env, r.id)) >= 3 for r in rs), 20,
               what="some progress written")
    env.redis.config_set("maxmemory", "1")
    try:
        wait_until(lambda: "will retry" in w.log(), 20, what="a refused write")
        time.sleep(1.6)
    finally:
        env.redis.config_set("maxmemory", "0")
    for i, r in enumerate(rs):
        want = env.fake.expected_text("refused %d" % i, 50)
        assert r.get(timeout=30) == want
        # the stream's last write may still be on its way behind the result
        es = wait_until(lambda: (lambda es: es if es[-1]["state"] == "SUCCESS" else None)(
            entries(env, r.id)), 10, what="the stream's SUCCESS entry")
        assert [int(e["seq"]) for e in es] == list(range(1, len(es) + 1))
        assert attempt_text(es, 1) == want
