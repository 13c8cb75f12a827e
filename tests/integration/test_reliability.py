"""Issue 3: no task is ever lost -- retries, Retry-After, time limits, eta,
expiry, dead letters, bad input, and broker/backend outages."""
import base64
import glob
import json
import os
import signal
import socket
import threading
import time
import uuid

import amqp
import pytest

from conftest import ROOT, free_port, wait_until
from conftest import amqp_unacked as unacked
from tcpproxy import TcpProxy

FAST = ["--retry-backoff", "0.2", "--retry-backoff-factor", "2", "--retry-jitter", "false"]


def amqp_conn(env):
    c = amqp.Connection(host="127.0.0.1:%d" % env.services.amqp_port, userid="guest",
                        password="guest", virtual_host=env.vhost)
    c.connect()
    return c


def publish_raw(env, body, headers=None, content_type="application/json",
                content_encoding="utf-8", routing_key="celery", correlation_id=None, **props):
    with amqp_conn(env) as c:
        ch = c.channel()
        msg = amqp.Message(body=body, content_type=content_type,
                           content_encoding=content_encoding, application_headers=headers,
                           delivery_mode=2, correlation_id=correlation_id, **props)
        ch.basic_publish(msg, exchange="", routing_key=routing_key)


def drain_dead_letters(env, timeout=20, want=1, match=None):
    """Reads dead letters (acking them) until `want` matching ones arrived."""
    got = []
    deadline = time.time() + timeout
    with amqp_conn(env) as c:
        ch = c.channel()
        while time.time() < deadline and len(got) < want:
            m = ch.basic_get("celeriac.dead", no_ack=True)
            if m is None:
                time.sleep(0.05)
                continue
            if match is None or match(m):
                got.append(m)
    return got


def calls(env):
    return [e for e in env.fake.stats() if e["path"].startswith("/v1/")]


def states_of(result, timeout=30):
    seen = []
    try:
        result.get(timeout=timeout, on_message=lambda m: seen.append(m["status"]),
                   propagate=False)
    except Exception:
        pass
    return seen


# ----------------------------------------------------------------- retries

@pytest.mark.brokers("amqp", "redis", "sqs")
def test_retry_honours_retry_after_then_succeeds(env):
    env.worker(*FAST)
    env.fake.script(["status=429;ra=1", "status=503;ra_ms=700", "tokens=5"])
    r = env.app.send_task("llm.generate", args=["retry me"])
    seen = states_of(r)
    assert r.get(timeout=1) == env.fake.expected_text("retry me", tokens=5)
    assert seen.count("RETRY") == 2 and seen[-1] == "SUCCESS"
    c = calls(env)
    assert [e["status"] for e in c] == [429, 503, 200]
    gap1 = c[1]["t"] - c[0]["t"]
    gap2 = c[2]["t"] - c[1]["t"]
    assert 1.0 <= gap1 < 2.0, gap1       # Retry-After: 1 s overrides the 0.2 s backoff
    assert 0.7 <= gap2 < 1.7, gap2       # retry-after-ms wins over everything


@pytest.mark.brokers("amqp", "redis")
def test_backoff_policy_delays(env):
    env.worker(*FAST, "--max-retries", "3")
    env.fake.script(["status=500"] * 3 + ["tokens=3"])
    r = env.app.send_task("llm.generate", args=["backoff"])
    assert r.get(timeout=30)
    c = calls(env)
    assert len(c) == 4
    gaps = [c[i + 1]["t"] - c[i]["t"] for i in range(3)]
    for got, want in zip(gaps, [0.2, 0.4, 0.8]):
        assert want <= got < want + 0.8, gaps


def test_full_jitter_stays_under_the_cap(env):
    env.worker("--retry-backoff", "0.4", "--retry-backoff-max", "0.5", "--max-retries", "4")
    env.fake.script(["status=502"] * 4 + ["tokens=2"])
    r = env.app.send_task("llm.generate", args=["jitter"])
    assert r.get(timeout=30)
    c = calls(env)
    gaps = [c[i + 1]["t"] - c[i]["t"] for i in range(len(c) - 1)]
    assert len(gaps) == 4 and all(g < 0.5 + 0.8 for g in gaps), gaps


def test_retries_exhausted_fail_and_dead_letter(env):
    env.worker(*FAST, "--max-retries", "2")
    env.fake.script(["status=503;err_msg=overloaded"] * 3)
    r = env.app.send_task("llm.generate", args=["always 503"], queue="celery")
    with pytest.raises(Exception) as ei:
        r.get(timeout=30)
    assert type(ei.value).__name__ == "InternalServerError"
    assert "overloaded" in str(ei.value)
    meta = env.meta(r.id)
    assert meta["status"] == "FAILURE"
    assert meta["result"]["exc_type"] == "InternalServerError"
    assert meta["result"]["exc_module"] == "celeriac.exceptions"
    assert "Traceback" in meta["traceback"]
    assert len(calls(env)) == 3
    dl = drain_dead_letters(env, match=lambda m: m.headers.get("id") == r.id)
    assert dl, "no dead letter"
    h = dl[0].headers
    assert h["x-celeriac-reason"] == "retries exhausted"
    assert h["x-celeriac-exception-type"] == "InternalServerError"
    assert "overloaded" in h["x-celeriac-exception-message"]
    assert h["x-celeriac-http-status"] == 503
    assert h["x-celeriac-retries"] == 2
    assert h["x-celeriac-original-queue"] == "celery"
    assert h["x-celeriac-original-routing-key"] == "celery"
    assert h["x-celeriac-worker"].startswith("celeriac-")
    assert h["x-celeriac-first-received"] and h["x-celeriac-failed-at"]
    assert h["task"] == "llm.generate"          # original headers kept
    body = json.loads(dl[0].body)
    assert body[0] == ["always 503"]            # original body kept


