"""Issue 18: what real OpenAI-compatible servers and gateways do to a stream --
missing or wrong Content-Type, errors sent inside the stream, surrogate pairs
cut in two, no usage chunk, empty choices, keep-alive comments -- end to end
through a Celery client, counting the calls the fake LLM got."""
import time

import pytest

FAST = ["--retry-backoff", "0.2", "--retry-backoff-factor", "2", "--retry-jitter", "false"]


def calls(env):
    return [e for e in env.fake.stats() if e["path"].startswith("/v1/")]


def chat(env, prompt="quirk", **kw):
    msgs = [{"role": "user", "content": prompt}]
    return env.app.send_task("llm.chat", args=[msgs], kwargs=kw)


def failure(result, timeout=30):
    with pytest.raises(Exception) as ei:
        result.get(timeout=timeout)
    return ei.value


# ------------------------------------------------------------ stream labels

@pytest.mark.parametrize("ctype", ["none", "text/plain%3B%20charset=utf-8",
                                   "application/json", "application/octet-stream"])
def test_stream_recognised_whatever_its_content_type(env, ctype):
    env.worker(*FAST)
    env.fake.script(["content_type=%s;tokens=6" % ctype])
    out = chat(env, "labels").get(timeout=20)
    assert out["content"] == env.fake.expected_text("labels", tokens=6)
    assert out["finish_reason"] == "stop"
    c = calls(env)
    assert len(c) == 1 and c[0]["status"] == 200
    if ctype == "none":
        assert c[0]["ended"] == "complete"


def test_json_answer_to_a_stream_request(env):
    """A server that ignores "stream": one chat.completion document."""
    env.worker(*FAST)
    env.fake.script(["stream_reply=0;content_type=text/event-stream;tokens=5"])
    out = chat(env, "whole").get(timeout=20)
    assert out["content"] == env.fake.expected_text("whole", tokens=5)
    assert out["usage"]["source"] == "provider"
    assert len(calls(env)) == 1


@pytest.mark.parametrize("ctype", ["text/html", "text/event-stream", "none"])
def test_body_neither_stream_nor_response_is_permanent(env, ctype):
    env.worker(*FAST)
    env.fake.script(["stream_reply=0;garbage=0;content_type=%s" % ctype, "tokens=3"])
    e = failure(chat(env, "junk"))
    assert "neither an event stream nor a chat completion" in str(e)
    assert len(calls(env)) == 1


def test_garbage_body_with_a_5xx_status_stays_retryable(env):
    env.worker(*FAST)
    env.fake.script(["status=503;err_body=html", "tokens=3"])
    out = chat(env, "later").get(timeout=30)
    assert out["content"] == env.fake.expected_text("later", tokens=3)
    assert [e["status"] for e in calls(env)] == [503, 200]


# ---------------------------------------------------------- in-stream errors

PERMANENT = [
    ("invalid_api_key", "etype=invalid_request_error;code=invalid_api_key",
     "AuthenticationError"),
    ("insufficient_quota", "etype=insufficient_quota;code=insufficient_quota",
     "RateLimitError"),
    ("bad_request", "etype=invalid_request_error;code=context_length_exceeded",
     "BadRequestError"),
    ("vllm_int_400", "etype=BadRequestError;code=400", "BadRequestError"),
]
RETRYABLE = [
    ("overloaded", "etype=overloaded_error"),
    ("rate_limit", "etype=requests;code=rate_limit_exceeded"),
    ("server_error", "etype=server_error"),
    ("unknown", "etype=weird_thing"),
]


@pytest.mark.parametrize("fmt", ["data_error", "data_error_then_done"])
@pytest.mark.parametrize("name,knobs,exc", PERMANENT, ids=[p[0] for p in PERMANENT])
def test_in_stream_error_permanent(env, fmt, name, knobs, exc):
    env.worker(*FAST)
    env.fake.script(["tokens=6;fail_after_tokens=2;fail_fmt=%s;err_msg=nope %s;%s"
                     % (fmt, name, knobs), "tokens=3"])
    e = failure(chat(env, "perm"))
    assert type(e).__name__ == exc
    assert "nope %s" % name in str(e)
    # the error's type and code are kept in the stored text
    assert "type: " in str(e)
    assert len(calls(env)) == 1


@pytest.mark.parametrize("fmt", ["data_error", "data_error_then_done"])
@pytest.mark.parametrize("name,knobs", RETRYABLE, ids=[r[0] for r in RETRYABLE])
def test_in_stream_error_retryable(env, fmt, name, knobs):
    env.worker(*FAST)
    env.fake.script(["tokens=6;fail_after_tokens=2;fail_fmt=%s;%s" % (fmt, knobs),
                     "tokens=4"])
    out = chat(env, "again").get(timeout=30)
    assert out["content"] == env.fake.expected_text("again", tokens=4)
    c = calls(env)
    assert len(c) == 2 and c[0]["ended"] == "fail_event"


