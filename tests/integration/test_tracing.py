"""Issue 35: OpenTelemetry traces. A producer instrumented with
opentelemetry-instrumentation-celery injects the W3C context into the task
message's headers; celeriac continues that trace with a run/<task> CONSUMER
span, a CLIENT span per LLM call (GenAI conventions) whose context goes to the
provider in `traceparent`, and the context in every follow-up it publishes.
Spans reach a small OTLP/HTTP receiver (otlp_receiver.py)."""
import re
import urllib.request
import uuid

import pytest
from celery import chain
from celery.signals import before_task_publish

from conftest import free_port, wait_until
from otlp_receiver import Receiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Producer:
    """What the instrumentation does in its before_task_publish handler:
    opentelemetry.propagate.inject(headers) on the signal's `headers`, the
    message's own header table (protocol 2). The W3C propagator sets
    "traceparent" = f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}" and
    "tracestate" = its header form when not empty, as top-level keys."""

    def __init__(self, traceparent, tracestate=None):
        self.tp, self.ts = traceparent, tracestate

    def __call__(self, sender=None, headers=None, **kw):
        if headers:
            headers["traceparent"] = self.tp
            if self.ts:
                headers["tracestate"] = self.ts

    def __enter__(self):
        before_task_publish.connect(self, weak=False)
        return self

    def __exit__(self, *a):
        before_task_publish.disconnect(self)


@pytest.fixture
def rx():
    r = Receiver()
    yield r
    r.close()


def otel_env(rx, **more):
    e = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url, "OTEL_SERVICE_NAME": "llm-workers",
         "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"}
    e.update(more)
    return e


def spans_of(rx, trace):
    return [s for s in rx.spans if s["traceId"] == trace]


@pytest.mark.brokers("amqp", "redis")
@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_task_continues_the_producers_trace(env, rx, protocol):
    env.worker(env=otel_env(rx, OTEL_EXPORTER_OTLP_PROTOCOL=protocol))
    tid = str(uuid.uuid4())
    with Producer("00-%s-%s-01" % (TRACE, PARENT), "vendor=abc,other=1"):
        r = env.app.send_task("llm.generate", args=["Explain tracing"], task_id=tid)
    assert r.get(timeout=20) == env.fake.expected_text("Explain tracing")
    wait_until(lambda: len(spans_of(rx, TRACE)) >= 2, timeout=10, what="two spans")
    [run] = rx.named("run/llm.generate")
    assert run["traceId"] == TRACE and run["parentSpanId"] == PARENT
    assert run["kind"] == 5 and run["traceState"] == "vendor=abc,other=1"
    a = run["attributes"]
    assert a["celery.action"] == "run" and a["celery.task_name"] == "llm.generate"
    assert a["messaging.message.id"] == tid and a["celery.state"] == "SUCCESS"
    assert run["end"] >= run["start"] > 0
    [call] = [s for s in spans_of(rx, TRACE) if s["kind"] == 3]
    assert call["parentSpanId"] == run["spanId"] and call["traceId"] == TRACE
    ca = call["attributes"]
    assert call["name"] == "chat " + ca["gen_ai.request.model"]
    assert ca["gen_ai.operation.name"] == "chat" and ca["gen_ai.provider.name"] == "openai"
    assert ca["gen_ai.usage.output_tokens"] == 16 and ca["gen_ai.usage.input_tokens"] > 0
    assert ca["gen_ai.response.finish_reasons"] == ["stop"]
    assert run["start"] <= call["start"] <= call["end"] <= run["end"]
    # the provider's request carried the CLIENT span's context
    hdrs = env.fake.stats()[-1]["headers"]
    assert hdrs["traceparent"] == "00-%s-%s-01" % (TRACE, call["spanId"])
    assert hdrs["tracestate"] == "vendor=abc,other=1"
    assert rx.resource["service.name"] == "llm-workers"
    assert rx.resource["deployment.environment"] == "test"
    path, ctype, _ = rx.requests[0]
    assert path == "/v1/traces"
    assert ctype == ("application/json" if protocol == "http/json"
                     else "application/x-protobuf")