def test_dead_letter_carries_the_headers_celery_sent(env):
    # the worker keeps only the headers Celery does not define and rebuilds the
    # others from the decoded fields: the dead letter must still carry exactly
    # what the producer sent
    from celery.signals import before_task_publish
    sent = {}

    def grab(headers=None, **kw):
        sent.update(headers)

    before_task_publish.connect(grab, weak=False)
    try:
        env.worker("--max-retries", "0")
        env.fake.script(["status=400;err_msg=nope"])
        r = env.app.send_task("llm.generate", args=["keep my headers"],
                              kwargs={"model": "m-1"}, countdown=0.1, expires=600,
                              headers={"x-tenant": "acme", "x-trace": [1, {"a": None}]})
    finally:
        before_task_publish.disconnect(grab)
    dl = drain_dead_letters(env, match=lambda m: m.headers.get("id") == r.id)
    assert dl, "no dead letter"
    got = {k: v for k, v in dl[0].headers.items() if not k.startswith("x-celeriac-")}
    assert sent["x-tenant"] == "acme" and "eta" in sent
    assert got == json.loads(json.dumps(sent))


def test_dead_letter_after_a_call_rebuilds_a_missing_argsrepr(env):
    # A producer that sends no argsrepr/kwargsrepr: the dead letter gets them
    # made from the args, which a running call has put away (and must bring
    # back), not from an empty argument list.
    env.worker("--max-retries", "0")
    env.fake.script(["status=400;err_msg=nope"])
    tid = str(uuid.uuid4())
    hdr = {"lang": "py", "task": "llm.generate", "id": tid, "retries": 0, "root_id": tid,
           "parent_id": None, "group": None, "eta": None, "timelimit": [None, None]}
    publish_raw(env, json.dumps([["no repr"], {"max_tokens": 5}, None]), headers=hdr)
    dl = drain_dead_letters(env, match=lambda m: m.headers.get("id") == tid)
    assert dl, "no dead letter"
    assert len(calls(env)) == 1
    assert dl[0].headers["argsrepr"] == "('no repr',)"
    assert dl[0].headers["kwargsrepr"] == "{'max_tokens': 5}"


@pytest.mark.parametrize("scenario,exc", [
    ("status=400;err_msg=context_length_exceeded", "BadRequestError"),
    ("status=401;err_msg=bad key", "AuthenticationError"),
    ("status=403", "PermissionDeniedError"),
    ("status=404", "NotFoundError"),
    ("status=422", "UnprocessableEntityError"),
    ("status=429;code=insufficient_quota;err_msg=no credit", "RateLimitError"),
])
def test_permanent_failures_are_not_retried(env, scenario, exc):
    env.worker(*FAST)
    env.fake.script([scenario, "tokens=2"])
    r = env.app.send_task("llm.generate", args=["perm"])
    with pytest.raises(Exception) as ei:
        r.get(timeout=20)
    assert type(ei.value).__name__ == exc
    assert len(calls(env)) == 1
    assert env.meta(r.id)["status"] == "FAILURE"
    dl = drain_dead_letters(env, match=lambda m: m.headers.get("id") == r.id)
    assert dl and dl[0].headers["x-celeriac-reason"] == "permanent failure"


def test_x_should_retry_header_overrides_status(env):
    env.worker(*FAST)
    env.fake.script(["status=400;should_retry=true", "status=500;should_retry=false", "tokens=2"])
    r1 = env.app.send_task("llm.generate", args=["a"])
    # 400 + x-should-retry: true is retried, then 500 + false fails for good
    with pytest.raises(Exception) as ei:
        r1.get(timeout=20)
    assert type(ei.value).__name__ == "InternalServerError"
    assert [e["status"] for e in calls(env)] == [400, 500]


@pytest.mark.parametrize("fault", [
    "cut_after_tokens=3;cut_mode=fin_raw",
    "cut_after_tokens=3;cut_mode=fin_clean",
    "cut_after_tokens=3;cut_mode=rst",
    "fail_after_tokens=2;fail_fmt=data_error",
    "fail_after_tokens=2;fail_fmt=data_error_then_done",
    "garbage=2",
    "finish_style=none;done=no",
])
def test_broken_streams_are_retried(env, fault):
    env.worker(*FAST)
    env.fake.script([fault + ";tokens=8", "tokens=8"])
    r = env.app.send_task("llm.generate", args=["fragile"])
    assert r.get(timeout=20) == env.fake.expected_text("fragile", tokens=8)
    assert len(calls(env)) == 2


def test_stream_quirks_still_succeed(env):
    env.worker()
    quirks = ["eol=crlf;write_bytes=3;split_utf8=1;unicode=1",
              "eol=cr;bom=1;ping_ms=1;event_lines=1",
              "finish_style=merged;done=no_blank_line;role_content=null",
              "usage=never;multiline_data=1", "json_ascii=1;unicode=1;write_bytes=random"]
    env.fake.script(quirks)
    for q in quirks:
        r = env.app.send_task("llm.generate", args=["quirk"])
        uni = 1 if "unicode=1" in q else 0
        assert r.get(timeout=20) == env.fake.expected_text("quirk", unicode=uni), q


# ----------------------------------------------------------- time and eta

@pytest.mark.brokers("amqp", "redis", "sqs")
def test_countdown_and_eta(env):
    from datetime import datetime, timedelta, timezone
    env.worker()
    t0 = time.time()
    a = env.app.send_task("llm.generate", args=["later"], countdown=2)
    b = env.app.send_task("llm.generate", args=["at eta"],
                          eta=datetime.now(timezone.utc) + timedelta(seconds=1.5))
    assert a.get(timeout=20) and b.get(timeout=20)
    by_prompt = {e["prompt"]: e["t"] for e in calls(env)}
    assert by_prompt["later"] - t0 >= 1.9
    assert by_prompt["at eta"] - t0 >= 1.4


@pytest.mark.brokers("amqp", "redis", "sqs")
def test_eta_tasks_hold_no_slot_and_do_not_starve(env):
    env.worker("-c", "1", "--prefetch-multiplier", "1")
    held = [env.app.send_task("llm.generate", args=["held %d" % i], countdown=3) for i in range(3)]
    ready = [env.app.send_task("llm.generate", args=["now %d" % i]) for i in range(5)]
    for r in ready:
        r.get(timeout=10)
    assert all(env.meta(r.id) is None for r in held)   # still waiting for their eta
    for r in held:
        r.get(timeout=20)


