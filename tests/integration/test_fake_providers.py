"""The fake's provider-native modes (scripts/fake_providers.py, routed by fake_llm.py):
Anthropic /v1/messages, Ollama /api/chat, /api/generate, /api/embed and Azure
deployments, streamed and not, their error shapes, in-stream errors, and that each
call is counted once in /__stats as the OpenAI endpoints are.  Needs no broker."""

import http.client
import json

import pytest

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-fake", "anthropic-version": "2023-06-01"}


def post(fake, path, body, headers=None, scenario=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if scenario:
        h["X-Fake-Scenario"] = scenario
    c = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=30)
    try:
        c.request("POST", path, json.dumps(body), h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def sse_events(raw):
    """(event, data) pairs of a text/event-stream body (LF line ends)."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        out.append((ev, json.loads("\n".join(data))))
    return out


def claude(prompt="hello claude", stream=True, max_tokens=64, **extra):
    b = {"model": "claude-fake", "max_tokens": max_tokens, "stream": stream,
         "system": "be brief", "messages": [{"role": "user", "content": prompt}]}
    b.update(extra)
    return b


# ---------------------------------------------------------------- Anthropic --------
def test_anthropic_stream(fake_llm):
    st, h, raw = post(fake_llm, "/v1/messages", claude(), ANTHROPIC_HEADERS, "tokens=5")
    assert st == 200 and h["content-type"] == "text/event-stream"
    assert h["request-id"].startswith("req_fake_")
    evs = sse_events(raw)
    names = [e for e, _ in evs]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(e == d["type"] for e, d in evs)
    text = "".join(d["delta"]["text"] for e, d in evs if e == "content_block_delta")
    assert text == fake_llm.expected_text("hello claude", 5)
    start = evs[0][1]["message"]
    assert start["model"] == "claude-fake" and start["usage"]["input_tokens"] >= 1
    delta = evs[-2][1]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["output_tokens"] == 5
    [e] = fake_llm.stats()
    assert e["path"] == "/v1/messages" and e["stream"] and e["tokens_sent"] == 5
    assert e["ended"] == "complete" and e["headers"]["x-api-key"] == "sk-ant-fake"


def test_anthropic_whole_and_max_tokens(fake_llm):
    st, _, raw = post(fake_llm, "/v1/messages", claude(stream=False, max_tokens=3),
                      ANTHROPIC_HEADERS, "tokens=8")
    m = json.loads(raw)
    assert st == 200 and m["type"] == "message" and m["role"] == "assistant"
    assert m["stop_reason"] == "max_tokens"
    first3 = "".join(fake_llm.expected("hello claude", 8)["tokens"][:3])
    assert m["content"] == [{"type": "text", "text": first3}]
    assert m["usage"]["output_tokens"] == 3


def test_anthropic_tools(fake_llm):
    st, _, raw = post(fake_llm, "/v1/messages", claude(prompt="weather?"),
                      ANTHROPIC_HEADERS, "tokens=2,tool_calls=2,tool_frag_bytes=5")
    evs = sse_events(raw)
    starts = [d["content_block"] for e, d in evs if e == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use", "tool_use"]
    for i in (0, 1):
        frags = [d["delta"]["partial_json"] for e, d in evs
                 if e == "content_block_delta" and d["index"] == i + 1]
        assert frags[0] == "" and len(frags) > 2
        assert json.loads("".join(frags)) == {"i": i, "q": "weather?"}
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("status,etype", [(400, "invalid_request_error"),
                                          (401, "authentication_error"),
                                          (429, "rate_limit_error"),
                                          (500, "api_error"),
                                          (529, "overloaded_error")])
def test_anthropic_error_status(fake_llm, status, etype):
    st, h, raw = post(fake_llm, "/v1/messages", claude(), ANTHROPIC_HEADERS,
                      "status=%d" % status)
    body = json.loads(raw)
    assert st == status and body["type"] == "error"
    assert body["error"]["type"] == etype
    if status == 429:
        assert h["retry-after"] == "1"
    assert len(fake_llm.stats()) == 1


def test_anthropic_request_checks(fake_llm):
    st, _, raw = post(fake_llm, "/v1/messages", claude(), {"anthropic-version": "2023-06-01"})
    assert st == 401 and json.loads(raw)["error"]["type"] == "authentication_error"
    st, _, _ = post(fake_llm, "/v1/messages", claude(), {"x-api-key": "k"})
    assert st == 400
    b = claude()
    del b["max_tokens"]
    st, _, raw = post(fake_llm, "/v1/messages", b, ANTHROPIC_HEADERS)
    assert st == 400 and "max_tokens" in json.loads(raw)["error"]["message"]
    b = claude(messages=[{"role": "system", "content": "x"},
                         {"role": "user", "content": "y"}])
    st, _, _ = post(fake_llm, "/v1/messages", b, ANTHROPIC_HEADERS)
    assert st == 400
    assert [e["status"] for e in fake_llm.stats()] == [401, 400, 400, 400]


def test_anthropic_in_stream_error(fake_llm):
    st, _, raw = post(fake_llm, "/v1/messages", claude(), ANTHROPIC_HEADERS,
                      "tokens=6,fail_after_tokens=2,etype=rate_limit_error,err_msg=slow")
    evs = sse_events(raw)
    assert st == 200 and evs[-1] == ("error", {"type": "error", "error": {
        "type": "rate_limit_error", "message": "slow"}})
    assert "message_stop" not in [e for e, _ in evs]
    [e] = fake_llm.stats()
    assert e["ended"] == "fail_event" and e["tokens_sent"] == 2


def test_anthropic_script_counts_calls(fake_llm):
    """A scripted overload twice, then success: three calls, counted."""
    fake_llm.script(["status=529", "status=529"], model="claude-fake")
    got = [post(fake_llm, "/v1/messages", claude(stream=False), ANTHROPIC_HEADERS)[0]
           for _ in range(3)]
    assert got == [529, 529, 200]
    assert [e["scenario_src"] for e in fake_llm.stats()] == ["script", "script", "default"]


# ------------------------------------------------------------------- Ollama --------
def ndjson(raw):
    return [json.loads(line) for line in raw.decode().split("\n") if line.strip()]


def test_ollama_chat_stream(fake_llm):
    st, h, raw = post(fake_llm, "/api/chat", {"model": "llama3", "messages": [
        {"role": "user", "content": "hi ollama"}]}, scenario="tokens=4")
    assert st == 200 and h["content-type"] == "application/x-ndjson"
    objs = ndjson(raw)
    assert [o["done"] for o in objs] == [False] * 4 + [True]
    assert "".join(o["message"]["content"] for o in objs) == \
        fake_llm.expected_text("hi ollama", 4)
    last = objs[-1]
    assert last["done_reason"] == "stop" and last["eval_count"] == 4
    assert last["prompt_eval_count"] >= 1
    [e] = fake_llm.stats()
    assert e["stream"] and e["path"] == "/api/chat"


def test_ollama_generate_whole_and_length(fake_llm):
    st, _, raw = post(fake_llm, "/api/generate", {
        "model": "llama3", "prompt": "once", "stream": False,
        "options": {"num_predict": 2}}, scenario="tokens=5")
    o = json.loads(raw)
    assert st == 200 and o["done"] and o["done_reason"] == "length"
    assert o["response"] == "".join(fake_llm.expected("once", 5)["tokens"][:2])


def test_ollama_tools_and_errors(fake_llm):
    _, _, raw = post(fake_llm, "/api/chat", {"model": "llama3", "messages": [
        {"role": "user", "content": "q"}]}, scenario="tokens=1,tool_calls=1")
    objs = ndjson(raw)
    calls = [o["message"]["tool_calls"] for o in objs if "tool_calls" in o["message"]]
    assert calls == [[{"function": {"name": "fn_0", "arguments": {"i": 0, "q": "q"}}}]]
    st, _, raw = post(fake_llm, "/api/chat", {"model": "missing-model", "messages": []})
    assert st == 404 and "not found" in json.loads(raw)["error"]
    st, _, raw = post(fake_llm, "/api/chat", {"model": "llama3", "messages": []},
                      scenario="status=503,err_msg=busy")
    assert st == 503 and json.loads(raw) == {"error": "busy"}
    st, _, raw = post(fake_llm, "/api/generate", {"model": "llama3", "prompt": "p"},
                      scenario="tokens=4,fail_after_tokens=1,err_msg=runner died")
    objs = ndjson(raw)
    assert st == 200 and objs[-1] == {"error": "runner died"} and len(objs) == 2
    assert len(fake_llm.stats()) == 4


def test_ollama_embed(fake_llm):
    st, _, raw = post(fake_llm, "/api/embed", {"model": "nomic", "input": ["a", "b"],
                                               "dimensions": 3})
    o = json.loads(raw)
    assert st == 200 and len(o["embeddings"]) == 2 and len(o["embeddings"][0]) == 3
    assert o["prompt_eval_count"] == 2
    st, _, _ = post(fake_llm, "/api/embed", {"model": "nomic", "input": [1]})
    assert st == 400


# -------------------------------------------------------------------- Azure --------
AZ = "/openai/deployments/gpt4o-dep/chat/completions?api-version=2024-10-21"


def test_azure(fake_llm):
    body = {"messages": [{"role": "user", "content": "hi azure"}], "stream": True,
            "stream_options": {"include_usage": True}}
    st, _, raw = post(fake_llm, AZ, body)
    assert st == 401 and json.loads(raw)["error"]["code"] == "401"
    st, _, _ = post(fake_llm, AZ.split("?")[0], body, {"api-key": "az"})
    assert st == 404
    st, h, raw = post(fake_llm, AZ, body, {"api-key": "az"}, "tokens=3")
    assert st == 200 and h["content-type"] == "text/event-stream"
    assert raw.rstrip().endswith(b"data: [DONE]")
    st, _, raw = post(fake_llm, "/openai/deployments/emb/embeddings?api-version=2024-10-21",
                      {"input": "x"}, {"api-key": "az"})
    assert st == 200 and json.loads(raw)["data"][0]["embedding"]
    stats = fake_llm.stats()
    assert [e["status"] for e in stats] == [401, 404, 200, 200]
    assert stats[2]["deployment"] == "gpt4o-dep" and stats[2]["tokens_sent"] == 3
    assert stats[2]["headers"]["api-key"] == "az"
