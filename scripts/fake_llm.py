#!/usr/bin/python3
"""fake_llm.py -- deterministic fake OpenAI-compatible LLM server for celeriac tests.

Stdlib only; run with /usr/bin/python3.  Hand-written HTTP/1.1 on asyncio
streams, so chunk framing, write boundaries and connection teardown are exact.

    /usr/bin/python3 scripts/fake_llm.py [--port 0] [--port-file F] [--time-scale F]
        [--latency-ms N] [--ttft-ms N] [--tokens N] [--tps N] [--defaults 'k=v;k=v']
        [--rpm N] [--tpm N] [--rl-mode window|bucket] [-v]

Prints exactly one line "PORT <n>" on stdout once listening (127.0.0.1 unless --host).

ENDPOINTS
  POST /v1/chat/completions   stream and non-stream (stream_options.include_usage)
  POST /v1/completions        legacy; prompt = string or first element of a list
  POST /v1/embeddings         see EMBEDDINGS
  POST /v1/messages, /api/chat, /api/generate, /api/embed, /openai/deployments/..
                              Anthropic, Ollama native and Azure: scripts/fake_providers.py
  GET  /v1/models, GET /health
  GET  /__stats[?since=SEQ]   JSON list of request entries (see STATS)
  POST /__reset               clears stats, scripts, rate-limit windows, /__config
  POST /__script              {"model": NAME or "*", "scenarios": ["k=v;k=v", ...]}
                              appended FIFO per model; {"replace": true} clears first.
  GET  /__script              the queues
  POST /__config              {"defaults": "k=v;..", "rpm": N, "tpm": N, "rl_mode": M}
                              (runtime defaults; M: window or bucket, see RATE LIMITS)
  GET  /__expected?prompt=P[&tokens=N&seed=S&unicode=0|1&reply=lorem|echo]
                              -> {"text": .., "tokens": [..]}
  POST /__release             {"name": NAME}: lets the requests held by hold=NAME go on
  GET  /__concurrency         {"inflight": N, "peak": N, "held": {NAME: N}}: API requests
                              being served now, and the most at once among those begun
                              since the last /__reset (a call an earlier test left in
                              flight does not count in a later test's peak); a request
                              counts from its headers read to its response's last byte
                              written. "held" counts the requests waiting on each
                              hold name now, so a test can wait for its own call rather
                              than for any call a previous test left behind
  Control paths (/__*) are not recorded in the stats.

SCENARIO SELECTION (first match wins; the winner is merged over the defaults)
  1. request header  X-Fake-Scenario: k=v;k=v
  2. model name      fake/k=v,k=v   (only if it contains at least one k=v)
  3. next /__script entry queued for the exact model name, else for "*" (consumed)
  4. defaults: built-in < CLI flags < --defaults < POST /__config defaults
  Separators ';' and ',' are interchangeable; values are %-decoded (use %3B for ';').
  Unknown knob or bad value -> 400 {"error":{"type":"fake_llm_bad_scenario",..}}.

TEXT RULE (what the completion says)
  prompt P: chat -> content of the LAST message whose role is "user" (a string, or
  the concatenation of the "text" of its {"type":"text"} parts); completions ->
  "prompt" if a string, else its first element (non-strings JSON-encoded compactly).
  reply=echo : text = "echo: " + P[:200] (code points); tokens = re.findall(r"[^ ]+ *", text)
  reply=json : text = json.dumps({"echo": P[:200]}), split into tokens the same way
               (the tokens knob is ignored).
  reply=lorem (default): N = tokens knob, S = seed knob (string, default "0"),
      KS = sha256(utf8(P)+b"\\0"+utf8(S)+b"\\0"+b"0") || sha256(..+b"1") || ...   (digests)
      token_i = W[KS[i] % 64] + " "   for i in 0..N-1,  W = WORDS (UWORDS if unicode=1)
  text = "".join(tokens).  Every stats entry also carries "text" and "tokens".
  Usage: prompt_tokens = max(1, ceil(utf8 bytes of all message text (or prompt) / 4)),
  capped by prompt_truncate_to; completion_tokens = len(tokens) (+ reasoning_tokens when
  reasoning_field is set); total = sum.

STREAM SHAPE (chat):  [bom] role chunk (sent with the headers) -> ttft_ms -> content
  chunks of chunk_tokens tokens spaced chunk_tokens/tps s -> finish chunk -> usage chunk
  -> "data: [DONE]".  reasoning deltas (reasoning_field) and tool-call deltas
  (tool_calls) are extra paced steps before / after the content.  Legacy completions
  have no role chunk.  Non-stream replies wait latency+ttft+generation time, then send.
  The role chunk's delta is {"role":"assistant","content":""} (role_content=empty).

KNOBS (ms values are multiplied by --time-scale; ra/ra_ms/ra_date are sent verbatim)
  latency_ms, header_delay_ms  delay before the response headers (summed)
  accept_delay_ms   header scenario: before reading the body (and before 100-continue);
                    defaults: once per connection before reading its first request;
                    model/script scenario: added to latency
  ttft_ms           after headers, before the first token
  hold=NAME         after the latency, wait until POST /__release {"name": NAME} (not
                    scaled; a released name holds nothing more; /__reset releases all)
  tps               tokens/s after the first (0 = as fast as possible: one write)
  jitter            +/- percent random variation of each inter-chunk gap (seeded)
  tokens, seed, reply(lorem|echo|json), unicode(0|1), json_ascii(0|1: \\uXXXX escapes)
  chunk_tokens      tokens per content chunk (default 1)
  write_bytes       n or "random" (sizes 1..16): split the body into n-byte writes, each
                    its own HTTP chunk (raw writes when not chunked); write_gap_ms
                    sleeps between those writes (default 0: back-to-back send()s)
  split_utf8(0|1)   also split every multi-byte UTF-8 character after its lead byte
  eol               lf | crlf | cr | mixed (cycles lf,crlf,cr per event)
  ping_ms, ping_text  ": <ping_text>" comment + blank line every ping_ms after headers
  event_lines(0|1)  adds "event: message" and "id: N" lines, and one "retry: 3000"
  multiline_data(0|1) splits each chunk's JSON over two data: lines (before "choices")
  bom(0|1)          UTF-8 BOM first;  line_bytes=N pads the first content chunk's
                    "data: " line (non-stream: the body) to N bytes with a top-level
                    "pad" string field
  role_content      empty | null | absent
  finish_style      separate | merged | none;   finish_reason  override (e.g. length)
  usage             auto (honour include_usage) | never | always | continuous
                    (cumulative usage in every chunk + final usage chunk)
  done              yes | no | no_blank_line ("data: [DONE]"+eol) | no_eol
  tool_calls=N, tool_frag_bytes (chars, default 8), tool_whole(0|1)
      call i: id "call_fake_i", name "fn_i", arguments json {"i":i,"q":P[:32]} compact;
      finish_reason becomes "tool_calls"
  reasoning_field   reasoning | reasoning_content; reasoning_tokens (default 4) deltas "think "
  status (alias err) HTTP status; >=400 sends an error body before any streaming
  err_body          openai | vllm | vllm_flat | ollama_str | anthropic | html | empty |
                    error_message ({"error": etype or the status phrase, "message": ..})
  err_msg, etype, code   error message / type / code (e.g. code=insufficient_quota)
  err_quote_key     full | masked: the error message quotes the bearer token the request
                    carried, as "Incorrect API key provided: <key>." (masked: its first 8
                    and last 4 characters with '*' between, as OpenAI quotes it)
  ra=S (retry-after), ra_ms=MS (retry-after-ms), ra_date=S (retry-after: HTTP date now+S),
  should_retry=true|false (x-should-retry),  rl_headers(0|1) x-ratelimit-* headers
  fail_after_tokens=K + fail_fmt: data_error | data_error_then_done | legacy_error_line
  cut_after_tokens=K / cut_after_bytes=B (body payload bytes) + cut_mode:
      fin_raw (default: FIN without the terminating chunk) | fin_clean (terminating
      chunk, connection stays usable) | rst (SO_LINGER 0) | close_delimited
      (response is close-delimited, then clean FIN)
  stall_after_tokens=K, stall_pings(0|1), stall_ms (0 = until the client closes,
      else resume the stream after stall_ms)
  garbage=K         after K tokens send "data: {this is not json" (non-stream: the body)
  content_type      override Content-Type ("none": no Content-Type header at all);
                    prompt_truncate_to=N  caps prompt_tokens
  cached_tokens=N   usage gains prompt_tokens_details.cached_tokens (N, at most the
                    prompt's) and completion_tokens_details.reasoning_tokens
  split_surrogates(0|1) a content chunk holding a character above U+FFFF is sent as
                    two events cut between its UTF-16 surrogates: the first ends with
                    "\\udXXX" (high), the next starts with the low one (\\u escapes)
  stream_reply(0|1) 0: a stream request gets the non-stream JSON reply (a server that
                    ignores "stream"; with garbage=K a non-JSON 200 body)
  empty_choices(0|1) adds chunks with "choices":[] and no usage: one after the role
                    chunk, one after each content chunk
  framing           chunked | close (close-delimited);  keepalive(0|1)
  dim               embedding size when the request has no "dimensions" (default 16)
  Triggers (fail/cut/stall/garbage after K) fire once tokens_sent >= min(K, total):
  K=0 fires right after the role chunk, K>=total right after the last content token.
  Non-stream: stall_after_tokens (any K) = headers then stall; cut_after_tokens = cut
  after half the Content-Length body; garbage = non-JSON body; fail_* is ignored.

HTTP  keep-alive by default; "Connection: close", keepalive=0 and HTTP/1.0 close after
  the response (HTTP/1.0 streams are close-delimited).  Request bodies: Content-Length
  or chunked; "Expect: 100-continue" is answered.  Every API response carries
  X-Request-Id: req_fake_<seq>.  Listen backlog 4096; RLIMIT_NOFILE raised to hard.

RATE LIMITS  --rpm/--tpm or POST /__config: sliding window of 60 s * time-scale over the
  three API endpoints; a request costs prompt_tokens + (max_completion_tokens or
  max_tokens or len(tokens)).  Over the limit -> 429 {"error":{"type":"requests"|"tokens",
  "code":"rate_limit_exceeded"}} with Retry-After (ceil s), retry-after-ms and
  x-ratelimit-{limit,remaining,reset}-{requests,tokens} (Go durations); the scenario
  script is not consumed and scenario_src is "rate_limit".
  rl_mode=bucket (--rl-mode bucket): enforced as a provider quantizes a per-minute limit
  per second instead: a token bucket per limit holding a second's worth (rpm/60 requests,
  tpm/60 tokens, at least 1) refilled continuously at limit/60 per (scaled) second; a
  request needs one request and min(its tokens, the bucket's size) tokens (its full cost
  is taken: the token bucket may go below zero); else the same 429 with the time until
  it fits. There, rl_headers=1 and a 429's x-ratelimit-remaining-* say what is left in
  each bucket (whole units) and x-ratelimit-reset-* the time until it is full again.

EMBEDDINGS  input: string, list of strings, token list, or list of token lists (a token
  list is hashed as its compact JSON text).  Per item text T and dim D:
  KS = sha256(utf8(T)+b"\\0"+b"0") || sha256(utf8(T)+b"\\0"+b"1") || ...;
  v_k = float32(u32le(KS[4k:4k+4]) / 2**31 - 1).  encoding_format "base64" sends the
  little-endian float32 bytes base64-encoded, else the floats.

STATS (GET /__stats returns a bare JSON list, oldest first; one entry per API request)
  seq, t (arrival epoch), t_headers, t_first_token, t_end, conn, conn_req, method,
  path, query, headers (lower-case names), body (parsed JSON or null), body_bytes,
  model, prompt, stream, scenario (raw string), scenario_src (header|model|script|
  default|rate_limit), knobs (non-built-in-default knob values), status, bytes_sent
  (wire bytes incl. headers and framing), tokens_sent, text, tokens, text_sent,
  ended: in_progress | complete | fail_event | cut_fin_clean | cut_fin_raw | cut_rst |
  cut_close | stalled | stall_client_closed | client_closed | bad_request | server_error
  (client_closed: the peer closed or reset before the response was complete; a peer
  EOF seen before a write counts, so half-closing clients are not supported)
"""