def test_expired_tasks_are_revoked(env):
    from celery.exceptions import TaskRevokedError
    env.worker()
    # expires before its eta arrives: revoked when the eta fires
    r = env.app.send_task("llm.generate", args=["too late"], countdown=2, expires=1)
    with pytest.raises(TaskRevokedError):
        r.get(timeout=20)
    assert env.meta(r.id)["result"]["exc_message"] == ["expired"]
    # expires header in the past but no AMQP TTL (another producer): revoked on receipt
    tid = str(uuid.uuid4())
    hdr = {"lang": "py", "task": "llm.generate", "id": tid, "retries": 0, "root_id": tid,
           "parent_id": None, "group": None, "eta": None, "timelimit": [None, None],
           "expires": "2020-01-01T00:00:00+00:00", "argsrepr": "()", "kwargsrepr": "{}"}
    publish_raw(env, json.dumps([["x"], {}, None]), headers=hdr)
    wait_until(lambda: env.meta(tid), 20, what="REVOKED for expired raw message")
    assert env.meta(tid)["status"] == "REVOKED"
    assert calls(env) == []


@pytest.mark.brokers("amqp", "redis", "sqs")
def test_time_limits(env):
    from celery.exceptions import TimeLimitExceeded, SoftTimeLimitExceeded
    w = env.worker()
    env.fake.script(["latency_ms=8000"] * 3)
    t0 = time.time()
    r = env.app.send_task("llm.generate", args=["slow"], time_limit=1)
    with pytest.raises(TimeLimitExceeded):
        r.get(timeout=20)
    assert time.time() - t0 < 5
    r = env.app.send_task("llm.generate", args=["slow soft"], soft_time_limit=1)
    with pytest.raises(SoftTimeLimitExceeded):
        r.get(timeout=20)
    w.stop()
    env.worker("--time-limit", "1")
    r = env.app.send_task("llm.generate", args=["default limit"])
    with pytest.raises(TimeLimitExceeded):
        r.get(timeout=20)


