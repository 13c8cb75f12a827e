"""fake_providers.py -- the provider-native endpoints of scripts/fake_llm.py.

Not run on its own: fake_llm.py routes these paths here (one hook in Server.api), so
one fake process serves every provider, and every request gets the same stats entry,
scenario selection (X-Fake-Scenario header, "fake/k=v" model, /__script queue,
defaults), call counting and delays as the OpenAI endpoints.  Written from the
providers' public API documentation; stdlib only.

ENDPOINTS
  POST /v1/messages             Anthropic Messages.  Requires x-api-key (401
                                authentication_error) and anthropic-version (400);
                                max_tokens required, messages of user/assistant only
                                (400 invalid_request_error).  "stream": true -> SSE with
                                an "event:" line per event: message_start,
                                content_block_start, ping, content_block_delta
                                (text_delta / input_json_delta), content_block_stop,
                                message_delta (stop_reason, usage.output_tokens),
                                message_stop.  Else one message JSON.
  POST /api/chat                Ollama native chat.  Streams NDJSON unless "stream":
  POST /api/generate            false (Ollama's default is to stream): objects with
                                message.content (generate: response) and done:false,
                                then done:true, done_reason, prompt_eval_count,
                                eval_count.  Tool calls arrive whole in one object.
                                A model named "missing..." -> 404 {"error": ...}.
  POST /api/embed               {"embeddings": [[...]], "prompt_eval_count"}.
  POST /openai/deployments/<d>/chat/completions?api-version=V
  POST /openai/deployments/<d>/embeddings?api-version=V
                                Azure OpenAI: needs the api-key header (401
                                {"error":{"code":"401",...}}) and api-version (404
                                otherwise, as Azure answers), then served by the OpenAI
                                code path (every fake_llm knob applies).

KNOBS (fake_llm's, read the same way)
  tokens, seed, reply, unicode, tps, ttft_ms, latency_ms, header_delay_ms, hold,
  write_bytes / split_utf8 / write_gap_ms (wire splitting), keepalive
  status + err_msg, etype, ra, ra_ms, should_retry: an error response in the
      provider's own body shape (Anthropic {"type":"error","error":{type,message}},
      with the type its status documents: 400 invalid_request_error, 401
      authentication_error, 429 rate_limit_error, 529 overloaded_error, ...;
      Ollama {"error": msg}); err_body overrides the shape
  fail_after_tokens=K   after K tokens an in-stream error: Anthropic "event: error"
      with etype (default overloaded_error); Ollama an {"error": msg} line; the body
      then ends cleanly (no message_stop / done:true)
  cut_after_tokens=K    after K tokens the body ends cleanly with no completion marker
  tool_calls=N, tool_frag_bytes  N tool calls (Anthropic tool_use blocks with
      input_json_delta fragments; Ollama one object with whole calls); call i is named
      "fn_i" with arguments {"i": i, "q": prompt[:32]}; stop_reason tool_use
  max_tokens (Anthropic) / options.num_predict (Ollama) below the token count cut the
      answer there with stop_reason max_tokens / done_reason length.
"""

import asyncio
import json
import math
import re
import time

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                         402: "billing_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large",
                         429: "rate_limit_error", 500: "api_error", 504: "timeout_error",
                         529: "overloaded_error"}

AZURE_RE = re.compile(r"^/openai/deployments/([^/]+)/(chat/completions|embeddings)$")
NATIVE = ("/v1/messages", "/api/chat", "/api/generate", "/api/embed")


def claims(path):
    """True for the paths this module serves."""
    return path in NATIVE or AZURE_RE.match(path) is not None


def jd(o):
    return json.dumps(o, separators=(",", ":"), ensure_ascii=False)


def text_of(content):
    """Text of an Anthropic / OpenAI content value (string or blocks/parts)."""
    if isinstance(content, str):
        return content
    out = []
    if isinstance(content, list):
        for b in content:
            if isinstance(b, dict) and b.get("type") == "text" and \
                    isinstance(b.get("text"), str):
                out.append(b["text"])
    return "".join(out)