def test_in_stream_rate_limit_honours_retry_after(env):
    env.worker(*FAST)
    env.fake.script(["tokens=6;fail_after_tokens=1;etype=rate_limit_error;ra=2",
                     "tokens=2"])
    out = chat(env, "hint").get(timeout=30)
    assert out["content"] == env.fake.expected_text("hint", tokens=2)
    c = calls(env)
    assert len(c) == 2
    # backoff alone would be 0.2 s
    assert c[1]["t"] - c[0]["t"] >= 1.8


# ---------------------------------------------------------------- text shape

def test_surrogate_pair_split_across_deltas(env):
    env.worker(*FAST)
    prompt = "moon \U0001F600 rocket \U0001F680 clef \U0001D11E"
    env.fake.script(["reply=echo;split_surrogates=1;json_ascii=1"])
    out = chat(env, prompt).get(timeout=20)
    assert out["content"] == "echo: " + prompt
    assert len(calls(env)) == 1


@pytest.mark.parametrize("knobs", ["finish_style=merged", "empty_choices=1",
                                   "ping_ms=10;tps=200", "ping_ms=5;ttft_ms=60",
                                   "empty_choices=1;finish_style=merged;usage=never"])
def test_stream_shapes(env, knobs):
    env.worker(*FAST)
    env.fake.script(["tokens=8;" + knobs])
    out = chat(env, "shape").get(timeout=20)
    assert out["content"] == env.fake.expected_text("shape", tokens=8)
    assert out["finish_reason"] == "stop"
    assert isinstance(out["usage"], dict)
    assert len(calls(env)) == 1


# --------------------------------------------------------------------- usage

def test_usage_from_provider(env):
    env.worker(*FAST)
    env.fake.script(["tokens=7"])
    u = chat(env, "counted").get(timeout=20)["usage"]
    assert u["source"] == "provider" and u["completion_tokens"] == 7
    assert u["total_tokens"] == u["prompt_tokens"] + 7


def test_usage_without_usage_chunk(env):
    env.worker(*FAST)
    env.fake.script(["tokens=7;usage=never"])
    u = chat(env, "uncounted").get(timeout=20)["usage"]
    assert u == {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None,
                 "source": "worker", "completion_chunks": 7, "cost": None}


# ------------------------------------------------------------- extra headers

def test_llm_header_sent_and_never_logged(env):
    w = env.worker(*FAST, "--llm-header", "X-Gateway-Key: gw-secret-123456",
                   "--llm-header", "X-Tags: a, b, c",
                   env={"CELERIAC_LLM_HEADERS": "X-Env-One: one-value\r\nX-Env-Two: 2\n"})
    env.fake.script(["tokens=3"])
    chat(env, "hdr").get(timeout=20)
    env.app.send_task("llm.embed", args=["abc"]).get(timeout=20)
    for e in calls(env):
        h = e["headers"]
        assert h["x-gateway-key"] == "gw-secret-123456"
        assert h["x-tags"] == "a, b, c"
        # the command line replaces the environment's list
        assert "x-env-one" not in h
    assert "gw-secret-123456" not in w.log()


def test_llm_headers_from_environment(env):
    env.worker(*FAST, env={"CELERIAC_LLM_HEADERS": "X-Env-One: one-value\r\nX-Env-Two: 2\n"})
    env.fake.script(["tokens=3"])
    chat(env, "envhdr").get(timeout=20)
    h = calls(env)[-1]["headers"]
    assert h["x-env-one"] == "one-value" and h["x-env-two"] == "2"


def test_header_value_quoted_by_an_error_is_redacted(env):
    env.worker(*FAST, "--llm-header", "X-Gateway-Key: gw-secret-abcdef")
    env.fake.script(["status=401;err_msg=bad key gw-secret-abcdef"])
    e = failure(chat(env, "leak"))
    assert "gw-secret-abcdef" not in str(e)
    assert len(calls(env)) == 1


@pytest.mark.parametrize("bad,why", [("NoColonHere", "Name: value"),
                                     (": empty-name", "empty header name"),
                                     ("Bad Name: v", "invalid --llm-header name"),
                                     ("X-A: one\nX-B: two", "CR or LF"),
                                     ("X-A: one\rtwo", "CR or LF")])
def test_malformed_header_refused_at_start(env, bad, why):
    w = env.worker("--llm-header", bad, start=False)
    w.start(wait_ready=False)
    assert w.wait(timeout=20) != 0
    assert why in w.log()
    assert len(calls(env)) == 0


# -------------------------------------------------------------- error detail

def test_error_and_message_both_kept(env):
    env.worker(*FAST)
    env.fake.script(["status=403;err_body=error_message;etype=Forbidden;"
                     "err_msg=key lacks the chat scope"])
    e = failure(chat(env, "detail"))
    assert "Forbidden: key lacks the chat scope" in str(e)
    assert len(calls(env)) == 1


def test_openai_error_keeps_type_and_code(env):
    env.worker(*FAST)
    env.fake.script(["status=401;etype=invalid_request_error;code=invalid_api_key;"
                     "err_msg=Incorrect API key provided"])
    e = failure(chat(env, "typed"))
    s = str(e)
    assert type(e).__name__ == "AuthenticationError"
    assert "Incorrect API key provided" in s
    assert "type: invalid_request_error" in s and "code: invalid_api_key" in s
    assert len(calls(env)) == 1