def blackhole():
    """A listening socket whose accept queue is full, so connects hang."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    fillers = []
    for _ in range(8):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(s.getsockname())
        except BlockingIOError:
            pass
        fillers.append(c)
    return s, fillers


@pytest.mark.parametrize("phase,scenario,option", [
    ("first byte", "latency_ms=5000", "--llm-first-byte-timeout"),
    ("first token", "ttft_ms=5000", "--llm-first-token-timeout"),
    ("idle", "stall_after_tokens=2", "--llm-idle-timeout"),
])
def test_phase_timeouts_are_retryable(env, phase, scenario, option):
    env.worker(*FAST, option, "0.5")
    env.fake.script([scenario + ";tokens=6", "tokens=6"])
    t0 = time.time()
    r = env.app.send_task("llm.generate", args=["phase"])
    assert r.get(timeout=20) == env.fake.expected_text("phase", tokens=6)
    assert len(calls(env)) == 2
    assert time.time() - t0 < 4.5


def test_connect_timeout(env):
    s, fillers = blackhole()
    try:
        port = s.getsockname()[1]
        env.worker("--llm-connect-timeout", "0.5", "--max-retries", "0",
                   env={"OPENAI_BASE_URL": "http://127.0.0.1:%d/v1" % port})
        t0 = time.time()
        r = env.app.send_task("llm.generate", args=["unreachable"])
        with pytest.raises(Exception) as ei:
            r.get(timeout=20)
        assert type(ei.value).__name__ in ("APITimeoutError", "APIConnectionError")
        assert time.time() - t0 < 10
    finally:
        for c in fillers:
            c.close()
        s.close()


def test_refused_connection_says_why_and_where(env):
    # Nothing listens on the port: the failure names the system error and
    # the host and port, not the whole URL (whose query could hold a key).
    port = free_port()
    env.worker("--max-retries", "0",
               env={"OPENAI_BASE_URL": "http://127.0.0.1:%d/v1?key=sekrit" % port})
    r = env.app.send_task("llm.generate", args=["nobody home"])
    with pytest.raises(Exception) as ei:
        r.get(timeout=20)
    assert type(ei.value).__name__ == "APIConnectionError"
    msg = str(ei.value)
    assert "Connection refused" in msg, msg
    assert "(127.0.0.1:%d)" % port in msg, msg
    assert "sekrit" not in msg, msg


@pytest.mark.parametrize("quote", ["full", "masked"])
def test_a_quoted_api_key_is_cut_out_of_everything(env, quote):
    # A provider or proxy that quotes the key back: neither the key nor its
    # head reaches the log, the stored FAILURE, the dead letter or the event.
    from test_monitoring import Events
    key = "sk-test-secret-key"  # conftest's OPENAI_API_KEY
    ev = Events(env.app)
    try:
        w = env.worker("-E", "--max-retries", "0")
        env.fake.script(["status=401;err_quote_key=" + quote])
        r = env.app.send_task("llm.generate", args=["bad key"])
        with pytest.raises(Exception) as ei:
            r.get(timeout=20)
        assert type(ei.value).__name__ == "AuthenticationError"
        assert calls(env)[-1]["headers"]["authorization"] == "Bearer " + key
        failed = ev.wait("task-failed", r.id)
        dl = drain_dead_letters(env, match=lambda m: m.headers.get("id") == r.id)
        assert dl, "no dead letter"
        w.wait_for("dead-lettered")
        meta = env.redis.get("celery-task-meta-" + r.id).decode()
        texts = {"log": w.log(), "meta": meta, "dead letter": json.dumps(dl[0].headers),
                 "event": json.dumps(failed), "exception": str(ei.value)}
        for where, text in texts.items():
            assert key not in text, where
            assert key[:8] not in text, where
            assert "Incorrect API key provided: ***" in text, (where, text[-2000:])
    finally:
        ev.close()


# ------------------------------------------------------------ bad input

CORPUS = sorted(glob.glob(os.path.join(ROOT, "tests", "corpus", "bad", "*.json")))


def test_bad_message_corpus(env):
    assert len(CORPUS) >= 20
    w = env.worker()
    cases = {}
    for path in CORPUS:
        doc = json.load(open(path))
        tid = str(uuid.uuid4())
        body = base64.b64decode(doc["body_b64"]).replace(b'"ID"', json.dumps(tid).encode())
        headers = doc["headers"]
        if headers is not None:
            headers = json.loads(json.dumps(headers).replace('"ID"', json.dumps(tid)))
        corr = "case-" + doc["name"]
        publish_raw(env, body, headers=headers, content_type=doc["content_type"],
                    correlation_id=corr)
        cases[corr] = (doc, tid)
    # a huge payload, over --max-message-size (10 MiB by default)
    tid = str(uuid.uuid4())
    huge = json.dumps([["x" * (11 << 20)], {}, None])
    publish_raw(env, huge, headers={"lang": "py", "task": "llm.generate", "id": tid,
                                    "root_id": tid}, correlation_id="case-huge")
    cases["case-huge"] = ({"name": "huge", "id_known": True, "exc_type": "MessageTooLarge",
                           "expect_reason": "cannot decode"}, tid)
    dead = drain_dead_letters(env, timeout=60, want=len(cases),
                              match=lambda m: m.properties.get("correlation_id", "") in cases)
    got = {m.properties["correlation_id"]: m for m in dead}
    missing = sorted(set(cases) - set(got))
    assert not missing, "not dead-lettered: %s\n%s" % (missing, w.log()[-3000:])
    for corr, (doc, tid) in cases.items():
        h = got[corr].headers
        assert h["x-celeriac-reason"] == doc["expect_reason"], (corr, h["x-celeriac-reason"])
        assert h["x-celeriac-exception-message"], corr
        if doc.get("exc_type"):
            assert h["x-celeriac-exception-type"] == doc["exc_type"], (corr, h)
        if doc["id_known"]:
            # FAILURE is stored once the dead letter is confirmed, so just after it
            meta = wait_until(lambda: env.meta(tid), 20, what="FAILURE of " + corr)
            assert meta["status"] == "FAILURE", (corr, meta)
            assert meta["result"]["exc_type"] == doc["exc_type"], (corr, meta)
    assert w.proc.poll() is None
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 20)
    # and a valid task right after succeeds
    r = env.app.send_task("llm.generate", args=["still alive"])
    assert r.get(timeout=20) == env.fake.expected_text("still alive")
    assert calls(env)[-1]["prompt"] == "still alive"


def test_a_bad_header_entry_drops_only_itself(env):
    # A header nested past the 64 levels the worker converts: the dead letter
    # keeps every other header (id and task included) and the id gets its
    # FAILURE, as for any other message that cannot be decoded.
    env.worker()
    tid = str(uuid.uuid4())
    deep = {}
    for _ in range(70):
        deep = {"k": deep}
    headers = {"lang": "py", "task": "llm.generate", "id": tid, "root_id": tid,
               "custom": "kept", "deep": deep, "retries": 0}
    publish_raw(env, json.dumps([["x"], {}, None]), headers=headers,
                correlation_id="bad-header")
    dl = drain_dead_letters(env, match=lambda m:
                            m.properties.get("correlation_id") == "bad-header")
    assert dl, "no dead letter"
    h = dl[0].headers
    assert (h.get("id"), h.get("task"), h.get("custom")) == (tid, "llm.generate", "kept"), h
    assert "deep" not in h
    assert h["x-celeriac-reason"] == "cannot decode"
    assert h["x-celeriac-exception-type"] == "DecodeError"
    assert "header 'deep'" in h["x-celeriac-exception-message"]
    meta = wait_until(lambda: env.meta(tid), 20, what="the FAILURE")
    assert meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "DecodeError"
    assert json.loads(dl[0].body) == [["x"], {}, None]


# -------------------------------------------------------------- outages

def count_publishes(env, stop):
    """Counts final-state publishes per task id on the result channels."""
    import redis
    seen = {}

    def run():
        while not stop.is_set():
            try:
                r = redis.Redis(host="127.0.0.1", port=env.services.redis_port, db=env.db)
                p = r.pubsub()
                p.psubscribe("celery-task-meta-*")
                while not stop.is_set():
                    m = p.get_message(timeout=0.2)
                    if m and m["type"] == "pmessage":
                        meta = json.loads(m["data"])
                        if meta["status"] in ("SUCCESS", "FAILURE", "REVOKED"):
                            seen[meta["task_id"]] = seen.get(meta["task_id"], 0) + 1
            except Exception:
                time.sleep(0.2)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.5)
    return seen, t


def test_rabbitmq_restart_mid_run(env):
    n = 1000
    stop = threading.Event()
    seen, t = count_publishes(env, stop)
    w = env.worker("-c", "100", "--loglevel", "warning")
    env.fake.script(["latency_ms=150;tokens=3"] * (2 * n))
    results = [env.app.send_task("llm.generate", args=["rmq-%d" % i]) for i in range(n)]
    wait_until(lambda: len(seen) >= n // 4, 60, what="a quarter done")
    env.services.script("rabbit-stop")
    time.sleep(1)
    env.services.script("rabbit-start")
    wait_until(lambda: all(env.meta(r.id) for r in results), 180, interval=0.5,
               what="every result after the restart")
    time.sleep(1)
    stop.set()
    t.join(5)
    assert all(env.meta(r.id)["status"] == "SUCCESS" for r in results)
    twice = [k for k, v in seen.items() if v > 1]
    assert not twice, "stored twice: %s" % twice[:5]
    assert "connection to broker lost" in w.log()
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30)


def test_redis_outage_mid_run(env):
    n = 1000
    w = env.worker("-c", "100", "--loglevel", "warning")
    env.fake.script(["latency_ms=100;tokens=3"] * (2 * n))
    results = [env.app.send_task("llm.generate", args=["redis-%d" % i]) for i in range(n)]
    wait_until(lambda: sum(1 for r in results[::10] if env.meta(r.id)) >= 20, 60,
               what="some results")
    env.services.script("redis-stop")
    time.sleep(5)
    env.services.script("redis-start")
    env.redis.connection_pool.disconnect()
    wait_until(lambda: all(env.meta(r.id) for r in results), 60, interval=0.5,
               what="every result after the outage")
    assert all(env.meta(r.id)["status"] == "SUCCESS" for r in results)
    assert "result backend: connection lost" in w.log()
    # nothing was acked before its result was stored, nothing is left behind
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30)
    per_prompt = {}
    for e in calls(env):
        per_prompt[e["prompt"]] = per_prompt.get(e["prompt"], 0) + 1
    assert len(per_prompt) == n


def test_broker_outage_keeps_retries_and_dead_letters(env):
    """Calls in flight when RabbitMQ goes away answer while it is down. A 503
    whose retry cannot be published must not become FAILURE, a 400 whose dead
    letter cannot be published must still reach celeriac.dead once the broker
    is back, without a second call, a success stored meanwhile is not paid for
    again, and the
    tasks still waiting for a slot in the worker start only once the broker is
    back (their deliveries died with the connection). The fake LLM holds every
    first answer until the worker has seen the connection go, so the order is
    fixed, not a race."""
    n = 15
    w = env.worker("-c", str(3 * n), *FAST)
    groups = {"ok": ["hold=out;tokens=3"],
              "retry": ["hold=out;status=503;err_msg=overloaded", "tokens=3"],
              "perm": ["hold=out;status=400;err_msg=nope", "status=400;err_msg=nope"],
              "queued": ["tokens=3"]}
    for g, sc in groups.items():
        for i in range(n):
            env.fake.script(sc, model="out-%s-%d" % (g, i))
    rs = {g: [env.app.send_task("llm.generate", args=["outage %s %d" % (g, i)],
                                kwargs={"model": "out-%s-%d" % (g, i)})
              for i in range(n)]
          for g in ("ok", "retry", "perm", "queued")}
    # every task received, the first 3n calls held, the last n waiting for a slot
    w.wait_for(r"Task llm.generate\[.*\] received$", 30, count=4 * n)
    wait_until(lambda: len(calls(env)) == 3 * n, 30, what="the held calls")
    env.services.script("rabbit-stop")
    w.wait_for("connection to broker lost", 30)
    env.fake.release("out")
    # the answers are handled while the broker is still down
    wait_until(lambda: all(env.meta(r.id) for r in rs["ok"]), 30, what="ok stored")
    w.wait_for("cannot publish its retry", 30, count=n)
    w.wait_for("cannot be dead-lettered now", 30, count=n)
    t_back = time.time()
    env.services.script("rabbit-start")
    everything = [r for g in rs.values() for r in g]
    wait_until(lambda: all(env.meta(r.id) and env.meta(r.id)["status"] != "RETRY"
                           for r in everything), 120, interval=0.5,
               what="every task final after the outage")
    status = {g: [env.meta(r.id)["status"] for r in rs[g]] for g in rs}
    assert status["ok"] == ["SUCCESS"] * n
    assert status["retry"] == ["SUCCESS"] * n, status["retry"]
    assert status["queued"] == ["SUCCESS"] * n
    assert status["perm"] == ["FAILURE"] * n
    per_model = {}
    for c in calls(env):
        per_model.setdefault(c["model"], []).append(c)
    for g, ncalls in (("ok", 1), ("retry", 2), ("perm", 1), ("queued", 1)):
        for i in range(n):
            assert len(per_model.get("out-%s-%d" % (g, i), [])) == ncalls, (g, i)
    for i in range(n):
        assert per_model["out-queued-%d" % i][0]["t"] >= t_back, \
            "a queued task was started while the broker was down"
    # exactly one dead letter for each permanent failure, none for the others
    dead = drain_dead_letters(env, timeout=30, want=n)
    time.sleep(1)
    dead += drain_dead_letters(env, timeout=0.1, want=1)
    ids = sorted(m.headers["id"] for m in dead)
    assert ids == sorted(r.id for r in rs["perm"]), ids
    assert wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 30)


def test_permanent_failure_is_not_called_again_after_a_broker_outage(env):
    """Issue 37: a 400 answered while RabbitMQ is down cannot have its dead
    letter published, and its message comes back once the broker is. The
    outcome is known: the redelivery must dead-letter it (with the reason the
    first run had), keep FAILURE stored and ack, without calling the provider a
    second time. The fake holds every answer until the worker has seen the
    connection go, so the order is fixed; it would answer a second call too, so
    a second call shows up in its count rather than as a hang."""
    n = 5
    w = env.worker("-c", str(n), *FAST)
    for i in range(n):
        env.fake.script(["hold=perm;status=400;err_msg=nope", "status=400;err_msg=nope"],
                        model="perm-%d" % i)
    rs = [env.app.send_task("llm.generate", args=["perm %d" % i],
                            kwargs={"model": "perm-%d" % i}) for i in range(n)]
    wait_until(lambda: len(calls(env)) == n, 30, what="the held calls")
    env.services.script("rabbit-stop")
    try:
        w.wait_for("connection to broker lost", 30)
        env.fake.release("perm")
        w.wait_for("cannot be dead-lettered now", 30, count=n)
        # the client hears of the FAILURE while the broker is still down
        wait_until(lambda: all((env.meta(r.id) or {}).get("status") == "FAILURE"
                               for r in rs), 30, what="FAILURE stored during the outage")
    finally:
        env.services.script("rabbit-start")
    dead = drain_dead_letters(env, timeout=60, want=n)
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0
               and unacked(env) == 0, 60, interval=0.2, what="every message acked")
    time.sleep(0.5)
    dead += drain_dead_letters(env, timeout=0.1, want=1)
    per_model = {}
    for c in calls(env):
        per_model[c["model"]] = per_model.get(c["model"], 0) + 1
    assert per_model == {"perm-%d" % i: 1 for i in range(n)}, per_model
    assert sorted(m.headers["id"] for m in dead) == sorted(r.id for r in rs)
    for m in dead:
        assert m.headers["x-celeriac-reason"] == "permanent failure"
        assert m.headers["x-celeriac-exception-type"] == "BadRequestError"
        assert m.headers["x-celeriac-http-status"] == 400
    for r in rs:
        meta = env.meta(r.id)
        assert meta["status"] == "FAILURE"
        assert meta["result"]["exc_type"] == "BadRequestError"
        assert "celeriac_dead_letter_pending" not in meta, meta
        assert r.get(timeout=10, propagate=False) is not None
        assert r.state == "FAILURE"


def test_late_retry_never_replaces_a_final_failure(env):
    """Issue 37: a retry is published before its RETRY is stored, so the next
    attempt can run on another worker and store FAILURE first. Here the first
    worker's Redis connection goes through a proxy that swallows its RETRY
    store until the second worker has run the retry to its FAILURE; the RETRY
    goes again after the reconnect and lands last. FAILURE must stay, and a
    client's get() must return."""
    proxy = TcpProxy(env.services.redis_port).start()
    try:
        a = env.worker("-c", "1", "--prefetch-multiplier", "1", "--redis-timeout", "2",
                       *FAST, start=False)
        i = a.args.index("--result-backend")
        a.args[i + 1] = "redis://127.0.0.1:%d/%d" % (proxy.port, env.db)
        a.start()
        env.fake.script(["status=429;ra_ms=1", "status=400;err_msg=nope"],
                        model="late-retry")
        proxy.blackhole(True)
        r = env.app.send_task("llm.generate", args=["late retry"],
                              kwargs={"model": "late-retry"})
        a.wait_for(r"retry: Retry in", 30)
        # the first worker holds the original (unacked, its RETRY unanswered),
        # so the retry goes to the second one
        b = env.worker("-c", "1", *FAST)
        b.wait_for(r"raised unexpected: BadRequestError", 30)
        wait_until(lambda: (env.meta(r.id) or {}).get("status") == "FAILURE", 30,
                   what="the second attempt's FAILURE")
        proxy.blackhole(False)
        # the first worker reconnects and stores its RETRY again, then acks
        wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0
                   and unacked(env) == 0, 60, interval=0.2, what="the original acked")
        assert a.count("retry: Retry in") == 1
        assert len(calls(env)) == 2
        assert env.meta(r.id)["status"] == "FAILURE", env.meta(r.id)
        assert r.get(timeout=10, propagate=False) is not None
        assert r.state == "FAILURE"
    finally:
        proxy.close()


