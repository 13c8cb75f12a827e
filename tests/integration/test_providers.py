"""Issue 18: providers behind one face -- Anthropic Messages, Ollama native and Azure
OpenAI end to end through a Celery client, named in a providers document; fallbacks
from a failing provider to a healthy one before and after the first token; tool calls
and JSON-schema answers. Every call is counted at the fake LLM."""
import json
import signal
import time

import pytest

from conftest import wait_until

FAST = ["--retry-backoff", "0.2", "--retry-backoff-factor", "2", "--retry-jitter", "false"]
KEYS = {"FAKE_ANTHROPIC_KEY": "sk-ant-fake", "FAKE_AZURE_KEY": "az-secret-key-123"}
PROGRESS = "celeriac:progress:"


def providers_doc(fake, models=None):
    return json.dumps({
        "providers": {
            "claude": {"type": "anthropic", "base_url": fake.base,
                       "api_key_env": "FAKE_ANTHROPIC_KEY", "max_tokens": 256},
            "local": {"type": "ollama", "base_url": fake.base},
            "az": {"type": "azure", "base_url": fake.base, "api_key_env": "FAKE_AZURE_KEY",
                   "api_version": "2024-10-21"},
        },
        "models": models or {},
    })


def start(env, models=None, *args):
    return env.worker(*FAST, "--llm-providers", providers_doc(env.fake, models), *args,
                      env=KEYS)


def chat(env, prompt, model, **kw):
    msgs = [{"role": "user", "content": prompt}]
    return env.app.send_task("llm.chat", args=[msgs], kwargs=dict(model=model, **kw))


def calls(env, prefix=""):
    return [e for e in env.fake.stats() if e["path"].startswith(prefix)]


def failure(result, timeout=30):
    with pytest.raises(Exception) as ei:
        result.get(timeout=timeout)
    return ei.value


# ---------------------------------------------------------------- Anthropic

@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_chat(env, stream):
    w = start(env)
    env.fake.script(["tokens=7"])
    out = chat(env, "hello claude", "claude/claude-fake", stream=stream).get(timeout=20)
    assert out["content"] == env.fake.expected_text("hello claude", 7)
    assert out["provider"] == "claude" and out["finish_reason"] == "stop"
    assert out["model"] == "claude-fake" and out["tool_calls"] is None
    assert out["usage"]["completion_tokens"] == 7 and out["usage"]["source"] == "provider"
    [c] = calls(env)
    assert c["path"] == "/v1/messages" and bool(c["stream"]) == stream
    assert c["headers"]["x-api-key"] == "sk-ant-fake"
    assert c["headers"]["anthropic-version"]
    assert "sk-ant-fake" not in w.log()


def test_anthropic_errors_classified(env):
    start(env)
    # authentication_error: permanent, one call
    env.fake.script(["status=401"])
    err = failure(chat(env, "bad key", "claude/claude-fake"))
    assert type(err).__name__ == "AuthenticationError"
    assert len(calls(env)) == 1
    # overloaded_error (529), then a good answer: retried, two calls
    env.fake.reset()
    env.fake.script(["status=529", "tokens=3"])
    out = chat(env, "busy", "claude/claude-fake").get(timeout=20)
    assert out["content"] == env.fake.expected_text("busy", 3)
    assert [c["status"] for c in calls(env)] == [529, 200]
    # an overloaded_error inside the stream after two tokens is retried too
    env.fake.reset()
    env.fake.script(["fail_after_tokens=2;tokens=6", "tokens=4"])
    out = chat(env, "cut", "claude/claude-fake").get(timeout=20)
    assert out["content"] == env.fake.expected_text("cut", 4)
    assert len(calls(env)) == 2


def test_anthropic_tool_calls(env):
    start(env)
    env.fake.script(["tool_calls=2;tokens=2"])
    tools = [{"type": "function", "function": {"name": "fn_%d" % i, "parameters": {
        "type": "object", "properties": {}}}} for i in range(2)]
    out = chat(env, "use tools", "claude/claude-fake", tools=tools).get(timeout=20)
    assert out["finish_reason"] == "tool_calls"
    assert [t["function"]["name"] for t in out["tool_calls"]] == ["fn_0", "fn_1"]
    assert json.loads(out["tool_calls"][1]["function"]["arguments"]) == {
        "i": 1, "q": "use tools"}
    assert all(t["type"] == "function" and t["id"] for t in out["tool_calls"])
    [c] = calls(env)
    assert c["path"] == "/v1/messages"