import argparse
import asyncio
import base64
import email.utils
import hashlib
import http
import json
import math
import os
import random
import re
import resource
import signal
import socket
import struct
import sys
import time
import urllib.parse
from collections import deque
from functools import lru_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_providers  # noqa: E402

WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud "
    "exercitation ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure "
    "in reprehenderit voluptate velit esse cillum fugiat nulla pariatur excepteur sint "
    "occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est "
    "laborum vitae porta"
).split()
UWORDS = (
    "héllo 日本 😀 naïve café Ωmega жук 中文字 €uro ß 🚀 señor größe Ελλάδα привет 東京 "
    "👍🏽 Åsa über ça ñandú 한국어 עברית العربية ไทย हिन्दी µs → ✓ ★ ♞ 𝄞 🧪 🐍 🎉 Zürich "
    "Dvořák Łódź smørrebrød façade coöperate résumé jalapeño piñata São e\u0301te "
    "👩\u200d💻 plain ascii ☃ ½ ∑ ∞ ✈️ 🇳🇴 Ünïcödé ǅ ﬁne 𐍈 ʕ•ᴥ•ʔ 你好 こんにちは ẞig ğ"
).split()
assert len(WORDS) == 64, len(WORDS)
assert len(UWORDS) == 64, len(UWORDS)

CHOICE = "choice"
KNOBS = {
    # name: (type, default)
    "latency_ms": (float, 0.0), "header_delay_ms": (float, 0.0),
    "accept_delay_ms": (float, 0.0), "ttft_ms": (float, 0.0), "tps": (float, 0.0),
    "jitter": (float, 0.0), "tokens": (int, 16), "seed": (str, "0"),
    "reply": (("lorem", "echo", "json"), "lorem"), "unicode": (bool, 0), "json_ascii": (bool, 0),
    "chunk_tokens": (int, 1), "write_bytes": ("wb", "0"), "write_gap_ms": (float, 0.0),
    "split_utf8": (bool, 0), "eol": (("lf", "crlf", "cr", "mixed"), "lf"),
    "ping_ms": (float, 0.0), "ping_text": (str, "ping"), "event_lines": (bool, 0),
    "multiline_data": (bool, 0), "bom": (bool, 0), "line_bytes": (int, 0),
    "role_content": (("empty", "null", "absent"), "empty"),
    "finish_style": (("separate", "merged", "none"), "separate"),
    "finish_reason": (str, ""),
    "usage": (("auto", "never", "always", "continuous"), "auto"),
    "done": (("yes", "no", "no_blank_line", "no_eol"), "yes"),
    "tool_calls": (int, 0), "tool_frag_bytes": (int, 8), "tool_whole": (bool, 0),
    "reasoning_field": (("", "reasoning", "reasoning_content"), ""),
    "reasoning_tokens": (int, 4), "cached_tokens": (int, -1),
    "status": (int, 200),
    "err_body": (("openai", "vllm", "vllm_flat", "ollama_str", "anthropic", "html",
                  "empty", "error_message"), "openai"),
    "err_msg": (str, ""), "etype": (str, ""), "code": (str, ""),
    "err_quote_key": (("", "full", "masked"), ""),
    "ra": (str, ""), "ra_ms": (str, ""), "ra_date": (float, -1.0),
    "should_retry": (("", "true", "false"), ""), "rl_headers": (bool, 0),
    "fail_after_tokens": (int, -1),
    "fail_fmt": (("data_error", "data_error_then_done", "legacy_error_line"), "data_error"),
    "cut_after_tokens": (int, -1), "cut_after_bytes": (int, -1),
    "cut_mode": (("fin_raw", "fin_clean", "rst", "close_delimited"), "fin_raw"),
    "stall_after_tokens": (int, -1), "stall_pings": (bool, 0), "stall_ms": (float, 0.0),
    "garbage": (int, -1), "content_type": (str, ""), "prompt_truncate_to": (int, -1),
    "framing": (("chunked", "close"), "chunked"), "keepalive": (bool, 1),
    "dim": (int, 16), "hold": (str, ""),
    "split_surrogates": (bool, 0), "empty_choices": (bool, 0), "stream_reply": (bool, 1),
}
ALIASES = {"err": "status", "latency": "latency_ms", "ttft": "ttft_ms"}
BUILTIN = {k: v[1] for k, v in KNOBS.items()}

VERBOSE = False


def log(*a):
    if VERBOSE:
        print("fake_llm:", *a, file=sys.stderr, flush=True)


def conv_knob(k, v):
    typ = KNOBS[k][0]
    if typ is float:
        x = float(v)
        if not math.isfinite(x):
            raise ValueError("not finite")
        return x
    if typ is int:
        return int(v)
    if typ is bool:
        lv = v.lower()
        if lv in ("1", "true", "yes", "on"):
            return 1
        if lv in ("0", "false", "no", "off"):
            return 0
        raise ValueError("want 0/1")
    if typ == "wb":
        if v == "random":
            return v
        if int(v) < 0:
            raise ValueError("negative")
        return str(int(v))
    if isinstance(typ, tuple):
        if v in ('""', "''"):
            v = "" if "" in typ else "empty"
        if v not in typ:
            raise ValueError("want one of " + "|".join(typ))
        return v
    return v