# ------------------------------------------------------------ dlq command

def test_worker_ignores_sigpipe(env):
    # As Python does: a write to a Redis socket whose far end is gone must
    # come back as EPIPE for hiredis to reconnect, not kill the worker.
    w = env.worker()
    with open("/proc/%d/status" % w.proc.pid) as f:
        ignored = int(next(l for l in f if l.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1))


def test_flushed_script_cache_reloads_each_script_once(env):
    # Redis forgets its scripts when it restarts or on SCRIPT FLUSH; then
    # every EVALSHA in flight comes back NOSCRIPT. One EVAL per script loads
    # it again and the rest are resent as EVALSHA, not each with the text.
    n = 200
    env.worker("-c", str(n), "--loglevel", "warning")
    env.fake.script(["ttft_ms=2000;tokens=3"] * n)
    results = [env.app.send_task("llm.generate", args=["flush-%d" % i]) for i in range(n)]
    wait_until(lambda: sum(1 for c in env.fake.stats() if c.get("t_headers")) >= n, 30,
               what="every call waiting for its first token")
    env.redis.script_flush()
    env.redis.config_resetstat()
    # Redis busy for the 3 s in which the first tokens come: every result
    # and progress write meets the flushed cache at once when it is done.
    env.redis.eval("local t = redis.call('TIME')[1] + 3 "
                   "while tonumber(redis.call('TIME')[1]) < t do end", 0)
    wait_until(lambda: all(env.meta(r.id) for r in results), 60, interval=0.2,
               what="every result")
    assert all(env.meta(r.id)["status"] == "SUCCESS" for r in results)
    for r in results[:20]:
        states = [f[b"state"] for _, f in env.redis.xrange("celeriac:progress:" + r.id)]
        assert states[-1] == b"SUCCESS", states
    stats = env.redis.info("commandstats")
    evals = stats.get("cmdstat_eval", {}).get("calls", 0)
    evalshas = stats.get("cmdstat_evalsha", {}).get("calls", 0)
    # the busy script above, then the result and progress scripts once each
    assert evals == 3, stats.get("cmdstat_eval")
    assert evalshas >= 2 * n