# ------------------------------------------------------------------- Ollama

@pytest.mark.parametrize("stream", [True, False])
def test_ollama_chat_and_generate(env, stream):
    start(env)
    env.fake.script(["tokens=5", "tokens=5"])
    out = chat(env, "hi llama", "local/llama3", stream=stream).get(timeout=20)
    assert out["content"] == env.fake.expected_text("hi llama", 5)
    assert out["provider"] == "local" and out["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 5
    text = env.app.send_task("llm.generate", args=["say it"],
                             kwargs={"model": "local/llama3"}).get(timeout=20)
    assert text == env.fake.expected_text("say it", 5)
    assert [c["path"] for c in calls(env)] == ["/api/chat", "/api/chat"]


def test_ollama_embed_and_missing_model(env):
    start(env)
    vec = env.app.send_task("llm.embed", args=["some text"],
                            kwargs={"model": "local/nomic"}).get(timeout=20)
    assert isinstance(vec, list) and len(vec) > 0 and isinstance(vec[0], float)
    err = failure(chat(env, "who", "local/missing-model"))
    assert "not found" in str(err).lower() or type(err).__name__ == "NotFoundError"
    assert [c["path"] for c in calls(env)] == ["/api/embed", "/api/chat"]


# -------------------------------------------------------------------- Azure

def test_azure_chat_embed_and_auth(env):
    w = start(env)
    env.fake.script(["tokens=4"])
    out = chat(env, "hi azure", "az/gpt4o-prod").get(timeout=20)
    assert out["content"] == env.fake.expected_text("hi azure", 4)
    assert out["provider"] == "az"
    vec = env.app.send_task("llm.embed", args=["x"], kwargs={"model": "az/emb-prod"}).get(
        timeout=20)
    assert isinstance(vec, list) and vec
    cs = calls(env)
    assert [c["path"] for c in cs] == ["/openai/deployments/gpt4o-prod/chat/completions",
                                       "/openai/deployments/emb-prod/embeddings"]
    assert all(c["headers"]["api-key"] == "az-secret-key-123" for c in cs)
    assert "az-secret-key-123" not in w.log()


def test_azure_without_key_fails_once(env):
    doc = json.loads(providers_doc(env.fake))
    del doc["providers"]["az"]["api_key_env"]
    env.worker(*FAST, "--llm-providers", json.dumps(doc), env=KEYS)
    err = failure(chat(env, "no key", "az/gpt4o-prod"))
    assert type(err).__name__ == "AuthenticationError"
    assert len(calls(env)) == 1


# ---------------------------------------------------------------- fallbacks

def test_fallback_before_first_token(env):
    """A retryable failure before any text moves to the next provider at once: no
    retry is scheduled, the answer says who gave it."""
    w = start(env, {"smart": ["claude/claude-fake", "local/llama3", "default/gpt-fake"]})
    env.fake.script(["status=529", "status=500", "tokens=3"])
    r = chat(env, "fall", "smart")
    out = r.get(timeout=20)
    assert out["provider"] == "default"
    assert out["content"] == env.fake.expected_text("fall", 3)
    assert [c["path"] for c in calls(env)] == ["/v1/messages", "/api/chat",
                                               "/v1/chat/completions"]
    assert calls(env)[2]["model"] == "gpt-fake"
    assert w.count("trying the next provider") == 2
    assert r.info is None or r.state == "SUCCESS"


def test_fallback_after_tokens_starts_a_new_attempt(env):
    start(env, {"claude/*": ["claude", "default/gpt-fake"]})
    env.fake.script(["fail_after_tokens=3;tokens=8", "tokens=5"])
    r = chat(env, "half", "claude/claude-fake")
    out = r.get(timeout=20)
    assert out["provider"] == "default"
    assert out["content"] == env.fake.expected_text("half", 5)
    es = [{k.decode(): v.decode() for k, v in f.items()}
          for _, f in env.redis.xrange(PROGRESS + r.id)]
    states = [(e["attempt"], e["state"]) for e in es]
    assert ("1", "RETRY") in states and ("2", "SUCCESS") in states
    first = "".join(e["text"] for e in es if e["attempt"] == "1")
    second = "".join(e["text"] for e in es if e["attempt"] == "2")
    assert first == "".join(env.fake.expected("half", 8)["tokens"][:3])
    assert second == out["content"]
    assert len(calls(env)) == 2


def test_permanent_failure_does_not_fall_back(env):
    start(env, {"smart": ["claude/claude-fake", "default/gpt-fake"]})
    env.fake.script(["status=400"])
    err = failure(chat(env, "bad", "smart"))
    assert type(err).__name__ == "BadRequestError"
    assert len(calls(env)) == 1


def test_bad_providers_document_is_refused_at_start(env):
    w = env.worker("--llm-providers", '{"providers": {"x": {"type": "nope"}}}',
                   start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=20) != 0
    assert "type must be openai, anthropic, ollama or azure" in w.log()


# ------------------------------------------------- tools and JSON answers

def test_openai_tool_calls_assembled(env):
    env.worker(*FAST)
    env.fake.script(["tool_calls=2;tool_frag_bytes=3;tokens=2"])
    tools = [{"type": "function", "function": {"name": "fn_0"}}]
    out = chat(env, "tools please", "gpt-fake", tools=tools, tool_choice="auto").get(
        timeout=20)
    assert out["finish_reason"] == "tool_calls"
    assert [json.loads(t["function"]["arguments"]) for t in out["tool_calls"]] == [
        {"i": 0, "q": "tools please"}, {"i": 1, "q": "tools please"}]
    [c] = calls(env)
    assert c["path"] == "/v1/chat/completions"


SCHEMA = {"type": "json_schema", "json_schema": {"name": "echo", "schema": {
    "type": "object", "properties": {"echo": {"type": "string"}}}}}


def test_json_schema_answer(env):
    env.worker(*FAST)
    env.fake.script(["reply=json"])
    out = chat(env, "as json", "gpt-fake", response_format=SCHEMA).get(timeout=20)
    assert json.loads(out["content"]) == {"echo": "as json"}
    # not JSON: a clear failure, one call
    env.fake.reset()
    env.fake.script(["tokens=4"])
    err = failure(chat(env, "prose", "gpt-fake", response_format=SCHEMA))
    assert type(err).__name__ == "ValueError" and "response_format" in str(err)
    assert len(calls(env)) == 1
    # unless the task asks for a retry: prose, then JSON
    env.fake.reset()
    env.fake.script(["tokens=4", "reply=json"])
    out = chat(env, "again", "gpt-fake", response_format=SCHEMA,
               retry_invalid_json=True).get(timeout=30)
    assert json.loads(out["content"]) == {"echo": "again"}
    cs = calls(env)
    assert len(cs) == 2 and "retry_invalid_json" not in json.dumps(cs[1].get("body", {}))


# -------------------------------------------------------- connection caps

def capped_doc(fake, cap):
    return json.dumps({"providers": {
        "capped": {"type": "ollama", "base_url": fake.base, "max_connections": cap}}})


def stopped_cleanly(w):
    """A warm stop exits 0 with no sanitizer report (CELERIAC_BIN may be an ASan
    build, whose leak check runs at exit)."""
    w.stop()
    assert w.proc.returncode == 0, w.log()[-2000:]
    assert "Sanitizer" not in w.log() and "runtime error" not in w.log()


def test_max_connections_caps_calls_in_flight(env):
    """max_connections=2 with 8 tasks at once: never more than 2 calls at the fake,
    the others wait their turn in the worker and all 8 succeed."""
    w = env.worker(*FAST, "-c", "8", "--llm-providers", capped_doc(env.fake, 2))
    assert w.count("LLM provider capped: at most 2 calls in flight") == 1
    env.fake.script(["latency_ms=400;tokens=3"] * 8)
    rs = [chat(env, "capped %d" % i, "capped/llama3") for i in range(8)]
    outs = [r.get(timeout=60) for r in rs]
    for i, out in enumerate(outs):
        assert out["content"] == env.fake.expected_text("capped %d" % i, 3)
        assert out["provider"] == "capped"
    cs = calls(env)
    assert len(cs) == 8 and all(c["status"] == 200 for c in cs)
    # the cap was reached, never passed
    assert env.fake.concurrency()["peak"] == 2
    stopped_cleanly(w)


def test_max_connections_waiting_call_cancelled_leaves_no_stuck_slot(env):
    """With one slot held, a call waiting for it is ended by its time limit and then
    one by a revoke: neither reaches the provider, and once the slot frees, later
    calls still run."""
    from celery.exceptions import TimeLimitExceeded, TaskRevokedError
    w = env.worker(*FAST, "-c", "4", "--llm-providers", capped_doc(env.fake, 1))
    env.fake.script(["hold=first;tokens=2", "tokens=2", "tokens=2"])
    first = chat(env, "holds the slot", "capped/llama3")
    wait_until(lambda: len(calls(env)) == 1, 20, what="the first call at the fake")
    limited = env.app.send_task("llm.chat", args=[[{"role": "user", "content": "late"}]],
                                kwargs={"model": "capped/llama3"}, time_limit=1)
    with pytest.raises(TimeLimitExceeded):
        limited.get(timeout=20)
    revoked = chat(env, "revoked while waiting", "capped/llama3")
    wait_until(lambda: w.count(r"\[%s\] received" % revoked.id), 10,
               what="the task to revoke received")
    time.sleep(0.3)  # started: its call waits for the slot
    revoked.revoke(terminate=True)
    with pytest.raises(TaskRevokedError):
        revoked.get(timeout=20)
    assert len(calls(env)) == 1  # neither waiting call was sent
    env.fake.release("first")
    assert first.get(timeout=20)["content"] == env.fake.expected_text("holds the slot", 2)
    # the slot is free again: two more, one after the other
    for p in ("after one", "after two"):
        out = chat(env, p, "capped/llama3").get(timeout=20)
        assert out["content"] == env.fake.expected_text(p, 2)
    assert [c["prompt"] for c in calls(env)] == ["holds the slot", "after one",
                                                 "after two"]
    assert env.fake.concurrency()["peak"] == 1
    stopped_cleanly(w)


def test_max_connections_cold_shutdown_with_calls_waiting(env):
    """A cold stop with calls in flight and waiting behind the cap: the worker
    ends them all and exits cleanly (no sanitizer report), the waiting ones were
    never sent, and the tasks run again on the next worker."""
    w = env.worker(*FAST, "-c", "4", "--llm-providers", capped_doc(env.fake, 1))
    env.fake.script(["hold=cold;tokens=2"])
    rs = [chat(env, "cold %d" % i, "capped/llama3") for i in range(3)]
    wait_until(lambda: len(calls(env)) == 1, 20, what="the first call at the fake")
    for r in rs:
        wait_until(lambda: w.count(r"\[%s\] received" % r.id), 10, what="all received")
    time.sleep(0.3)
    w.signal(signal.SIGTERM)
    time.sleep(0.3)
    w.signal(signal.SIGTERM)  # the second one: cold
    assert w.wait(timeout=30) == 1, w.log()[-2000:]
    assert "Cold shutdown" in w.log()
    assert "Sanitizer" not in w.log() and "runtime error" not in w.log()
    assert len(calls(env)) == 1
    env.fake.release("cold")
    wait_until(lambda: env.fake.concurrency()["inflight"] == 0, 10, what="held call done")
    env.fake.reset()
    env.fake.script(["tokens=2"] * 3)
    env.worker(*FAST, "-c", "4", "--llm-providers", capped_doc(env.fake, 1))
    for i, r in enumerate(rs):
        assert r.get(timeout=30)["content"] == env.fake.expected_text("cold %d" % i, 2)
    assert len(calls(env)) == 3 and env.fake.concurrency()["peak"] == 1