def parse_scenario(s, lenient=False):
    """'k=v;k=v' -> dict of converted knobs.  lenient: skip parts without '='."""
    out = {}
    for part in re.split(r"[;,]", s or ""):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            if lenient:
                continue
            raise ValueError("bad scenario part %r (want key=val)" % part)
        k, v = part.split("=", 1)
        k = k.strip().lower()
        k = ALIASES.get(k, k)
        if k not in KNOBS:
            raise ValueError("unknown knob %r" % k)
        try:
            out[k] = conv_knob(k, urllib.parse.unquote(v.strip()))
        except ValueError as e:
            raise ValueError("bad value for %s: %r (%s)" % (k, v, e)) from None
    return out


def keystream(data, n):
    out = bytearray()
    j = 0
    while len(out) < n:
        out += hashlib.sha256(data + b"\0" + str(j).encode()).digest()
        j += 1
    return out


@lru_cache(maxsize=8192)
def gen_tokens(prompt, reply, ntok, seed, uni):
    if reply == "echo":
        return tuple(re.findall(r"[^ ]+ *", "echo: " + prompt[:200]))
    if reply == "json":
        return tuple(re.findall(r"[^ ]+ *", json.dumps({"echo": prompt[:200]})))
    if ntok <= 0:
        return ()
    ks = keystream(prompt.encode("utf-8", "surrogatepass") + b"\0" + seed.encode("utf-8"), ntok)
    w = UWORDS if uni else WORDS
    return tuple(w[ks[i] % 64] + " " for i in range(ntok))


@lru_cache(maxsize=8192)
def embed_vec(text, dim):
    ks = keystream(text.encode("utf-8", "surrogatepass"), 4 * dim)
    raw = [(int.from_bytes(ks[4 * k:4 * k + 4], "little") / 2147483648.0) - 1.0 for k in range(dim)]
    packed = struct.pack("<%df" % dim, *raw)
    return list(struct.unpack("<%df" % dim, packed)), packed


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str))
    return ""


def go_duration(sec):
    if sec < 1:
        return "%dms" % max(0, round(sec * 1000))
    m, s = divmod(sec, 60)
    if m >= 1:
        return "%dm%ss" % (m, ("%.3f" % s).rstrip("0").rstrip("."))
    return "%ss" % ("%.3f" % s).rstrip("0").rstrip(".")


def jdump(o, ascii_=False):
    return json.dumps(o, separators=(",", ":"), ensure_ascii=ascii_)


@lru_cache(maxsize=65536)
def jstr(s, ascii_=False):
    return json.dumps(s, ensure_ascii=ascii_)


# A \\u-escaped surrogate pair in json.dumps(..., ensure_ascii=True) output.
SURROGATE_PAIR = re.compile(r"(\\ud[89ab][0-9a-f]{2})(\\ud[c-f][0-9a-f]{2})")


class ClientGone(Exception):
    pass


class Cut(Exception):
    pass


class BadRequest(Exception):
    def __init__(self, status, msg, etype="invalid_request_error"):
        super().__init__(msg)
        self.status = status
        self.etype = etype


class Req:
    __slots__ = ("method", "target", "path", "query", "version", "headers", "body", "t",
                 "keepalive")


EOLS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
MIXED = (b"\n", b"\r\n", b"\r")


class Resp:
    """One HTTP response on a connection: buffering, framing, splitting, cutting."""

    def __init__(self, conn, entry, K, chunked):
        self.conn = conn
        self.w = conn.writer
        self.tr = conn.writer.transport
        self.entry = entry
        self.chunked = chunked
        self.head = b""
        self.pending = []
        self.cut_left = K["cut_after_bytes"]
        wb = K["write_bytes"]
        self.wb_random = wb == "random"
        self.wb = 0 if self.wb_random else int(wb)
        self.split_utf8 = K["split_utf8"]
        self.gap = conn.srv.ms(K["write_gap_ms"])
        self.rng = random.Random(entry["seq"])
        self.close_delimited = False
        self.ping_bytes = lambda: b""
        entry["bytes_sent"] = 0

    def start(self, status, headers, length=None):
        reason = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ \
            else "Unknown"
        h = ["HTTP/1.1 %d %s" % (status, reason), "Server: fake_llm"]
        # content_type=none: no Content-Type header at all.
        h += ["%s: %s" % kv for kv in headers
              if not (kv[0].lower() == "content-type" and kv[1] == "none")]
        if self.chunked:
            h.append("Transfer-Encoding: chunked")
        elif length is not None:
            h.append("Content-Length: %d" % length)
        self.close_delimited = not self.chunked and length is None
        if not self.conn.keep:
            h.append("Connection: close")
        self.head = ("\r\n".join(h) + "\r\n\r\n").encode("latin-1")
        self.entry["status"] = status
        self.entry["t_headers"] = time.time()

    def emit(self, b):
        self.pending.append(b)

    def _write(self, b):
        # A closed transport, or EOF from the peer (curl closes, it never half-closes),
        # means the client has gone: stop instead of writing into the void.
        if self.tr.is_closing() or self.conn.reader.at_eof():
            raise ClientGone()
        self.w.write(b)
        self.entry["bytes_sent"] += len(b)

    async def drain(self):
        try:
            await self.w.drain()
        except (ConnectionError, OSError):
            raise ClientGone() from None

    def _pieces(self, data):
        if not (self.wb or self.wb_random or self.split_utf8) or len(data) <= 1:
            return [data]
        pts = set()
        n = len(data)
        if self.wb:
            pts.update(range(self.wb, n, self.wb))
        elif self.wb_random:
            p = self.rng.randint(1, 16)
            while p < n:
                pts.add(p)
                p += self.rng.randint(1, 16)
        if self.split_utf8:
            for m in re.finditer(rb"[\xc0-\xf7]", data):
                if m.start() + 1 < n:
                    pts.add(m.start() + 1)
        pts = sorted(pts)
        out = []
        prev = 0
        for p in pts:
            out.append(data[prev:p])
            prev = p
        out.append(data[prev:])
        return out

    async def flush(self):
        head, self.head = self.head, b""
        if not self.pending:
            if head:
                self._write(head)
                await self.drain()
            return
        data = b"".join(self.pending)
        self.pending = []
        pieces = self._pieces(data)
        multi = len(pieces) > 1
        for p in pieces:
            cut = False
            if self.cut_left >= 0:
                if len(p) >= self.cut_left:
                    p = p[:self.cut_left]
                    cut = True
                self.cut_left -= len(p)
            if p:
                if self.chunked:
                    p = b"%x\r\n%s\r\n" % (len(p), p)
                self._write(head + p if head else p)
                head = b""
            elif head:
                self._write(head)
                head = b""
            if cut:
                await self.drain()
                raise Cut()
            if multi:
                await self.drain()
                if self.gap > 0:
                    await asyncio.sleep(self.gap)
        await self.drain()

    async def finish(self):
        if self.chunked and self.cut_left < 0 and not (self.wb or self.wb_random or
                                                       self.split_utf8):
            # fast path: last data chunk and the terminating chunk in one write
            data = b"".join(self.pending)
            self.pending = []
            out = self.head + (b"%x\r\n%s\r\n" % (len(data), data) if data else b"") + \
                b"0\r\n\r\n"
            self.head = b""
            self._write(out)
            await self.drain()
            return
        await self.flush()
        if self.chunked:
            self._write(b"0\r\n\r\n")
        await self.drain()