def test_token_counts_match_the_result(env, rx):
    env.worker(env=otel_env(rx))
    msgs = [{"role": "user", "content": "hello there"}]
    with Producer("00-%s-%s-01" % (TRACE, PARENT)):
        out = env.app.send_task("llm.chat", args=[msgs], kwargs={"model": "chat-m"}) \
            .get(timeout=20)
    wait_until(lambda: any(s["kind"] == 3 for s in spans_of(rx, TRACE)), timeout=10,
               what="the CLIENT span")
    [call] = [s for s in spans_of(rx, TRACE) if s["kind"] == 3]
    assert call["name"] == "chat chat-m"
    ca = call["attributes"]
    assert ca["gen_ai.usage.input_tokens"] == out["usage"]["prompt_tokens"]
    assert ca["gen_ai.usage.output_tokens"] == out["usage"]["completion_tokens"]
    assert ca["gen_ai.response.model"] == out["model"]


def test_a_task_without_context_starts_a_trace(env, rx):
    env.worker(env=otel_env(rx))
    env.app.send_task("llm.generate", args=["root"]).get(timeout=20)
    wait_until(lambda: len(rx.named("run/llm.generate")) == 1, timeout=10, what="run span")
    [run] = rx.named("run/llm.generate")
    assert "parentSpanId" not in run or not run["parentSpanId"]
    tp = env.fake.stats()[-1]["headers"]["traceparent"]
    assert re.fullmatch(r"00-%s-[0-9a-f]{16}-01" % run["traceId"], tp)


def test_malformed_context_is_ignored(env, rx):
    env.worker(env=otel_env(rx))
    with Producer("00-%s-%s-01" % (TRACE.upper(), PARENT)):
        r = env.app.send_task("llm.generate", args=["bad ctx"])
    assert r.get(timeout=20)
    wait_until(lambda: len(rx.named("run/llm.generate")) == 1, timeout=10, what="run span")
    [run] = rx.named("run/llm.generate")
    assert run["traceId"] != TRACE.lower() and not run.get("parentSpanId")


def test_failed_attempt_then_retry_keep_the_trace(env, rx):
    env.worker(env=otel_env(rx))
    env.fake.script(["status=503", "tokens=4"])
    with Producer("00-%s-%s-01" % (TRACE, PARENT)):
        r = env.app.send_task("llm.generate", args=["flaky"])
    r.get(timeout=60)
    wait_until(lambda: len([s for s in spans_of(rx, TRACE) if s["kind"] == 3]) >= 2,
               timeout=15, what="two CLIENT spans")
    calls = sorted((s for s in spans_of(rx, TRACE) if s["kind"] == 3),
                   key=lambda s: s["start"])
    assert calls[0]["status"]["code"] == 2
    assert calls[0]["attributes"]["error.type"]
    assert calls[-1]["status"]["code"] == 0
    assert len({c["spanId"] for c in calls}) == len(calls)


def test_chain_keeps_one_trace(env, rx):
    env.worker(env=otel_env(rx))
    app = env.app

    def acc(*a):
        return app.signature("celery.accumulate", args=a)

    with Producer("00-%s-%s-01" % (TRACE, PARENT)):
        res = chain(acc(1), acc(2), acc(3))()
    res.get(timeout=30)
    wait_until(lambda: len(rx.named("run/celery.accumulate")) == 3, timeout=10,
               what="three run spans")
    runs = sorted(rx.named("run/celery.accumulate"), key=lambda s: s["start"])
    assert all(s["traceId"] == TRACE for s in runs)
    assert runs[0]["parentSpanId"] == PARENT
    assert runs[1]["parentSpanId"] == runs[0]["spanId"]
    assert runs[2]["parentSpanId"] == runs[1]["spanId"]