def dlq(env, *args):
    import subprocess
    from conftest import BIN
    return subprocess.run([BIN, "dlq", "-b", env.broker, *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.brokers("amqp", "redis")
def test_dlq_list_show_replay_purge(env):
    w = env.worker(*FAST, "--max-retries", "0")
    env.fake.script(["status=500"] * 3)
    failed = [env.app.send_task("llm.generate", args=["dead %d" % i]) for i in range(3)]
    unknown = env.app.send_task("no.such.task", args=[1])
    for r in failed + [unknown]:
        wait_until(lambda: env.meta(r.id), 20, what="FAILURE")
    wait_until(lambda: env.services.queue_depth(env.vhost, "celeriac.dead") == 4, 20)
    out = dlq(env, "list")
    assert out.returncode == 0, out.stderr
    for r in failed + [unknown]:
        assert r.id in out.stdout
    assert "retries exhausted" in out.stdout and "unregistered task" in out.stdout
    lines = dlq(env, "list", "--json").stdout.strip().splitlines()
    assert len(lines) == 4 and {json.loads(l)["task"] for l in lines} == {"llm.generate", "no.such.task"}
    shown = dlq(env, "show", failed[0].id)
    assert shown.returncode == 0 and "InternalServerError" in shown.stdout and "dead 0" in shown.stdout
    assert dlq(env, "show", "no-such-id").returncode != 0
    # listing and showing consumed nothing
    assert env.services.queue_depth(env.vhost, "celeriac.dead") == 4
    # replay one by id: it runs again (the provider now answers) and succeeds
    out = dlq(env, "replay", failed[0].id)
    assert out.returncode == 0 and "replayed 1 of" in out.stdout, out.stdout + out.stderr
    wait_until(lambda: env.meta(failed[0].id)["status"] == "SUCCESS", 20, what="replayed success")
    assert env.fake.stats()[-1]["prompt"] == "dead 0"
    # replay by filter (task and reason)
    out = dlq(env, "replay", "--task", "llm.generate", "--reason", "retries")
    assert "replayed 2 of 3" in out.stdout, out.stdout
    for r in failed[1:]:
        wait_until(lambda: env.meta(r.id)["status"] == "SUCCESS", 20, what="replayed success")
    # the unknown task was left alone by the filter; purge drops it
    assert env.services.queue_depth(env.vhost, "celeriac.dead") == 1
    out = dlq(env, "purge")
    assert out.returncode == 0 and "purged 1" in out.stdout
    assert env.services.queue_depth(env.vhost, "celeriac.dead") == 0
    assert w.proc.poll() is None


def redis_dead_letters(env):
    """The dead letters in the Redis broker's celeriac.dead, as kombu laid them."""
    return [json.loads(v) for v in env.broker_redis.lrange("celeriac.dead", 0, -1)]


@pytest.mark.brokers("redis")
def test_dead_letter_lands_when_the_redis_binding_is_gone(env):
    # A FLUSHDB or a Redis restarted without persistence takes the dead-letter
    # queue's binding with it, and the worker does not reconnect: a routed
    # publish to celeriac.dlx would match no queue and be dropped while the
    # worker logs "dead-lettered". The dead letter must land all the same.
    env.worker("--max-retries", "0")
    key = "_kombu.binding.celeriac.dlx"
    wait_until(lambda: env.broker_redis.smembers(key), 20, what="dead-letter binding")
    env.broker_redis.delete(key)
    unknown = env.app.send_task("no.such.task", args=[1])
    wait_until(lambda: len(redis_dead_letters(env)) == 1, 30, what="first dead letter")
    # and once more after it is gone again, this time a provider's refusal
    env.broker_redis.delete(key)
    env.fake.script(["status=400;err_msg=refused for good"])
    refused = env.app.send_task("llm.generate", args=["doomed"])
    wait_until(lambda: len(redis_dead_letters(env)) == 2, 30, what="second dead letter")
    by_id = {d["headers"]["id"]: d["headers"] for d in redis_dead_letters(env)}
    assert by_id[unknown.id]["x-celeriac-reason"] == "unregistered task"
    assert by_id[refused.id]["x-celeriac-exception-type"] == "BadRequestError"
    assert "refused for good" in by_id[refused.id]["x-celeriac-exception-message"]
    # the binding is back as kombu writes it, so kombu producers reach the queue
    assert any(m.endswith(b"\x06\x16celeriac.dead") for m in env.broker_redis.smembers(key))
    out = dlq(env, "list", "--json")
    assert out.returncode == 0, out.stderr
    listed = {json.loads(l)["id"]: json.loads(l) for l in out.stdout.strip().splitlines()}
    assert set(listed) == {unknown.id, refused.id}
    assert listed[unknown.id]["reason"] == "unregistered task"
    wait_until(lambda: env.meta(refused.id), 20, what="FAILURE")
    assert env.meta(refused.id)["status"] == "FAILURE"
    assert env.broker_redis.hlen("unacked") == 0


@pytest.mark.brokers("redis")
def test_first_received_is_the_first_attempts_time(env):
    from datetime import datetime
    env.worker(*FAST, "--max-retries", "2")
    env.fake.script(["status=503;err_msg=overloaded"] * 3)
    r = env.app.send_task("llm.generate", args=["three tries"])
    wait_until(lambda: redis_dead_letters(env), 30, what="dead letter")
    h = redis_dead_letters(env)[0]["headers"]
    assert h["id"] == r.id and h["x-celeriac-retries"] == 2
    c = calls(env)
    assert len(c) == 3
    first = datetime.fromisoformat(h["x-celeriac-first-received"]).timestamp()
    failed = datetime.fromisoformat(h["x-celeriac-failed-at"]).timestamp()
    # received before its first call went out, not when the last attempt came
    assert first <= c[0]["t"] + 0.001, (h["x-celeriac-first-received"], c[0]["t"])
    assert first < c[1]["t"] < c[2]["t"] <= failed + 0.001


def test_control_characters_forge_no_log_line_and_no_terminal_output(env):
    # Ids, names and shadows come from whoever can publish: a newline in one
    # must not forge a log line, an escape sequence must not reach a terminal.
    forged = "\n[2000-01-01 00:00:00,000: ERROR/MainProcess] forged \x1b[2J\r"
    w = env.worker()
    bad_id = "evil" + forged + str(uuid.uuid4())
    env.app.send_task("no.such.task" + forged, args=[1], task_id=bad_id)
    shadowed = env.app.send_task("celery.accumulate", args=[2], shadow="shadow" + forged)
    assert shadowed.get(timeout=20) == [2]
    wait_until(lambda: env.services.queue_depth(env.vhost, "celeriac.dead") == 1, 20,
               what="the dead letter")
    w.wait_for("dead-lettered")
    log = w.log()
    assert "forged" in log
    assert "\x1b" not in log and "\r" not in log
    for line in w.lines:
        assert not line.startswith("[2000-01-01"), line
    assert "evil\\n[2000-01-01" in log and "\\x1b[2J\\r" in log
    assert "shadow\\n[2000-01-01" in log
    out = dlq(env, "list")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\r" not in out.stdout
    lines = out.stdout.splitlines()
    assert len(lines) == 2, lines  # the heading and one dead letter
    assert lines[1].startswith("evil\\n[2000-01-01"), lines
    shown = dlq(env, "show", bad_id)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\r" not in shown.stdout


# ----------------------------------------------- consumer_timeout: parking

def park_depth(env):
    return env.services.queue_depth(env.vhost, "celeriac.park.celery") or 0


def test_long_eta_is_parked_not_held(env):
    # Parking itself: where global QoS is denied (RabbitMQ 4.3) delayed
    # delivery would take the eta task before parking could.
    w = env.worker("--park-after", "1", "--delayed-delivery", "off")
    t0 = time.time()
    r = env.app.send_task("llm.generate", args=["parked eta"], countdown=8)
    # The copy stays in the park queue for one park period only (1 s here), which a
    # poll through rabbitmqctl on a busy machine can miss: the worker's word that it
    # parked the delivery is what is waited for.
    w.wait_for(r"parked until closer to its eta", 10)
    # nothing is held unacked meanwhile: once the park copy is confirmed the original
    # is acked, well before the eta comes. Each rabbitmqctl call takes a second or
    # more on a loaded machine, hence an eta far enough off for several polls.
    wait_until(lambda: env.services.queue_depth(env.vhost, "celery") == 0, 5,
               what="the original acked after parking")
    assert time.time() - t0 < 8, "the check must end before the eta, or it proves nothing"
    assert r.get(timeout=25) == env.fake.expected_text("parked eta")
    assert calls(env)[0]["t"] - t0 >= 7.9
    assert len(calls(env)) == 1
    assert "parked until closer to its eta" in w.log()


def test_long_running_task_is_parked_and_runs_once(env):
    w = env.worker("--park-after", "1")
    env.fake.script(["latency_ms=4500;tokens=4"])
    r = env.app.send_task("llm.generate", args=["long call"])
    wait_until(lambda: "delivery parked" in w.log(), 10, what="the delivery parked")
    lease = env.redis.get("celeriac-lease-" + r.id)
    assert lease and lease.decode().startswith("celeriac-")
    assert r.get(timeout=30) == env.fake.expected_text("long call", tokens=4)
    # the copies that come back find SUCCESS and are dropped; one call in all
    wait_until(lambda: park_depth(env) == 0 and
               env.services.queue_depth(env.vhost, "celery") == 0, 20, what="queues empty")
    assert len(calls(env)) == 1
    assert env.redis.get("celeriac-lease-" + r.id) is None


def test_parked_task_runs_again_when_its_worker_dies(env):
    w = env.worker("--park-after", "1")
    env.fake.script(["latency_ms=30000;tokens=4", "tokens=4"])
    r = env.app.send_task("llm.generate", args=["orphan"])
    wait_until(lambda: "delivery parked" in w.log(), 10, what="the delivery parked")
    w.proc.kill()
    w.wait()
    env.worker("--park-after", "1")
    # the lease lapses (3 park periods), the copy runs on the new worker
    assert r.get(timeout=40) == env.fake.expected_text("orphan", tokens=4)
    assert len(calls(env)) == 2


# ------------------------------------- every other fault knob, end to end

@pytest.mark.parametrize("err_body", ["openai", "vllm", "vllm_flat", "ollama_str",
                                      "anthropic", "html", "empty"])
def test_error_body_shapes(env, err_body):
    env.worker(*FAST)
    env.fake.script(["status=400;err_body=%s;err_msg=prompt too long" % err_body])
    r = env.app.send_task("llm.generate", args=["shapes"])
    with pytest.raises(Exception) as ei:
        r.get(timeout=20)
    assert type(ei.value).__name__ == "BadRequestError"
    assert "Error code: 400" in str(ei.value)
    if err_body not in ("html", "empty"):
        assert "prompt too long" in str(ei.value)
    assert len(calls(env)) == 1


def test_retry_after_http_date(env):
    env.worker(*FAST)
    env.fake.script(["status=429;ra_date=2", "tokens=3"])
    r = env.app.send_task("llm.generate", args=["dated"])
    assert r.get(timeout=20)
    c = calls(env)
    # an HTTP date has one-second resolution: 1 to 3 s, never the 0.2 s backoff
    assert 1.0 <= c[1]["t"] - c[0]["t"] < 3.5


@pytest.mark.parametrize("scenario,calls_expected", [
    ("cut_after_tokens=2;cut_mode=close_delimited", 2),
    ("stall_after_tokens=2;stall_pings=1;ping_ms=100", 2),   # pings are not progress
    ("content_type=text/html", 1),                            # a stream by its bytes
    ("line_bytes=200000", 1),                                 # a 200 KB line is fine
    ("tool_calls=1", 1),
    ("reasoning_field=reasoning_content;reasoning_tokens=3", 1),
    ("prompt_truncate_to=1", 1),
    ("usage=continuous", 1),
    ("header_delay_ms=300;ttft_ms=300;tps=50;jitter=20", 1),
])
def test_other_knobs(env, scenario, calls_expected):
    env.worker(*FAST, "--llm-idle-timeout", "0.6")
    env.fake.script([scenario + ";tokens=6", "tokens=6"])
    r = env.app.send_task("llm.generate", args=["knob"])
    assert r.get(timeout=30) == env.fake.expected_text("knob", tokens=6)
    assert len(calls(env)) == calls_expected


def test_server_rate_limit_is_retried(env):
    env.worker(*FAST, "--max-retries", "10", "-c", "10")
    env.fake._req("POST", "/__config", {"rpm": 3})
    try:
        rs = [env.app.send_task("llm.generate", args=["rl %d" % i]) for i in range(5)]
        # 3 per (scaled) minute: the rest get 429 + Retry-After and come back.
        # Which 3 get through is whichever 3 reach the server first: the 5
        # run side by side, so that need not be the first 3 published.
        def through():
            done = [r for r in rs if r.ready()]
            return done if len(done) >= 3 else None

        for r in wait_until(through, 20, what="3 calls through the limit"):
            assert r.get(timeout=1)
        assert any(e["status"] == 429 for e in calls(env))
    finally:
        env.fake._req("POST", "/__config", {"rpm": 0})


def test_held_eta_tasks_survive_a_crash(env):
    w = env.worker()
    t0 = time.time()
    rs = [env.app.send_task("llm.generate", args=["eta crash %d" % i], countdown=3)
          for i in range(5)]
    wait_until(lambda: w.count("received") >= 5, 10, what="eta tasks held")
    w.proc.kill()
    w.wait()
    env.worker()
    for i, r in enumerate(rs):
        assert r.get(timeout=20) == env.fake.expected_text("eta crash %d" % i)
    assert min(e["t"] for e in calls(env)) - t0 >= 2.9
    assert len(calls(env)) == 5


# ----------------------------------------------------------- batched acks

def _celery_counts(env):
    out = env.services.ctl("list_queues", "-p", env.vhost, "name", "messages_ready",
                           "messages_unacknowledged").stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "celery":
            return int(parts[1]), int(parts[2])
    return None


def test_batched_acks_none_lost_early_or_twice(env):
    """Acks go out batched: one basic.ack multiple=1 per loop iteration up to
    the lowest delivery still held, single acks above it. Tasks finish out of
    order here and eta tasks with the lowest delivery tags stay held across
    hundreds of later ones. No ack may be lost (unacked while the worker is up),
    cover a held delivery (multiple=1 too far), or go twice (RabbitMQ closes the
    channel: 406 unknown delivery tag)."""
    n = 400
    # The eta tasks are held here, unacked (where global QoS is denied delayed
    # delivery would take them and ack them at once).
    w = env.worker("-c", "50", "--loglevel", "warning", "--delayed-delivery", "off")
    env.fake.script(["latency_ms=%d;tokens=2" % ((i * 37) % 250) for i in range(n + 3)])
    held = [env.app.send_task("llm.generate", args=["ack held %d" % i], countdown=15)
            for i in range(3)]
    rs = [env.app.send_task("llm.generate", args=["ack %d" % i]) for i in range(n)]
    for i, r in enumerate(rs):
        assert r.get(timeout=60) == env.fake.expected_text("ack %d" % i, tokens=2)
    assert all(env.meta(r.id) is None for r in held)  # still waiting for their eta
    # exactly the held ones are unacked: the rest were all acked, none of these
    assert wait_until(lambda: _celery_counts(env) == (0, 3), 10,
                      what="only the held deliveries unacked: %r" % (_celery_counts(env),))
    for r in held:
        assert r.get(timeout=30)
    assert wait_until(lambda: _celery_counts(env) == (0, 0), 10, what="all acked")
    log = w.log()
    assert "channel closed" not in log and "connection to broker lost" not in log, log
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    assert env.services.queue_depth(env.vhost, "celery") == 0