class Conn:
    def __init__(self, srv, reader, writer, cid):
        self.srv = srv
        self.reader = reader
        self.writer = writer
        self.cid = cid
        self.nreq = 0
        self.keep = True
        self.closed = False  # we already tore the transport down

    async def read_request(self):
        r = self.reader
        try:
            head = await r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial.strip():
                return None
            raise BadRequest(400, "incomplete request head")
        except asyncio.LimitOverrunError:
            raise BadRequest(431, "request head too large")
        req = Req()
        req.t = time.time()
        lines = head[:-4].decode("latin-1").split("\r\n")
        while lines and not lines[0]:
            lines.pop(0)  # tolerate stray CRLF between requests
        if not lines:
            raise BadRequest(400, "empty request")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(400, "bad request line")
        req.method, req.target, req.version = parts
        hd = {}
        for ln in lines[1:]:
            if ":" not in ln:
                raise BadRequest(400, "bad header line")
            k, v = ln.split(":", 1)
            k = k.strip().lower()
            v = v.strip()
            hd[k] = hd[k] + ", " + v if k in hd else v
        req.headers = hd
        u = urllib.parse.urlsplit(req.target)
        req.path = u.path
        req.query = u.query
        conn_tok = hd.get("connection", "").lower()
        if req.version == "HTTP/1.0":
            req.keepalive = "keep-alive" in conn_tok
        else:
            req.keepalive = "close" not in conn_tok
        req.body = None
        return req

    async def read_body(self, req):
        hd = req.headers
        if "expect" in hd and hd["expect"].lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        r = self.reader
        if "chunked" in hd.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                line = await r.readuntil(b"\r\n")
                try:
                    n = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise BadRequest(400, "bad chunk size")
                if n == 0:
                    while (await r.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    break
                chunks.append(await r.readexactly(n))
                if await r.readexactly(2) != b"\r\n":
                    raise BadRequest(400, "bad chunk end")
            req.body = b"".join(chunks)
        elif "content-length" in hd:
            try:
                n = int(hd["content-length"])
            except ValueError:
                raise BadRequest(400, "bad content-length")
            req.body = await r.readexactly(n) if n > 0 else b""
        else:
            req.body = b""

    async def run(self):
        srv = self.srv
        try:
            acc = srv.defaults.get("accept_delay_ms", 0)
            if acc > 0:
                await asyncio.sleep(srv.ms(acc))
            while self.keep:
                try:
                    req = await self.read_request()
                except BadRequest as e:
                    await self.simple(e.status, {"error": {"message": str(e),
                                                           "type": "bad_request"}}, close=True)
                    break
                if req is None:
                    break
                self.nreq += 1
                self.keep = req.keepalive
                await srv.dispatch(self, req)
        except (ClientGone, ConnectionError, OSError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            pass
        except Exception as e:  # keep serving other connections
            print("fake_llm: internal error: %r" % (e,), file=sys.stderr, flush=True)
            import traceback
            traceback.print_exc()
        finally:
            if not self.writer.transport.is_closing():
                self.writer.close()

    async def simple(self, status, obj, close=False, headers=(), raw=None, ctype=None):
        """Write a small complete response (control endpoints / protocol errors)."""
        body = raw if raw is not None else jdump(obj, True).encode()
        if close:
            self.keep = False
        h = ["HTTP/1.1 %d %s" % (status, http.HTTPStatus(status).phrase),
             "Server: fake_llm",
             "Content-Type: %s" % (ctype or "application/json"),
             "Content-Length: %d" % len(body)]
        # content_type=none: no Content-Type header at all.
        h += ["%s: %s" % kv for kv in headers
              if not (kv[0].lower() == "content-type" and kv[1] == "none")]
        if not self.keep:
            h.append("Connection: close")
        data = ("\r\n".join(h) + "\r\n\r\n").encode() + body
        self.writer.write(data)
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            raise ClientGone() from None
        return len(data)


class Server:
    def __init__(self, args):
        self.args = args
        self.scale = args.time_scale
        base = dict(BUILTIN)
        base.update(parse_scenario(args.defaults or ""))
        for k, v in (("latency_ms", args.latency_ms), ("ttft_ms", args.ttft_ms),
                     ("tokens", args.tokens), ("tps", args.tps),
                     ("accept_delay_ms", args.accept_delay_ms)):
            if v is not None:
                base[k] = v
        if args.close_delimited:
            base["framing"] = "close"
        self.cli_defaults = base
        self.cli_rpm = args.rpm
        self.cli_tpm = args.tpm
        self.cli_rl_mode = args.rl_mode
        self.conn_seq = 0
        self.inflight = 0  # API requests being served (a reset leaves it alone)
        self.gen = 0  # resets so far: a request counts in the peak of its own
        self.gen_inflight = 0  # requests of this generation being served
        self.held = {}  # hold name -> requests waiting on it now
        self.reset()

    def reset(self):
        for ev in getattr(self, "holds", {}).values():
            ev.set()
        self.holds = {}  # hold name -> asyncio.Event, set once released
        self.defaults = dict(self.cli_defaults)
        self.rpm = self.cli_rpm
        self.tpm = self.cli_tpm
        self.stats = []
        self.seq = 0
        self.gen = getattr(self, "gen", 0) + 1
        self.gen_inflight = 0
        self.peak = 0
        self.scripts = {}
        self.rl_q = deque()  # (loop time, tokens)
        self.rl_tokens = 0
        self.rl_mode = self.cli_rl_mode
        self.rl_bucket = None  # rl_mode=bucket: [requests, tokens, loop time]; None: full

    def ms(self, x):
        return max(0.0, x) * self.scale / 1000.0

    async def hold(self, K):
        """Waits for POST /__release of K's hold name, if it has one: a test
        decides when held responses go out (e.g. only once a broker is down)."""
        name = K["hold"]
        if name:
            self.held[name] = self.held.get(name, 0) + 1
            try:
                await self.holds.setdefault(name, asyncio.Event()).wait()
            finally:
                self.held[name] -= 1
                if not self.held[name]:
                    del self.held[name]

    async def handle(self, reader, writer):
        self.conn_seq += 1
        await Conn(self, reader, writer, self.conn_seq).run()

    # ---- dispatch -------------------------------------------------------------------
    async def dispatch(self, conn, req):
        p = req.path.rstrip("/") or "/"
        if p.startswith("/__"):
            await conn.read_body(req)
            return await self.control(conn, req, p)
        self.seq += 1
        entry = {"seq": self.seq, "t": req.t, "t_headers": None, "t_first_token": None,
                 "t_end": None, "conn": conn.cid, "conn_req": conn.nreq,
                 "method": req.method, "path": req.path, "query": req.query,
                 "headers": req.headers, "body": None, "body_bytes": 0, "model": None,
                 "prompt": None, "stream": False, "scenario": "", "scenario_src": "default",
                 "knobs": {}, "status": None, "bytes_sent": 0, "tokens_sent": 0,
                 "text": None, "tokens": None, "text_sent": "", "ended": "in_progress"}
        self.stats.append(entry)
        self.inflight += 1
        gen = self.gen
        self.gen_inflight += 1
        self.peak = max(self.peak, self.gen_inflight)
        try:
            await self.api(conn, req, entry, p)
            if entry["ended"] == "in_progress":
                entry["ended"] = "complete"
        except ClientGone:
            if entry["ended"] in ("in_progress", "stalled"):
                entry["ended"] = "client_closed" if entry["ended"] == "in_progress" \
                    else "stall_client_closed"
            conn.keep = False
        except BadRequest as e:
            entry["ended"] = "bad_request"
            entry["status"] = e.status
            entry["bytes_sent"] = await conn.simple(
                e.status, {"error": {"message": str(e), "type": e.etype,
                                     "param": None, "code": None}})
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            entry["ended"] = "client_closed"
            conn.keep = False
        except Exception:
            entry["ended"] = "server_error"
            conn.keep = False
            raise
        finally:
            self.inflight -= 1
            if gen == self.gen:
                self.gen_inflight -= 1
            entry["t_end"] = time.time()
            if VERBOSE:
                log(entry["seq"], req.method, req.path, entry["scenario_src"],
                    entry["status"], entry["ended"], entry["bytes_sent"])

    async def control(self, conn, req, p):
        m = req.method
        try:
            body = json.loads(req.body) if req.body else {}
        except ValueError:
            return await conn.simple(400, {"error": {"message": "bad JSON"}})
        if p == "/__stats" and m == "GET":
            q = urllib.parse.parse_qs(req.query)
            since = int(q.get("since", ["0"])[0])
            rows = [e for e in self.stats if e["seq"] >= since] if since else self.stats
            for e in rows:
                e["text_sent"] = "".join(e["tokens"][:e["tokens_sent"]]) if e["tokens"] else ""
            return await conn.simple(200, None, raw=jdump(rows, True).encode())
        if p == "/__concurrency" and m == "GET":
            return await conn.simple(200, {"inflight": self.inflight, "peak": self.peak,
                                           "held": dict(self.held)})
        if p == "/__reset" and m == "POST":
            self.reset()
            return await conn.simple(200, {"ok": True})
        if p == "/__release" and m == "POST":
            name = body.get("name") if isinstance(body, dict) else None
            if not isinstance(name, str) or not name:
                return await conn.simple(400, {"error": {"message": 'want {"name": str}'}})
            self.holds.setdefault(name, asyncio.Event()).set()
            return await conn.simple(200, {"ok": True, "name": name})
        if p == "/__script" and m == "GET":
            return await conn.simple(200, {k: list(v) for k, v in self.scripts.items()})
        if p == "/__script" and m == "POST":
            model = body.get("model", "*") if isinstance(body, dict) else None
            sc = body.get("scenarios") if isinstance(body, dict) else None
            if not isinstance(model, str) or not isinstance(sc, list) or \
                    not all(isinstance(s, str) for s in sc):
                return await conn.simple(400, {"error": {"message":
                                         'want {"model": str, "scenarios": [str, ...]}'}})
            try:
                for s in sc:
                    parse_scenario(s)
            except ValueError as e:
                return await conn.simple(400, {"error": {"message": str(e),
                                                         "type": "fake_llm_bad_scenario"}})
            q = self.scripts.setdefault(model, deque())
            if body.get("replace"):
                q.clear()
            q.extend(sc)
            return await conn.simple(200, {"ok": True, "model": model, "queued": len(q)})
        if p == "/__config" and m == "POST":
            try:
                if "defaults" in body:
                    d = dict(self.cli_defaults)
                    d.update(parse_scenario(body["defaults"] or ""))
                    self.defaults = d
                if "rpm" in body:
                    self.rpm = int(body["rpm"] or 0)
                if "tpm" in body:
                    self.tpm = int(body["tpm"] or 0)
                if "rl_mode" in body:
                    if body["rl_mode"] not in ("window", "bucket"):
                        raise ValueError("rl_mode must be window or bucket")
                    self.rl_mode = body["rl_mode"]
                    self.rl_bucket = None
            except (ValueError, TypeError) as e:
                return await conn.simple(400, {"error": {"message": str(e)}})
            return await conn.simple(200, {"ok": True, "rpm": self.rpm, "tpm": self.tpm})
        if p == "/__expected" and m == "GET":
            q = urllib.parse.parse_qs(req.query, keep_blank_values=True)
            g = lambda k, d: q.get(k, [d])[0]  # noqa: E731
            try:
                toks = gen_tokens(g("prompt", ""), g("reply", "lorem"),
                                  int(g("tokens", str(self.defaults["tokens"]))),
                                  g("seed", "0"), int(g("unicode", "0")))
            except ValueError as e:
                return await conn.simple(400, {"error": {"message": str(e)}})
            return await conn.simple(200, {"text": "".join(toks), "tokens": list(toks)})
        return await conn.simple(404, {"error": {"message": "no such control endpoint"}})

    def choose(self, req, model, header_sc):
        if header_sc is not None:
            return header_sc, "header", req.headers.get("x-fake-scenario", "")
        if model.startswith("fake/"):
            raw = model[5:]
            sc = parse_scenario(raw, lenient=True)
            if sc:
                return sc, "model", raw
        for key in (model, "*"):
            q = self.scripts.get(key)
            if q:
                raw = q.popleft()
                return parse_scenario(raw), "script", raw
        return {}, "default", ""

    def bucket_check(self, est):
        """rl_mode=bucket: a second's worth of each limit, refilled continuously."""
        now = asyncio.get_running_loop().time()
        sec = self.scale  # one (scaled) second
        rcap, tcap = max(1.0, self.rpm / 60.0), max(1.0, self.tpm / 60.0)
        if self.rl_bucket is None:
            self.rl_bucket = [rcap, tcap, now]
        b = self.rl_bucket
        dt = now - b[2]
        b[0] = min(rcap, b[0] + dt * self.rpm / 60.0 / sec)
        b[1] = min(tcap, b[1] + dt * self.tpm / 60.0 / sec)
        b[2] = now
        if self.rpm and b[0] < 1:
            return "requests", (1 - b[0]) * 60.0 * sec / self.rpm
        need = min(est, tcap)
        if self.tpm and b[1] < need:
            return "tokens", (need - b[1]) * 60.0 * sec / self.tpm
        b[0] -= 1
        b[1] -= est
        self.rl_q.append((now, est))  # for the x-ratelimit-* headers
        self.rl_tokens += est
        while self.rl_q and self.rl_q[0][0] <= now - 60.0 * sec:
            self.rl_tokens -= self.rl_q.popleft()[1]
        return None

    def bucket_headers(self):
        """rl_mode=bucket: what is left in each bucket now, and (as OpenAI's
        x-ratelimit-reset-* say) the time until it is full again."""
        now = asyncio.get_running_loop().time()
        sec = self.scale
        b = self.rl_bucket
        h = []
        for i, kind, lim in ((0, "requests", self.rpm), (1, "tokens", self.tpm)):
            if not lim:
                continue
            cap = max(1.0, lim / 60.0)
            left = min(cap, b[i] + (now - b[2]) * lim / 60.0 / sec)
            h += [("x-ratelimit-limit-%s" % kind, str(lim)),
                  ("x-ratelimit-remaining-%s" % kind, str(max(0, math.floor(left)))),
                  ("x-ratelimit-reset-%s" % kind,
                   go_duration(max(0.0, (cap - left) * 60.0 * sec / lim)))]
        return h

    def rate_check(self, est):
        """Returns None if admitted, else (kind, seconds until reset)."""
        if not self.rpm and not self.tpm:
            return None
        if self.rl_mode == "bucket":
            return self.bucket_check(est)
        now = asyncio.get_running_loop().time()
        win = 60.0 * self.scale
        q = self.rl_q
        while q and q[0][0] <= now - win:
            self.rl_tokens -= q.popleft()[1]
        if self.rpm and len(q) >= self.rpm:
            return "requests", q[0][0] + win - now
        if self.tpm and q and self.rl_tokens + est > self.tpm:
            acc = self.rl_tokens + est - self.tpm
            for t, n in q:
                acc -= n
                if acc <= 0:
                    return "tokens", t + win - now
            return "tokens", q[-1][0] + win - now
        q.append((now, est))
        self.rl_tokens += est
        return None

    def rl_headers(self, reset=None):
        if self.rl_mode == "bucket" and self.rl_bucket is not None and reset is None:
            return self.bucket_headers()
        now = asyncio.get_running_loop().time()
        win = 60.0 * self.scale
        rst = reset if reset is not None else \
            (self.rl_q[0][0] + win - now if self.rl_q else win)
        lr = self.rpm or 10000
        lt = self.tpm or 1000000
        return [("x-ratelimit-limit-requests", str(lr)),
                ("x-ratelimit-remaining-requests", str(max(0, lr - len(self.rl_q)))),
                ("x-ratelimit-reset-requests", go_duration(max(0.0, rst))),
                ("x-ratelimit-limit-tokens", str(lt)),
                ("x-ratelimit-remaining-tokens", str(max(0, lt - self.rl_tokens))),
                ("x-ratelimit-reset-tokens", go_duration(max(0.0, rst)))]

    async def api(self, conn, req, entry, p):
        endpoint = p
        # Anthropic, Ollama and Azure paths: scripts/fake_providers.py.
        if fake_providers.claims(endpoint):
            endpoint = await fake_providers.api(sys.modules[__name__], self, conn, req,
                                                entry, endpoint)
            if endpoint is None:
                return
        if endpoint in ("/v1/models", "/models", "/health") and req.method == "GET":
            await conn.read_body(req)
            if endpoint == "/health":
                obj = {"status": "ok"}
            else:
                obj = {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 1700000000, "owned_by": "fake_llm"}
                    for m in ("fake-model", "fake-embed")]}
            entry["status"] = 200
            entry["bytes_sent"] = await conn.simple(200, obj)
            return
        if endpoint not in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                            "/chat/completions", "/completions", "/embeddings"):
            await conn.read_body(req)
            entry["status"] = 404
            entry["bytes_sent"] = await conn.simple(404, {"error": {
                "message": "fake_llm: no route %s %s" % (req.method, req.path),
                "type": "invalid_request_error", "param": None, "code": "unknown_url"}})
            return
        if req.method != "POST":
            await conn.read_body(req)
            entry["status"] = 405
            entry["bytes_sent"] = await conn.simple(405, {"error": {
                "message": "method not allowed", "type": "invalid_request_error"}})
            return
        kind = endpoint.rsplit("/", 1)[1]  # completions | embeddings (chat -> completions)
        if "chat" in endpoint:
            kind = "chat"

        # Header scenario is known before the body: it may delay reading the body.
        hraw = req.headers.get("x-fake-scenario", "").strip()
        header_sc = None
        if hraw:
            try:
                header_sc = parse_scenario(hraw)
            except ValueError as e:
                await conn.read_body(req)
                raise BadRequest(400, "X-Fake-Scenario: %s" % e, "fake_llm_bad_scenario")
            if header_sc.get("accept_delay_ms", 0) > 0:
                await asyncio.sleep(self.ms(header_sc["accept_delay_ms"]))
        await conn.read_body(req)
        entry["body_bytes"] = len(req.body)
        try:
            body = json.loads(req.body)
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(400, "fake_llm: bad JSON body: %s" % e)
        entry["body"] = body
        model = body.get("model")
        model = model if isinstance(model, str) else ""
        entry["model"] = model
        stream = bool(body.get("stream")) and kind != "embeddings"
        entry["stream"] = stream
        try:
            sc, src, raw = self.choose(req, model, header_sc)
        except ValueError as e:
            raise BadRequest(400, "scenario: %s" % e, "fake_llm_bad_scenario")
        K = dict(self.defaults)
        K.update(sc)
        entry["scenario"] = raw
        entry["scenario_src"] = src
        entry["knobs"] = {k: v for k, v in K.items() if BUILTIN[k] != v}

        # prompt and text
        if kind == "chat":
            msgs = body.get("messages") if isinstance(body.get("messages"), list) else []
            prompt = ""
            alltext = []
            for msg in msgs:
                if isinstance(msg, dict):
                    t = text_of(msg.get("content"))
                    alltext.append(t)
                    if msg.get("role") == "user":
                        prompt = t
            alltext = "".join(alltext)
        elif kind == "completions":
            pr = body.get("prompt", "")
            if isinstance(pr, list):
                pr = pr[0] if pr else ""
            prompt = pr if isinstance(pr, str) else jdump(pr)
            alltext = prompt
        else:
            prompt = alltext = ""
        ptoks = max(1, math.ceil(len(alltext.encode("utf-8", "surrogatepass")) / 4))
        if K["prompt_truncate_to"] >= 0:
            ptoks = min(ptoks, K["prompt_truncate_to"])

        if kind == "embeddings":
            return await self.embeddings(conn, req, entry, K, sc, body)

        toks = gen_tokens(prompt, K["reply"], K["tokens"], K["seed"], K["unicode"])
        entry["prompt"] = prompt
        entry["tokens"] = list(toks)
        entry["text"] = "".join(toks)

        mt = body.get("max_completion_tokens") or body.get("max_tokens")
        est = ptoks + (mt if isinstance(mt, int) and mt > 0 else len(toks))
        rl = self.rate_check(est)
        if rl is not None:
            entry["scenario_src"] = "rate_limit"
            await self.rate_limited(conn, entry, K, rl)
            return

        delay = K["latency_ms"] + K["header_delay_ms"]
        if src in ("model", "script"):
            delay += sc.get("accept_delay_ms", 0)
        if delay > 0:
            await asyncio.sleep(self.ms(delay))
        await self.hold(K)

        if not K["keepalive"]:
            conn.keep = False
        if K["status"] >= 400:
            return await self.error(conn, entry, K, K["status"])
        if stream and K["stream_reply"]:
            await Streamer(self, conn, req, entry, K, kind, body, toks, ptoks, prompt).run()
        else:
            await self.nonstream(conn, req, entry, K, kind, toks, ptoks, prompt)

    # ---- common headers -------------------------------------------------------------
    def extra_headers(self, entry, K):
        h = [("X-Request-Id", "req_fake_%d" % entry["seq"])]
        if K["ra"]:
            h.append(("Retry-After", K["ra"]))
        if K["ra_ms"]:
            h.append(("retry-after-ms", K["ra_ms"]))
        if K["ra_date"] >= 0:
            h.append(("Retry-After", email.utils.formatdate(time.time() + K["ra_date"],
                                                            usegmt=True)))
        if K["should_retry"]:
            h.append(("x-should-retry", K["should_retry"]))
        if K["rl_headers"]:
            h += self.rl_headers()
        return h

    async def rate_limited(self, conn, entry, K, rl):
        what, reset = rl
        reset = max(0.001, reset)
        body = jdump({"error": {
            "message": "fake_llm: rate limit reached for %s" % what,
            "type": what, "param": None, "code": "rate_limit_exceeded"}}).encode()
        h = [("Content-Type", "application/json"),
             ("X-Request-Id", "req_fake_%d" % entry["seq"]),
             ("Retry-After", str(max(1, math.ceil(reset)))),
             ("retry-after-ms", "%d" % math.ceil(reset * 1000))] + self.rl_headers(reset)
        r = Resp(conn, entry, K, False)
        r.start(429, h, len(body))
        r.emit(body)
        await r.flush()

    async def error(self, conn, entry, K, status):
        fmt = K["err_body"]
        msg = K["err_msg"] or "fake_llm: simulated HTTP %d" % status
        if K["err_quote_key"]:
            auth = entry["headers"].get("authorization", "")
            key = auth[7:] if auth.lower().startswith("bearer ") else auth
            if K["err_quote_key"] == "masked" and len(key) > 12:
                key = key[:8] + "*" * (len(key) - 12) + key[-4:]
            msg = "Incorrect API key provided: %s. %s" % (key, msg)
        code = K["code"] or None
        ctype = "application/json"
        if fmt in ("openai", "vllm", "vllm_flat"):
            if fmt == "openai":
                etype = K["etype"] or (code if code == "insufficient_quota" else
                                       {400: "invalid_request_error",
                                        401: "authentication_error",
                                        403: "permission_error",
                                        404: "invalid_request_error",
                                        429: "requests"}.get(
                                           status, "server_error" if status >= 500
                                           else "invalid_request_error"))
                obj = {"error": {"message": msg, "type": etype, "param": None, "code": code}}
            else:
                etype = K["etype"] or {400: "BadRequestError", 404: "NotFoundError",
                                       500: "InternalServerError"}.get(status, "Error")
                err = {"message": msg, "type": etype, "param": None,
                       "code": int(code) if code and code.isdigit() else status}
                obj = {"error": err} if fmt == "vllm" else dict(object="error", **err)
            body = jdump(obj).encode()
        elif fmt == "ollama_str":
            body = jdump({"error": msg}).encode()
        elif fmt == "error_message":
            body = jdump({"error": K["etype"] or http.HTTPStatus(status).phrase,
                          "message": msg}).encode()
        elif fmt == "anthropic":
            etype = K["etype"] or {400: "invalid_request_error", 401: "authentication_error",
                                   402: "billing_error", 403: "permission_error",
                                   404: "not_found_error", 413: "request_too_large",
                                   429: "rate_limit_error", 504: "timeout_error",
                                   529: "overloaded_error"}.get(status, "api_error")
            body = jdump({"type": "error", "error": {"type": etype, "message": msg},
                          "request_id": "req_fake_%d" % entry["seq"]}).encode()
        elif fmt == "html":
            ctype = "text/html"
            body = ("<html><head><title>%d</title></head><body><center><h1>%d %s</h1>"
                    "</center><hr><center>fake_llm</center></body></html>\r\n"
                    % (status, status, msg)).encode()
        else:
            body = b""
        h = [("Content-Type", K["content_type"] or ctype)] + self.extra_headers(entry, K)
        close = K["framing"] == "close" or K["cut_mode"] == "close_delimited"
        if close:
            conn.keep = False
        r = Resp(conn, entry, K, False)
        r.start(status, h, None if close else len(body))
        r.emit(body)
        try:
            await r.flush()
        except Cut:
            return await self.do_cut(conn, r, entry, K)
        if close:
            conn.writer.close()

    async def do_cut(self, conn, r, entry, K):
        mode = K["cut_mode"]
        conn.keep = False
        tr = conn.writer.transport
        if mode == "fin_clean" and r.chunked:
            r._write(b"0\r\n\r\n")
            await r.drain()
            conn.keep = bool(K["keepalive"]) and entry.get("_req_keep", True)
            entry["ended"] = "cut_fin_clean"
            return
        if mode == "rst":
            await r.drain()
            await asyncio.sleep(0.02)
            sock = tr.get_extra_info("socket")
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            tr.abort()
            entry["ended"] = "cut_rst"
            return
        conn.writer.close()
        entry["ended"] = "cut_close" if r.close_delimited else "cut_fin_raw"

    # ---- non-streaming --------------------------------------------------------------
    async def nonstream(self, conn, req, entry, K, kind, toks, ptoks, prompt):
        steps = plan_steps(K, kind, toks, prompt)
        tps = K["tps"]
        gen = 0.0
        if tps > 0 and len(steps) > 1:
            gen = sum(max(1, s[2]) for s in steps[:-1]) / tps
        wait = self.ms(K["ttft_ms"]) + gen * self.scale
        if wait > 0:
            await asyncio.sleep(wait)
        text = "".join(toks)
        ntok = len(toks)
        fr = K["finish_reason"] or ("tool_calls" if K["tool_calls"] > 0 else "stop")
        comp = ntok + (K["reasoning_tokens"] if K["reasoning_field"] and kind == "chat" else 0)
        usage = {"prompt_tokens": ptoks, "completion_tokens": comp,
                 "total_tokens": ptoks + comp}
        usage.update(usage_details(K, ptoks, kind))
        now = int(entry["t"])
        if kind == "chat":
            msg = {"role": "assistant", "content": text, "refusal": None}
            if K["reasoning_field"]:
                msg[K["reasoning_field"]] = "think " * K["reasoning_tokens"]
            if K["tool_calls"] > 0:
                msg["tool_calls"] = [{"id": "call_fake_%d" % i, "type": "function",
                                      "function": {"name": "fn_%d" % i,
                                                   "arguments": tool_args(i, prompt)}}
                                     for i in range(K["tool_calls"])]
                if not toks:
                    msg["content"] = None
            obj = {"id": "chatcmpl-fake%d" % entry["seq"], "object": "chat.completion",
                   "created": now, "model": entry["model"], "system_fingerprint": "fp_fake",
                   "choices": [{"index": 0, "message": msg, "logprobs": None,
                                "finish_reason": fr}]}
        else:
            obj = {"id": "cmpl-fake%d" % entry["seq"], "object": "text_completion",
                   "created": now, "model": entry["model"],
                   "choices": [{"text": text, "index": 0, "logprobs": None,
                                "finish_reason": fr}]}
        if K["usage"] != "never":
            obj["usage"] = usage
        body = jdump(obj, K["json_ascii"]).encode("utf-8", "surrogatepass")
        if K["garbage"] >= 0:
            body = b"this is not json{" + body[:20]
        if K["line_bytes"] > len(body) + 9:
            body = b'{"pad":"' + b"x" * (K["line_bytes"] - len(body) - 9) + b'",' + body[1:]
        close = K["framing"] == "close" or K["cut_mode"] == "close_delimited"
        if close:
            conn.keep = False
        h = [("Content-Type", K["content_type"] or "application/json")] + \
            self.extra_headers(entry, K)
        r = Resp(conn, entry, K, False)
        r.start(K["status"], h, None if close else len(body))
        if K["stall_after_tokens"] >= 0:
            await r.flush()
            entry["ended"] = "stalled"
            if K["stall_ms"] > 0:
                await asyncio.sleep(self.ms(K["stall_ms"]))
                entry["ended"] = "in_progress"
            else:
                await wait_client_close(conn, r, K, self)
        r.emit(body)
        try:
            if K["cut_after_tokens"] >= 0 and r.cut_left < 0:
                r.cut_left = len(body) // 2
            await r.flush()
        except Cut:
            return await self.do_cut(conn, r, entry, K)
        entry["tokens_sent"] = ntok
        entry["t_first_token"] = time.time()
        if close:
            conn.writer.close()

    # ---- embeddings -----------------------------------------------------------------
    async def embeddings(self, conn, req, entry, K, sc, body):
        inp = body.get("input")
        if isinstance(inp, str):
            items = [inp]
        elif isinstance(inp, list) and inp and all(isinstance(x, int) for x in inp):
            items = [jdump(inp)]
        elif isinstance(inp, list) and inp:
            items = [x if isinstance(x, str) else jdump(x) for x in inp]
        else:
            raise BadRequest(400, "fake_llm: 'input' must be a string or a non-empty list")
        dim = body.get("dimensions") or K["dim"]
        if not isinstance(dim, int) or dim <= 0 or dim > 65536:
            raise BadRequest(400, "fake_llm: bad dimensions")
        entry["prompt"] = items[0]
        rl = self.rate_check(sum(max(1, math.ceil(len(t.encode()) / 4)) for t in items))
        if rl is not None:
            entry["scenario_src"] = "rate_limit"
            return await self.rate_limited(conn, entry, K, rl)
        delay = K["latency_ms"] + K["header_delay_ms"] + \
            (sc.get("accept_delay_ms", 0) if entry["scenario_src"] in ("model", "script") else 0)
        if delay > 0:
            await asyncio.sleep(self.ms(delay))
        await self.hold(K)
        if not K["keepalive"]:
            conn.keep = False
        if K["status"] >= 400:
            return await self.error(conn, entry, K, K["status"])
        b64 = body.get("encoding_format") == "base64"
        data = []
        ptok = 0
        for i, t in enumerate(items):
            vec, packed = embed_vec(t, dim)
            data.append({"object": "embedding", "index": i,
                         "embedding": base64.b64encode(packed).decode() if b64 else vec})
            ptok += max(1, math.ceil(len(t.encode("utf-8", "surrogatepass")) / 4))
        obj = {"object": "list", "data": data, "model": entry["model"],
               "usage": {"prompt_tokens": ptok, "total_tokens": ptok}}
        payload = jdump(obj).encode()
        close = K["framing"] == "close"
        if close:
            conn.keep = False
        h = [("Content-Type", K["content_type"] or "application/json")] + \
            self.extra_headers(entry, K)
        r = Resp(conn, entry, K, False)
        r.start(K["status"], h, None if close else len(payload))
        r.emit(payload)
        try:
            await r.flush()
        except Cut:
            return await self.do_cut(conn, r, entry, K)
        if close:
            conn.writer.close()