async def api(fl, srv, conn, req, entry, p):
    """Serves one request.  Returns None when answered, or (Azure) the OpenAI path
    fake_llm should go on serving it as."""
    m = AZURE_RE.match(p)
    if m:
        return await azure(fl, srv, conn, req, entry, m)
    await conn.read_body(req)
    entry["body_bytes"] = len(req.body)
    if req.method != "POST":
        entry["status"] = 405
        entry["bytes_sent"] = await conn.simple(405, {"error": "method not allowed"})
        return None
    try:
        body = json.loads(req.body)
        if not isinstance(body, dict):
            raise ValueError("body is not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise fl.BadRequest(400, "fake_providers: bad JSON body: %s" % e)
    entry["body"] = body
    model = body.get("model") if isinstance(body.get("model"), str) else ""
    entry["model"] = model
    hraw = req.headers.get("x-fake-scenario", "").strip()
    try:
        header_sc = fl.parse_scenario(hraw) if hraw else None
        sc, src, raw = srv.choose(req, model, header_sc)
    except ValueError as e:
        raise fl.BadRequest(400, "scenario: %s" % e, "fake_llm_bad_scenario")
    K = dict(srv.defaults)
    K.update(sc)
    entry["scenario"] = raw
    entry["scenario_src"] = src
    entry["knobs"] = {k: v for k, v in K.items() if fl.BUILTIN[k] != v}
    if p == "/v1/messages":
        return await anthropic(fl, srv, conn, req, entry, K, sc, body)
    return await ollama(fl, srv, conn, req, entry, K, sc, body, p)


async def wait_start(srv, K, sc, src):
    delay = K["latency_ms"] + K["header_delay_ms"]
    if src in ("model", "script"):
        delay += sc.get("accept_delay_ms", 0)
    if delay > 0:
        await asyncio.sleep(srv.ms(delay))
    await srv.hold(K)


async def error(srv, conn, entry, K, sc, shape):
    K = dict(K)
    if "err_body" not in sc:
        K["err_body"] = shape
    # A provider's 429 says when to come back.
    if K["status"] == 429 and not K["ra"] and not K["ra_ms"] and K["ra_date"] < 0:
        K["ra"] = "1"
    await srv.error(conn, entry, K, K["status"])


async def simple_error(conn, entry, status, obj, headers=()):
    entry["status"] = status
    entry["ended"] = "complete"
    entry["bytes_sent"] = await conn.simple(status, obj, headers=[
        ("X-Request-Id", "req_fake_%d" % entry["seq"])] + list(headers))


def prepare(fl, entry, K, prompt, alltext, limit):
    toks = list(fl.gen_tokens(prompt, K["reply"], K["tokens"], K["seed"], K["unicode"]))
    cut = isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < len(toks)
    if cut:
        toks = toks[:limit]
    entry["prompt"] = prompt
    entry["tokens"] = list(toks)
    entry["text"] = "".join(toks)
    ptoks = max(1, math.ceil(len(alltext.encode("utf-8", "surrogatepass")) / 4))
    return toks, ptoks, cut


class Pacer:
    """ttft before the first token, then 1/tps between tokens (scaled)."""

    def __init__(self, srv, K):
        self.srv = srv
        self.ttft = srv.ms(K["ttft_ms"])
        self.gap = srv.ms(1000.0 / K["tps"]) if K["tps"] > 0 else 0.0
        self.first = True

    async def before_token(self, r):
        await r.flush()
        d = self.ttft if self.first else self.gap
        self.first = False
        if d > 0:
            await asyncio.sleep(d)


def sse(name, obj):
    return ("event: %s\ndata: %s\n\n" % (name, jd(obj))).encode()


# ---------------------------------------------------------------- Anthropic --------
async def anthropic(fl, srv, conn, req, entry, K, sc, body):
    h = req.headers
    if not h.get("x-api-key") and not h.get("authorization"):
        return await simple_error(conn, entry, 401, {
            "type": "error", "error": {"type": "authentication_error",
                                       "message": "x-api-key header is required"}})
    if not h.get("anthropic-version"):
        return await simple_error(conn, entry, 400, {
            "type": "error", "error": {"type": "invalid_request_error",
                                       "message": "anthropic-version header is required"}})
    msgs = body.get("messages")
    mt = body.get("max_tokens")
    bad = None
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        bad = "max_tokens: Field required"
    elif not isinstance(msgs, list) or not msgs:
        bad = "messages: at least one message is required"
    elif any(not isinstance(x, dict) or x.get("role") not in ("user", "assistant")
             for x in msgs):
        bad = "messages: roles must be 'user' or 'assistant' (system goes in 'system')"
    if bad:
        return await simple_error(conn, entry, 400, {
            "type": "error", "error": {"type": "invalid_request_error", "message": bad}})
    prompt = ""
    for x in msgs:
        if x.get("role") == "user":
            t = text_of(x.get("content"))
            if t:
                prompt = t
    system = body.get("system")
    alltext = (text_of(system) if system else "") + \
        "".join(text_of(x.get("content")) for x in msgs)
    stream = body.get("stream") is True
    entry["stream"] = stream
    toks, ptoks, cut = prepare(fl, entry, K, prompt, alltext, mt)
    await wait_start(srv, K, sc, entry["scenario_src"])
    if not K["keepalive"]:
        conn.keep = False
    if K["status"] >= 400:
        if "etype" not in sc and K["status"] in ANTHROPIC_ERROR_TYPES:
            K = dict(K)
            K["etype"] = ANTHROPIC_ERROR_TYPES[K["status"]]
        return await error(srv, conn, entry, K, sc, "anthropic")
    ntools = max(0, K["tool_calls"])
    stop = "max_tokens" if cut else ("tool_use" if ntools else "end_turn")
    msg_id = "msg_fake_%d" % entry["seq"]
    if not stream:
        content = [{"type": "text", "text": "".join(toks)}]
        for i in range(ntools):
            content.append({"type": "tool_use", "id": "toolu_fake_%d" % i,
                            "name": "fn_%d" % i, "input": json.loads(fl.tool_args(i, prompt))})
        obj = {"id": msg_id, "type": "message", "role": "assistant", "model": entry["model"],
               "content": content, "stop_reason": stop, "stop_sequence": None,
               "usage": {"input_tokens": ptoks, "cache_creation_input_tokens": 0,
                         "cache_read_input_tokens": 0, "output_tokens": len(toks)}}
        if K["ttft_ms"] > 0:
            await asyncio.sleep(srv.ms(K["ttft_ms"]))
        payload = jd(obj).encode()
        r = fl.Resp(conn, entry, K, False)
        r.start(200, [("Content-Type", "application/json"),
                      ("request-id", "req_fake_%d" % entry["seq"])], len(payload))
        r.emit(payload)
        await r.flush()
        entry["tokens_sent"] = len(toks)
        entry["text_sent"] = "".join(toks)
        return None
    r = fl.Resp(conn, entry, K, True)
    r.start(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                  ("request-id", "req_fake_%d" % entry["seq"])])
    r.emit(sse("message_start", {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": entry["model"],
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": ptoks, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 1}}}))
    r.emit(sse("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}))
    r.emit(sse("ping", {"type": "ping"}))
    pace = Pacer(srv, K)
    sent = []
    fail_k, cut_k = K["fail_after_tokens"], K["cut_after_tokens"]
    for i, t in enumerate(toks + [None]):
        if fail_k >= 0 and i >= min(fail_k, len(toks)):
            r.emit(sse("error", {"type": "error", "error": {
                "type": K["etype"] or "overloaded_error",
                "message": K["err_msg"] or "Overloaded"}}))
            entry["ended"] = "fail_event"
            break
        if cut_k >= 0 and i >= min(cut_k, len(toks)):
            entry["ended"] = "cut_fin_clean"
            break
        if t is None:
            break
        await pace.before_token(r)
        if entry["t_first_token"] is None:
            entry["t_first_token"] = time.time()
        r.emit(sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": t}}))
        sent.append(t)
        entry["tokens_sent"] = len(sent)
        entry["text_sent"] = "".join(sent)
    if entry["ended"] == "in_progress":
        r.emit(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        frag = max(1, K["tool_frag_bytes"])
        for i in range(ntools):
            idx = i + 1
            r.emit(sse("content_block_start", {
                "type": "content_block_start", "index": idx,
                "content_block": {"type": "tool_use", "id": "toolu_fake_%d" % i,
                                  "name": "fn_%d" % i, "input": {}}}))
            args = fl.tool_args(i, prompt)
            parts = [""] + [args[j:j + frag] for j in range(0, len(args), frag)]
            for part in parts:
                r.emit(sse("content_block_delta", {
                    "type": "content_block_delta", "index": idx,
                    "delta": {"type": "input_json_delta", "partial_json": part}}))
            r.emit(sse("content_block_stop", {"type": "content_block_stop", "index": idx}))
        r.emit(sse("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": len(toks)}}))
        r.emit(sse("message_stop", {"type": "message_stop"}))
    await r.finish()
    return None


# ------------------------------------------------------------------- Ollama --------
async def ollama(fl, srv, conn, req, entry, K, sc, body, p):
    model = entry["model"]
    if not model:
        return await simple_error(conn, entry, 400, {"error": "model is required"})
    if model.startswith("missing"):
        return await simple_error(conn, entry, 404, {
            "error": "model \"%s\" not found, try pulling it first" % model})
    if p == "/api/embed":
        return await ollama_embed(fl, srv, conn, entry, K, sc, body)
    chat = p == "/api/chat"
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list):
            return await simple_error(conn, entry, 400, {"error": "messages are required"})
        prompt = ""
        for x in msgs:
            if isinstance(x, dict) and x.get("role") == "user" and \
                    isinstance(x.get("content"), str):
                prompt = x["content"]
        alltext = "".join(x.get("content") for x in msgs
                          if isinstance(x, dict) and isinstance(x.get("content"), str))
    else:
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else ""
        alltext = prompt + (body.get("system") or "")
    opts = body.get("options") if isinstance(body.get("options"), dict) else {}
    # Ollama streams unless told not to.
    stream = body.get("stream") is not False
    entry["stream"] = stream
    toks, ptoks, cut = prepare(fl, entry, K, prompt, alltext, opts.get("num_predict"))
    await wait_start(srv, K, sc, entry["scenario_src"])
    if not K["keepalive"]:
        conn.keep = False
    if K["status"] >= 400:
        return await error(srv, conn, entry, K, sc, "ollama_str")
    created = "2026-01-01T00:00:00.000000Z"
    ntools = max(0, K["tool_calls"]) if chat else 0
    calls = [{"function": {"name": "fn_%d" % i,
                           "arguments": json.loads(fl.tool_args(i, prompt))}}
             for i in range(ntools)]

    def obj(text, done, **extra):
        o = {"model": model, "created_at": created}
        if chat:
            o["message"] = {"role": "assistant", "content": text}
        else:
            o["response"] = text
        o["done"] = done
        o.update(extra)
        return o

    final = dict(done_reason="length" if cut else "stop", total_duration=1000000,
                 load_duration=1000, prompt_eval_count=ptoks, prompt_eval_duration=1000,
                 eval_count=len(toks), eval_duration=1000)
    if not stream:
        if K["ttft_ms"] > 0:
            await asyncio.sleep(srv.ms(K["ttft_ms"]))
        o = obj("".join(toks), True, **final)
        if calls:
            o["message"]["tool_calls"] = calls
        payload = jd(o).encode()
        r = fl.Resp(conn, entry, K, False)
        r.start(200, [("Content-Type", "application/json; charset=utf-8")], len(payload))
        r.emit(payload)
        await r.flush()
        entry["tokens_sent"] = len(toks)
        entry["text_sent"] = "".join(toks)
        return None
    r = fl.Resp(conn, entry, K, True)
    r.start(200, [("Content-Type", "application/x-ndjson")])
    pace = Pacer(srv, K)
    sent = []
    fail_k, cut_k = K["fail_after_tokens"], K["cut_after_tokens"]
    for i, t in enumerate(toks + [None]):
        if fail_k >= 0 and i >= min(fail_k, len(toks)):
            r.emit((jd({"error": K["err_msg"] or "fake_providers: simulated failure"}) +
                    "\n").encode())
            entry["ended"] = "fail_event"
            break
        if cut_k >= 0 and i >= min(cut_k, len(toks)):
            entry["ended"] = "cut_fin_clean"
            break
        if t is None:
            break
        await pace.before_token(r)
        if entry["t_first_token"] is None:
            entry["t_first_token"] = time.time()
        r.emit((jd(obj(t, False)) + "\n").encode())
        sent.append(t)
        entry["tokens_sent"] = len(sent)
        entry["text_sent"] = "".join(sent)
    if entry["ended"] == "in_progress":
        if calls:
            o = obj("", False)
            o["message"]["tool_calls"] = calls
            r.emit((jd(o) + "\n").encode())
        r.emit((jd(obj("", True, **final)) + "\n").encode())
    await r.finish()
    return None


async def ollama_embed(fl, srv, conn, entry, K, sc, body):
    inp = body.get("input")
    items = [inp] if isinstance(inp, str) else inp
    if not isinstance(items, list) or not items or \
            not all(isinstance(x, str) for x in items):
        return await simple_error(conn, entry, 400, {
            "error": "input must be a string or a list of strings"})
    dim = body.get("dimensions") or K["dim"]
    if not isinstance(dim, int) or dim <= 0 or dim > 65536:
        return await simple_error(conn, entry, 400, {"error": "bad dimensions"})
    entry["prompt"] = items[0]
    await wait_start(srv, K, sc, entry["scenario_src"])
    if K["status"] >= 400:
        return await error(srv, conn, entry, K, sc, "ollama_str")
    vecs = [fl.embed_vec(t, dim)[0] for t in items]
    ptok = sum(max(1, math.ceil(len(t.encode("utf-8", "surrogatepass")) / 4)) for t in items)
    payload = jd({"model": entry["model"], "embeddings": vecs, "total_duration": 1000,
                  "load_duration": 10, "prompt_eval_count": ptok}).encode()
    r = fl.Resp(conn, entry, K, False)
    r.start(200, [("Content-Type", "application/json; charset=utf-8")], len(payload))
    r.emit(payload)
    await r.flush()
    return None


# -------------------------------------------------------------------- Azure --------
async def azure(fl, srv, conn, req, entry, m):
    q = dict(kv.split("=", 1) for kv in req.query.split("&") if "=" in kv)
    if not q.get("api-version"):
        await conn.read_body(req)
        return await simple_error(conn, entry, 404, {"error": {
            "code": "404", "message": "Resource not found"}})
    if not req.headers.get("api-key") and not req.headers.get("authorization"):
        await conn.read_body(req)
        return await simple_error(conn, entry, 401, {"error": {
            "code": "401", "message": "Access denied due to invalid subscription key or "
                                      "wrong API endpoint. Make sure to provide a valid "
                                      "key for an active subscription and use a correct "
                                      "regional API endpoint for your resource."}})
    entry["deployment"] = m.group(1)
    return "/v1/chat/completions" if m.group(2) == "chat/completions" else "/v1/embeddings"