def test_sampler_always_off_exports_nothing(env, rx):
    w = env.worker(env=otel_env(rx, OTEL_TRACES_SAMPLER="always_off"))
    with Producer("00-%s-%s-01" % (TRACE, PARENT)):
        env.app.send_task("llm.generate", args=["quiet"]).get(timeout=20)
    env.app.send_task("llm.generate", args=["quiet 2"]).get(timeout=20)
    import time
    time.sleep(2.5)  # two export periods
    assert rx.spans == [] and rx.requests == []
    assert "traceparent" not in env.fake.stats()[-1]["headers"]
    assert "tracing: spans go to" in w.log()


def test_nothing_set_means_no_tracing(env):
    w = env.worker()
    env.app.send_task("llm.generate", args=["plain"]).get(timeout=20)
    assert "traceparent" not in env.fake.stats()[-1]["headers"]
    assert "tracing:" not in w.log()


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^%s (\S+)$" % name, text, re.M)
    return float(m.group(1)) if m else None


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def run_batch(env, n, tag):
    rs = [env.app.send_task("llm.generate", args=["%s%d" % (tag, i)],
                            kwargs={"max_tokens": 2}) for i in range(n)]
    for r in rs:
        r.get(timeout=60)
    return rs


def test_collector_down_drops_and_counts(env):
    port = free_port()
    dead = free_port()  # nothing listens there
    w = env.worker("--metrics-port", str(port), "-c", "20",
                   env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:%d" % dead})
    rs = run_batch(env, 50, "warm")
    before = rss_kb(w.proc.pid)
    rs += run_batch(env, 450, "t")  # issue 35: 500 tasks with the collector down
    assert all(env.meta(r.id)["status"] == "SUCCESS" for r in rs)
    # bounded: the spans of a dead collector do not pile up
    assert rss_kb(w.proc.pid) - before < 20 * 1024
    wait_until(lambda: metric(port, "celeriac_otel_spans_dropped_total") == 1000, timeout=30,
               what="every span counted as dropped")
    assert metric(port, "celeriac_otel_spans_exported_total") == 0


def test_json_log_lines_carry_the_trace(env, rx):
    import json
    w = env.worker("--log-format", "json", start=False, env=otel_env(rx))
    w.start(wait_ready=False)
    w.wait_for(r' ready\.",')
    tid = str(uuid.uuid4())
    with Producer("00-%s-%s-01" % (TRACE, PARENT)):
        env.app.send_task("llm.generate", args=["logged"], task_id=tid).get(timeout=20)
    w.wait_for(r'succeeded in', timeout=10)
    wait_until(lambda: len(rx.named("run/llm.generate")) == 1, timeout=10, what="run span")
    [run] = rx.named("run/llm.generate")
    lines = [json.loads(x) for x in w.log().split("\n") if x]
    [done] = [o for o in lines if o.get("task_id") == tid and "succeeded in" in o["message"]]
    assert done["trace_id"] == TRACE and done["span_id"] == run["spanId"]


def test_warm_shutdown_sends_the_last_spans(env, rx):
    import signal
    w = env.worker(env=otel_env(rx))
    env.app.send_task("llm.generate", args=["last one"]).get(timeout=20)
    w.signal(signal.SIGTERM)  # well within the one-second batch period
    assert w.wait(timeout=30) == 0
    assert len(rx.named("run/llm.generate")) == 1


def test_fallback_is_a_span_per_provider(env, rx):
    from test_providers import KEYS, providers_doc
    e = dict(KEYS)
    e.update(otel_env(rx))
    env.worker("--llm-providers",
               providers_doc(env.fake, {"smart": ["claude/claude-fake", "local/llama3",
                                                  "default/gpt-fake"]}), env=e)
    env.fake.script(["status=529", "status=500", "tokens=3"])
    msgs = [{"role": "user", "content": "fall"}]
    with Producer("00-%s-%s-01" % (TRACE, PARENT)):
        out = env.app.send_task("llm.chat", args=[msgs], kwargs={"model": "smart"}) \
            .get(timeout=20)
    assert out["provider"] == "default"
    wait_until(lambda: len([s for s in spans_of(rx, TRACE) if s["kind"] == 3]) == 3,
               timeout=10, what="three CLIENT spans")
    [run] = rx.named("run/llm.chat")
    calls = sorted((s for s in spans_of(rx, TRACE) if s["kind"] == 3), key=lambda s: s["start"])
    assert all(c["parentSpanId"] == run["spanId"] for c in calls)
    assert [c["attributes"]["gen_ai.provider.name"] for c in calls] == \
        ["anthropic", "ollama", "openai"]
    assert [c["status"]["code"] for c in calls] == [2, 2, 0]
    assert [c["attributes"].get("celeriac.llm.route_step", 0) for c in calls] == [0, 1, 2]
    # each provider saw its own span's context
    seen = [r["headers"].get("traceparent") for r in env.fake.stats()]
    assert seen == ["00-%s-%s-01" % (TRACE, c["spanId"]) for c in calls]


def test_gateway_submit_passes_the_callers_context(env, rx):
    from test_gateway import Gateway
    env.worker(env=otel_env(rx))
    g = Gateway(env)
    try:
        st, out = g.json("POST", "/v1/tasks", {"task": "llm.generate", "args": ["via gw"]},
                         headers={"traceparent": "00-%s-%s-01" % (TRACE, PARENT),
                                  "tracestate": "gw=1"})
        assert st == 202, out
        st, bad = g.json("POST", "/v1/tasks", {"task": "llm.generate", "args": ["bad"]},
                         headers={"traceparent": "00-zz"})
        assert st == 202, bad  # a malformed context is dropped, the task goes
        wait_until(lambda: len(rx.named("run/llm.generate")) == 2, timeout=15,
                   what="two run spans")
        runs = {s["attributes"]["messaging.message.id"]: s
                for s in rx.named("run/llm.generate")}
        mine = runs[out["task_id"]]
        assert mine["traceId"] == TRACE and mine["parentSpanId"] == PARENT
        assert mine["traceState"] == "gw=1"
        assert runs[bad["task_id"]]["traceId"] != TRACE
        assert not runs[bad["task_id"]].get("parentSpanId")
    finally:
        assert g.stop() == 0


def test_gateway_with_otel_starts_or_continues_the_trace(env, rx):
    """With OTEL_* set the gateway's submit is a PRODUCER span
    "apply_async/<task>" (as a Python producer's), under the caller's
    context when one came, else the root of a new trace; the worker's run
    span is its child."""
    from test_gateway import Gateway
    env.worker(env=otel_env(rx))
    g = Gateway(env, extra_env=otel_env(rx, OTEL_SERVICE_NAME="llm-gateway"))
    try:
        st, cont = g.json("POST", "/v1/tasks", {"task": "llm.generate", "args": ["gw span"]},
                          headers={"traceparent": "00-%s-%s-01" % (TRACE, PARENT),
                                   "tracestate": "gw=1"})
        assert st == 202, cont
        st, root = g.json("POST", "/v1/tasks", {"task": "llm.generate", "args": ["gw root"]})
        assert st == 202, root
        wait_until(lambda: len(rx.named("run/llm.generate")) == 2
                   and len(rx.named("apply_async/llm.generate")) == 2, timeout=15,
                   what="two run spans and two producer spans")
        sends = {s["attributes"]["messaging.message.id"]: s
                 for s in rx.named("apply_async/llm.generate")}
        runs = {s["attributes"]["messaging.message.id"]: s
                for s in rx.named("run/llm.generate")}
        s1, r1 = sends[cont["task_id"]], runs[cont["task_id"]]
        assert s1["traceId"] == TRACE and s1["parentSpanId"] == PARENT
        assert s1["kind"] == 4 and s1["attributes"]["celery.action"] == "apply_async"
        assert r1["traceId"] == TRACE and r1["parentSpanId"] == s1["spanId"]
        assert r1["traceState"] == "gw=1"
        s2, r2 = sends[root["task_id"]], runs[root["task_id"]]
        assert not s2.get("parentSpanId") and s2["traceId"] != TRACE
        assert r2["traceId"] == s2["traceId"] and r2["parentSpanId"] == s2["spanId"]
    finally:
        assert g.stop() == 0