def tool_args(i, prompt):
    return jdump({"i": i, "q": prompt[:32]})


def plan_steps(K, kind, toks, prompt):
    """List of (kind, value, ntokens): reasoning, content groups, tool deltas."""
    steps = []
    if kind == "chat" and K["reasoning_field"]:
        steps += [("reasoning", "think ", 1)] * K["reasoning_tokens"]
    ct = max(1, K["chunk_tokens"])
    for i in range(0, len(toks), ct):
        grp = toks[i:i + ct]
        steps.append(("content", "".join(grp), len(grp)))
    if kind == "chat":
        for i in range(K["tool_calls"]):
            args = tool_args(i, prompt)
            first = {"index": i, "id": "call_fake_%d" % i, "type": "function",
                     "function": {"name": "fn_%d" % i, "arguments": args if K["tool_whole"]
                                  else ""}}
            steps.append(("tool", first, 1))
            if not K["tool_whole"]:
                fb = max(1, K["tool_frag_bytes"])
                for j in range(0, len(args), fb):
                    steps.append(("tool", {"index": i, "function": {"arguments":
                                                                    args[j:j + fb]}}, 1))
    return steps


async def wait_client_close(conn, r, K, srv):
    """Stall until the peer closes; with stall_pings keep sending comments."""
    loop = asyncio.get_running_loop()

    async def eof():
        try:
            while await conn.reader.read(65536):
                pass
        except (ConnectionError, OSError):
            pass
    t = loop.create_task(eof())
    try:
        if K["stall_pings"]:
            iv = srv.ms(K["ping_ms"] or 1000.0)
            while True:
                done, _ = await asyncio.wait({t}, timeout=iv)
                if done:
                    break
                r.emit(r.ping_bytes())
                await r.flush()
        else:
            await t
    finally:
        t.cancel()
    raise ClientGone()


def usage_details(K, ptoks, kind):
    """OpenAI's usage details when cached_tokens=N is set: N cached prompt
    tokens (at most the prompt's) and the reasoning tokens of a reasoning reply."""
    if K["cached_tokens"] < 0:
        return {}
    reasoning = K["reasoning_tokens"] if K["reasoning_field"] and kind == "chat" else 0
    return {"prompt_tokens_details": {"cached_tokens": min(K["cached_tokens"], ptoks)},
            "completion_tokens_details": {"reasoning_tokens": reasoning}}


class Streamer:
    def __init__(self, srv, conn, req, entry, K, kind, body, toks, ptoks, prompt):
        self.srv, self.conn, self.req, self.entry, self.K = srv, conn, req, entry, K
        self.kind, self.toks, self.ptoks, self.prompt = kind, toks, ptoks, prompt
        so = body.get("stream_options")
        inc = isinstance(so, dict) and bool(so.get("include_usage"))
        u = K["usage"]
        self.usage_final = u in ("always", "continuous") or (u == "auto" and inc)
        self.usage_field = self.usage_final  # "usage": null on the other chunks
        self.continuous = u == "continuous"
        self.ascii = bool(K["json_ascii"])
        self.eol_mode = K["eol"]
        self.eol_fixed = EOLS.get(self.eol_mode)
        self.fancy = K["event_lines"] or K["multiline_data"]
        self.lb = K["line_bytes"]
        self.eol_i = 0
        self.ev_id = 0
        self.comp = 0  # completion tokens so far (continuous usage)
        self.padded = False
        created = int(entry["t"])
        if kind == "chat":
            self.prefix = '{"id":"chatcmpl-fake%d","object":"chat.completion.chunk",' \
                          '"created":%d,"model":%s,"system_fingerprint":"fp_fake",' \
                          '"choices":' % (entry["seq"], created, jdump(entry["model"],
                                                                       self.ascii))
        else:
            self.prefix = '{"id":"cmpl-fake%d","object":"text_completion","created":%d,' \
                          '"model":%s,"choices":' % (entry["seq"], created,
                                                     jdump(entry["model"], self.ascii))

    # -- SSE building --
    def eol(self):
        if self.eol_mode == "mixed":
            e = MIXED[self.eol_i % 3]
            self.eol_i += 1
            return e
        return EOLS[self.eol_mode]

    def event(self, payload):
        e = self.eol() if self.eol_mode == "mixed" else self.eol_fixed
        data = payload.encode("utf-8", "surrogatepass")
        if self.fancy:
            out = []
            if self.K["event_lines"]:
                self.ev_id += 1
                out.append(b"event: message" + e + b"id: %d" % self.ev_id + e)
            if self.K["multiline_data"]:
                data = data.replace(b',"choices":', b"," + e + b'data: "choices":', 1)
            out.append(b"data: " + data + e + e)
            self.r.pending.append(b"".join(out))
        else:
            self.r.pending.append(b"data: " + data + e + e)

    def usage_json(self, final=False):
        if not self.usage_field and not final:
            return ""
        if self.continuous or final:
            details = usage_details(self.K, self.ptoks, self.kind)
            return ',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d%s}' % (
                self.ptoks, self.comp, self.ptoks + self.comp,
                "".join(",%s:%s" % (jdump(k), jdump(v)) for k, v in details.items()))
        return ',"usage":null'

    def chunk(self, delta_json, finish=None):
        fr = "null" if finish is None else jdump(finish)
        if self.kind == "chat":
            s = '%s[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]%s}' % (
                self.prefix, delta_json, fr, self.usage_json())
        else:
            s = '%s[{"text":%s,"index":0,"logprobs":null,"finish_reason":%s}]%s}' % (
                self.prefix, delta_json, fr, self.usage_json())
        lb = self.lb
        if lb and not self.padded and delta_json not in ("{}", '""') and \
                not delta_json.startswith('{"role"'):
            self.padded = True
            need = lb - len(s.encode()) - 15
            if need > 0:
                s = '{"pad":"%s",%s' % ("x" * need, s[1:])
        self.event(s)

    # -- main --
    async def run(self):
        srv, K, entry = self.srv, self.K, self.entry
        close = K["framing"] == "close" or K["cut_mode"] == "close_delimited" or \
            self.req.version == "HTTP/1.0"
        if close:
            self.conn.keep = False
        entry["_req_keep"] = self.conn.keep
        r = self.r = Resp(self.conn, entry, K, not close)
        r.ping_bytes = self.ping_bytes
        h = [("Content-Type", K["content_type"] or "text/event-stream"),
             ("Cache-Control", "no-cache")] + srv.extra_headers(entry, K)
        r.start(K["status"], h)
        try:
            await self.body()
        except Cut:
            await srv.do_cut(self.conn, r, entry, K)
        except _Stop:
            pass
        finally:
            entry.pop("_req_keep", None)
        if close and not self.conn.writer.transport.is_closing():
            self.conn.writer.close()

    def ping_bytes(self):
        e = self.eol()
        return b": " + self.K["ping_text"].encode() + e + e

    async def wait_until(self, t):
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self.next_ping <= t and self.next_ping <= now:
                self.r.emit(self.ping_bytes())
                self.next_ping += self.ping_iv
                continue
            if t <= now:
                return
            await self.r.flush()
            await asyncio.sleep(min(t, self.next_ping) - now)

    async def body(self):
        srv, K, entry, r = self.srv, self.K, self.entry, self.r
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        self.ping_iv = srv.ms(K["ping_ms"])
        self.next_ping = t0 + self.ping_iv if self.ping_iv > 0 else math.inf
        if K["bom"]:
            r.emit(b"\xef\xbb\xbf")
        if K["event_lines"]:
            r.emit(b"retry: 3000" + self.eol())
        if self.kind == "chat":
            rc = K["role_content"]
            self.chunk('{"role":"assistant","content":""}' if rc == "empty" else
                       '{"role":"assistant","content":null}' if rc == "null" else
                       '{"role":"assistant"}')
            if K["empty_choices"]:
                self.event('%s[]}' % self.prefix)
        steps = plan_steps(K, self.kind, self.toks, self.prompt)
        total = len(self.toks)
        last_content = max((i for i, s in enumerate(steps) if s[0] == "content"), default=-1)
        fr = K["finish_reason"] or ("tool_calls" if K["tool_calls"] > 0 and
                                    self.kind == "chat" else "stop")
        merged = K["finish_style"] == "merged" and last_content >= 0
        self.trig = {k: K[k] for k in ("garbage", "stall_after_tokens", "fail_after_tokens",
                                       "cut_after_tokens") if K[k] >= 0}
        tps = K["tps"]
        jit = K["jitter"] / 100.0
        rng = random.Random("%s\0%s" % (self.prompt, K["seed"]))
        sched = t0 + srv.ms(K["ttft_ms"])
        sent = 0
        if self.trig:
            await self.triggers(0, total)
        timed = tps > 0 or self.ping_iv > 0 or K["ttft_ms"] > 0
        ascii_ = self.ascii
        for i, (sk, val, n) in enumerate(steps):
            if timed:
                await self.wait_until(sched)
            if sk == "content":
                if not sent:
                    entry["t_first_token"] = time.time()
                self.comp += n
                if self.kind == "chat" and K["split_surrogates"] and \
                        SURROGATE_PAIR.search(jstr(val, True)):
                    js = jstr(val, True)
                    m = SURROGATE_PAIR.search(js)
                    self.chunk('{"content":%s"}' % js[:m.end(1)])
                    self.chunk('{"content":"%s}' % js[m.start(2):],
                               fr if merged and i == last_content else None)
                elif self.kind == "chat":
                    self.chunk('{"content":%s}' % jstr(val, ascii_),
                               fr if merged and i == last_content else None)
                else:
                    self.chunk(jstr(val, ascii_), fr if merged and i == last_content else None)
                sent += n
                entry["tokens_sent"] = sent
                if K["empty_choices"]:
                    self.event('%s[]}' % self.prefix)
            elif sk == "reasoning":
                self.comp += 1
                self.chunk('{"%s":%s}' % (K["reasoning_field"], jdump(val)))
            else:
                self.chunk('{"tool_calls":[%s]}' % jdump(val, self.ascii))
            if tps > 0:
                gap = max(1, n) / tps
                if jit:
                    gap *= 1.0 + rng.uniform(-jit, jit)
                sched += gap * srv.scale
            if sk == "content" and self.trig:
                await self.triggers(sent, total)
        if K["finish_style"] == "separate" or (K["finish_style"] == "merged" and not merged):
            self.chunk("{}" if self.kind == "chat" else '""', fr)
        if self.usage_final:
            self.event('%s[]%s}' % (self.prefix, self.usage_json(final=True)))
        self.done()
        await r.finish()

    def done(self):
        d = self.K["done"]
        if d == "no":
            return
        e = self.eol()
        pre = b""
        if self.K["event_lines"]:
            self.ev_id += 1
            pre = b"event: message" + e + b"id: %d" % self.ev_id + e
        self.r.emit(pre + b"data: [DONE]" + (e + e if d == "yes" else e if d == "no_blank_line"
                                             else b""))

    async def triggers(self, sent, total):
        if not self.trig:
            return
        K, r, entry = self.K, self.r, self.entry
        fire = [k for k, v in self.trig.items() if sent >= min(v, total)]
        for k in fire:
            del self.trig[k]
        if "garbage" in fire:
            e = self.eol()
            r.emit(b"data: {this is not json" + e + e)
        if "stall_after_tokens" in fire:
            await r.flush()
            entry["ended"] = "stalled"
            if K["stall_ms"] > 0:
                end = asyncio.get_running_loop().time() + self.srv.ms(K["stall_ms"])
                if K["stall_pings"]:
                    iv = self.srv.ms(K["ping_ms"] or 1000.0)
                    save = (self.next_ping, self.ping_iv)
                    self.ping_iv = iv
                    self.next_ping = asyncio.get_running_loop().time() + iv
                    await self.wait_until(end)
                    self.next_ping, self.ping_iv = save
                else:
                    await r.flush()
                    await asyncio.sleep(max(0.0, end - asyncio.get_running_loop().time()))
                entry["ended"] = "in_progress"
            else:
                await wait_client_close(self.conn, r, K, self.srv)
        if "fail_after_tokens" in fire:
            fmt = K["fail_fmt"]
            err = jdump({"error": {"message": K["err_msg"] or
                                   "fake_llm: simulated mid-stream failure",
                                   "type": K["etype"] or "server_error", "param": None,
                                   "code": K["code"] or None}})
            if fmt == "legacy_error_line":
                e = self.eol()
                r.emit(b"error: " + err.encode() + e + e)
            else:
                self.event(err)
                if fmt == "data_error_then_done":
                    self.done()
            await r.finish()
            entry["ended"] = "fail_event"
            raise _Stop()
        if "cut_after_tokens" in fire:
            await r.flush()
            raise Cut()


class _Stop(Exception):
    pass


def raise_nofile():
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


async def amain(args):
    srv = Server(args)
    server = await asyncio.start_server(srv.handle, args.host, args.port, backlog=4096,
                                        limit=1 << 20, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp%d" % os.getpid()
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.replace(tmp, args.port_file)
    sys.stdout.write("PORT %d\n" % port)
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv=None):
    global VERBOSE
    ap = argparse.ArgumentParser(description="fake OpenAI-compatible LLM server")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default loopback; 0.0.0.0 inside a container)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--latency-ms", type=float)
    ap.add_argument("--ttft-ms", type=float)
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--tps", type=float)
    ap.add_argument("--accept-delay-ms", type=float)
    ap.add_argument("--close-delimited", action="store_true",
                    help="default framing=close")
    ap.add_argument("--defaults", default="", help="default scenario 'k=v;k=v'")
    ap.add_argument("--rpm", type=int, default=0, help="emulated requests/min (scaled)")
    ap.add_argument("--tpm", type=int, default=0, help="emulated tokens/min (scaled)")
    ap.add_argument("--rl-mode", choices=("window", "bucket"), default="window",
                    help="how --rpm/--tpm are enforced (see RATE LIMITS)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    VERBOSE = args.verbose
    try:
        parse_scenario(args.defaults)
    except ValueError as e:
        ap.error("--defaults: %s" % e)
    raise_nofile()
    try:
        asyncio.run(amain(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
