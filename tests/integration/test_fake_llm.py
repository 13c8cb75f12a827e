#!/usr/bin/python3
"""Self-test for scripts/fake_llm.py (stdlib only).

    /usr/bin/python3 tests/integration/test_fake_llm.py [-k SUBSTRING] [--no-bench]

Starts the server on port 0 with --time-scale 0.1, exercises every knob over raw
sockets, checks SSE well-formedness (and exact ill-formedness where asked), /__stats
and /__script, then runs the 1,000-concurrent-stream check against a second server at
--time-scale 1 and reports the wall time (only correctness is asserted).
Last line: "fake_llm: N passed, M failed"; exit status 1 on any failure.
"""

import asyncio
import base64
import email.utils
import hashlib
import importlib.util
import json
import math
import os
import re
import resource
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(ROOT, "scripts", "fake_llm.py")
PY = "/usr/bin/python3"
SCALE = 0.1

_spec = importlib.util.spec_from_file_location("fake_llm", SERVER)
FL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(FL)  # only for the WORDS / UWORDS tables

PASSED = 0
FAILED = 0
CURRENT = ""


def check(name, cond, detail=""):
    global PASSED, FAILED
    if cond:
        PASSED += 1
    else:
        FAILED += 1
        print("FAIL %s: %s %s" % (CURRENT, name, detail if detail else ""), flush=True)
    return cond


def eq(name, got, want):
    return check(name, got == want, "got %r want %r" % (got, want))


# ---------------------------------------------------------------- reference rules --
def expected_tokens(prompt, n=16, seed="0", unicode=False, reply="lorem"):
    if reply == "echo":
        return re.findall(r"[^ ]+ *", "echo: " + prompt[:200])
    base = prompt.encode() + b"\0" + seed.encode() + b"\0"
    ks = b""
    j = 0
    while len(ks) < n:
        ks += hashlib.sha256(base + str(j).encode()).digest()
        j += 1
    words = FL.UWORDS if unicode else FL.WORDS
    return [words[ks[i] % 64] + " " for i in range(n)]


def expected_text(*a, **kw):
    return "".join(expected_tokens(*a, **kw))


def expected_vec(text, dim):
    ks = b""
    j = 0
    while len(ks) < 4 * dim:
        ks += hashlib.sha256(text.encode() + b"\0" + str(j).encode()).digest()
        j += 1
    vals = [struct.unpack("<I", ks[4 * k:4 * k + 4])[0] / 2 ** 31 - 1 for k in range(dim)]
    return list(struct.unpack("<%df" % dim, struct.pack("<%df" % dim, *vals)))


def ptoks(text):
    return max(1, math.ceil(len(text.encode()) / 4))


# ---------------------------------------------------------------- server process --
class Server:
    def __init__(self, *extra):
        self.port_file = tempfile.mktemp(prefix="fake_llm_port_")
        self.p = subprocess.Popen([PY, SERVER, "--port", "0", "--port-file", self.port_file]
                                  + list(extra), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        r, _, _ = select.select([self.p.stdout], [], [], 10)
        if not r:
            self.p.kill()
            raise RuntimeError("server did not print PORT")
        self.first_line = self.p.stdout.readline().decode()
        m = re.fullmatch(r"PORT (\d+)\n", self.first_line)
        if not m:
            self.p.kill()
            raise RuntimeError("bad first line %r, stderr %r" % (self.first_line,
                                                                 self.p.stderr.read()))
        self.port = int(m.group(1))

    def stop(self):
        self.p.terminate()
        try:
            out, err = self.p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, err = self.p.communicate()
        try:
            os.unlink(self.port_file)
        except OSError:
            pass
        return out, err


# ---------------------------------------------------------------- raw HTTP client --
class R:
    pass


class Client:
    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, method, path, body=None, headers=None, version="HTTP/1.1",
             chunked_body=False, expect100=False):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        h = ["%s %s %s" % (method, path, version), "Host: 127.0.0.1"]
        if body is not None:
            h.append("Content-Type: application/json")
            if chunked_body:
                h.append("Transfer-Encoding: chunked")
            else:
                h.append("Content-Length: %d" % len(body))
        if expect100:
            h.append("Expect: 100-continue")
        for k, v in (headers or {}).items():
            h.append("%s: %s" % (k, v))
        head = ("\r\n".join(h) + "\r\n\r\n").encode()
        if body is None:
            self.sock.sendall(head)
        elif chunked_body:
            parts = [body[i:i + 5] for i in range(0, len(body), 5)]
            self.sock.sendall(head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
                              + b"0\r\n\r\n")
        elif expect100:
            self.sock.sendall(head)
            self.pending_body = body
        else:
            self.sock.sendall(head + body)

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        self.sock.settimeout(left)
        d = self.sock.recv(65536)
        if not d:
            self.eof = True
            return False
        self.buf += d
        return True

    def _need(self, n, deadline):
        while len(self.buf) < n:
            if not self._fill(deadline):
                return False
        return True

    def _line(self, deadline):
        while b"\r\n" not in self.buf:
            if not self._fill(deadline):
                return None
        i = self.buf.index(b"\r\n")
        ln, self.buf = self.buf[:i], self.buf[i + 2:]
        return ln

    def read_response(self, timeout=10.0, send_on_100=True):
        deadline = time.monotonic() + timeout
        r = R()
        r.status = None
        r.headers = {}
        r.chunks = []
        r.chunk_times = []
        r.end = None
        r.wire = 0
        r.t_head = None
        r.t0 = time.monotonic()
        r.got_100 = None
        try:
            while True:
                while b"\r\n\r\n" not in self.buf:
                    if not self._fill(deadline):
                        r.end = "eof_head"
                        return self._fin(r)
                i = self.buf.index(b"\r\n\r\n")
                head, self.buf = self.buf[:i], self.buf[i + 4:]
                r.wire += i + 4
                lines = head.decode("latin-1").split("\r\n")
                r.status_line = lines[0]
                r.status = int(lines[0].split(" ")[1])
                if r.status == 100:
                    r.got_100 = time.monotonic()
                    if send_on_100 and getattr(self, "pending_body", None):
                        self.sock.sendall(self.pending_body)
                        self.pending_body = None
                    continue
                for ln in lines[1:]:
                    k, v = ln.split(":", 1)
                    k = k.strip().lower()
                    r.headers[k] = (r.headers[k] + ", " if k in r.headers else "") + v.strip()
                break
            r.t_head = time.monotonic()
            if "chunked" in r.headers.get("transfer-encoding", ""):
                r.framing = "chunked"
                while True:
                    ln = self._line(deadline)
                    if ln is None:
                        r.end = "eof"
                        return self._fin(r)
                    r.wire += len(ln) + 2
                    n = int(ln, 16)
                    if n == 0:
                        ln = self._line(deadline)
                        if ln is None:
                            r.end = "eof"
                            return self._fin(r)
                        r.wire += 2
                        r.end = "complete"
                        return self._fin(r)
                    if not self._need(n + 2, deadline):
                        r.end = "eof"
                        return self._fin(r)
                    assert self.buf[n:n + 2] == b"\r\n", "bad chunk terminator"
                    r.chunks.append(self.buf[:n])
                    r.chunk_times.append(time.monotonic())
                    self.buf = self.buf[n + 2:]
                    r.wire += n + 2
            elif "content-length" in r.headers:
                r.framing = "length"
                n = int(r.headers["content-length"])
                if not self._need(n, deadline):
                    r.chunks.append(self.buf)
                    r.wire += len(self.buf)
                    self.buf = b""
                    r.end = "eof"
                    return self._fin(r)
                r.chunks.append(self.buf[:n])
                self.buf = self.buf[n:]
                r.wire += n
                r.end = "complete"
            else:
                r.framing = "close"
                while self._fill(deadline):
                    pass
                r.chunks.append(self.buf)
                r.wire += len(self.buf)
                self.buf = b""
                r.end = "close"
        except socket.timeout:
            r.end = "timeout"
        except ConnectionResetError:
            r.end = "reset"
        return self._fin(r)

    def _fin(self, r):
        r.body = b"".join(r.chunks)
        if r.end in ("timeout", "eof", "reset") and self.buf and r.status is not None \
                and getattr(r, "framing", "") != "chunked":
            r.body += self.buf
        try:
            r.json = json.loads(r.body) if r.body else None
        except ValueError:
            r.json = None
        return r


def call(port, method, path, body=None, headers=None, timeout=10.0, **kw):
    c = Client(port, timeout)
    try:
        c.send(method, path, body, headers, **kw)
        return c.read_response(timeout)
    finally:
        c.close()


def chat_body(prompt="hello world", stream=True, model="m", usage=False, **extra):
    b = {"model": model, "messages": [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": prompt}], "stream": stream}
    if usage:
        b["stream_options"] = {"include_usage": True}
    b.update(extra)
    return b


def chat(port, scenario=None, prompt="hello world", stream=True, usage=False, model="m",
         timeout=10.0, **extra):
    h = {"X-Fake-Scenario": scenario} if scenario else {}
    return call(port, "POST", "/v1/chat/completions",
                chat_body(prompt, stream, model, usage, **extra), h, timeout)


# ---------------------------------------------------------------- SSE parser --------
class SSE:
    pass


def sse_parse(body):
    """WHATWG-style parse.  Returns events, comments, pending-at-EOF, bom flag."""
    s = SSE()
    s.bom = body.startswith(b"\xef\xbb\xbf")
    if s.bom:
        body = body[3:]
    s.utf8_ok = True
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        s.utf8_ok = False
        text = body.decode("utf-8", "replace")
    lines = re.split(r"\r\n|\r|\n", text)
    s.tail = lines.pop()  # text after the last line terminator (incomplete line)
    s.events = []
    s.comments = []
    s.fields = []
    data, ev, eid = [], None, None
    for ln in lines:
        if ln == "":
            if data:
                s.events.append({"data": "\n".join(data), "event": ev, "id": eid})
            data, ev = [], None
            continue
        if ln.startswith(":"):
            s.comments.append(ln[1:].lstrip(" "))
            continue
        if ":" in ln:
            f, v = ln.split(":", 1)
            if v.startswith(" "):
                v = v[1:]
        else:
            f, v = ln, ""
        s.fields.append(f)
        if f == "data":
            data.append(v)
        elif f == "event":
            ev = v
        elif f == "id":
            eid = v
    if s.tail.startswith("data:"):
        data.append(s.tail[5:].lstrip(" "))
    s.pending = "\n".join(data) if data else None
    return s


def summarize(r):
    """Parse a chat/completions SSE response into a summary object."""
    s = sse_parse(r.body)
    out = R()
    out.sse = s
    out.chunks, out.nonjson, out.errors = [], [], []
    out.done = False
    out.after_done = 0
    for e in s.events:
        if out.done:
            out.after_done += 1
        if e["data"] == "[DONE]":
            out.done = True
            continue
        try:
            j = json.loads(e["data"])
        except ValueError:
            out.nonjson.append(e["data"])
            continue
        if isinstance(j, dict) and "error" in j:
            out.errors.append(j)
            continue
        out.chunks.append(j)
    out.text = ""
    out.finish = []
    out.usage_chunks = [c for c in out.chunks if c.get("choices") == []]
    out.content_chunks = []
    for c in out.chunks:
        for ch in c.get("choices", []):
            if "delta" in ch:
                t = ch["delta"].get("content")
            else:
                t = ch.get("text")
            if t:
                out.text += t
                out.content_chunks.append(c)
            if ch.get("finish_reason") is not None:
                out.finish.append(ch["finish_reason"])
    out.ids = {c.get("id") for c in out.chunks}
    return out


def get_stats(port, since=0):
    r = call(port, "GET", "/__stats" + ("?since=%d" % since if since else ""))
    return r.json


def last_stat(port):
    return get_stats(port)[-1]


def post(port, path, obj):
    return call(port, "POST", path, obj)


# ---------------------------------------------------------------- tests -------------
def t_basic(port, srv):
    eq("first stdout line", srv.first_line, "PORT %d\n" % port)
    with open(srv.port_file) as f:
        eq("port file", f.read().strip(), str(port))
    r = call(port, "GET", "/health")
    eq("health status", r.status, 200)
    eq("health body", r.json, {"status": "ok"})
    r = call(port, "GET", "/v1/models")
    eq("models", [m["id"] for m in r.json["data"]], ["fake-model", "fake-embed"])
    r = call(port, "GET", "/v1/nope")
    eq("404", r.status, 404)
    r = call(port, "GET", "/v1/chat/completions")
    eq("405", r.status, 405)
    c = Client(port)
    c.sock.sendall(b"garbage\r\n\r\n")
    r = c.read_response()
    eq("bad request line -> 400", r.status, 400)
    c.close()


def t_nonstream_chat(port, srv):
    r = chat(port, stream=False, prompt="hello world")
    eq("status", r.status, 200)
    eq("content-type", r.headers.get("content-type"), "application/json")
    j = r.json
    eq("object", j["object"], "chat.completion")
    eq("text rule", j["choices"][0]["message"]["content"], expected_text("hello world"))
    eq("finish", j["choices"][0]["finish_reason"], "stop")
    pt = ptoks("be brief" + "hello world")
    eq("usage", j["usage"], {"prompt_tokens": pt, "completion_tokens": 16,
                             "total_tokens": pt + 16})
    st = last_stat(port)
    eq("stats text", st["text"], expected_text("hello world"))
    eq("stats wire bytes", st["bytes_sent"], r.wire)
    # content as an array of parts, and the LAST user message wins
    b = {"model": "m", "messages": [{"role": "user", "content": "first"},
                                    {"role": "assistant", "content": "x"},
                                    {"role": "user", "content": [
                                        {"type": "text", "text": "par"},
                                        {"type": "image_url", "image_url": {"url": "u"}},
                                        {"type": "text", "text": "ts"}]}]}
    r = call(port, "POST", "/v1/chat/completions", b)
    eq("parts prompt", r.json["choices"][0]["message"]["content"], expected_text("parts"))
    r = chat(port, "tokens=5;seed=7", stream=False, prompt="p")
    eq("seed+tokens", r.json["choices"][0]["message"]["content"],
       expected_text("p", 5, seed="7"))


def t_expected(port, srv):
    r = call(port, "GET", "/__expected?prompt=hello%20world&tokens=9&seed=3")
    eq("expected", r.json["text"], expected_text("hello world", 9, seed="3"))
    r = call(port, "GET", "/__expected?prompt=a%20b&reply=echo")
    eq("expected echo", r.json["tokens"], ["echo: ", "a ", "b"])
    r = call(port, "GET", "/__expected?prompt=x&unicode=1&tokens=40")
    eq("expected unicode", r.json["text"], expected_text("x", 40, unicode=True))


def check_stream_shape(name, s, text, finish="stop", role=True):
    eq(name + " text", s.text, text)
    check(name + " one id", len(s.ids) == 1, s.ids)
    eq(name + " finish", s.finish, [finish])
    check(name + " done last", s.done and s.after_done == 0)
    check(name + " no junk", not s.nonjson and not s.errors, (s.nonjson, s.errors))
    if role:
        d = s.chunks[0]["choices"][0]["delta"]
        eq(name + " role chunk", d, {"role": "assistant", "content": ""})


def t_stream_default(port, srv):
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body("hello world"))
    r = c.read_response()
    eq("status", r.status, 200)
    eq("ctype", r.headers.get("content-type"), "text/event-stream")
    eq("framing", r.framing, "chunked")
    eq("end", r.end, "complete")
    s = summarize(r)
    check_stream_shape("default", s, expected_text("hello world"))
    eq("content chunks", len(s.content_chunks), 16)
    check("no usage field", all("usage" not in c_ for c_ in s.chunks))
    check("lf only", b"\r" not in r.body)
    eq("no usage chunk", s.usage_chunks, [])
    sep = s.chunks[-1]["choices"][0]
    eq("separate finish chunk", (sep["delta"], sep["finish_reason"]), ({}, "stop"))
    check("no pending at EOF", s.sse.pending is None and s.sse.tail == "")
    # keep-alive: second request on the same socket
    c.send("POST", "/v1/chat/completions", chat_body("again", stream=False))
    r2 = c.read_response()
    eq("keepalive second", r2.json["choices"][0]["message"]["content"], expected_text("again"))
    c.close()
    st = get_stats(port)[-2:]
    eq("same conn", st[0]["conn"], st[1]["conn"])
    eq("conn_req", (st[0]["conn_req"], st[1]["conn_req"]), (1, 2))
    eq("bytes_sent = wire", st[0]["bytes_sent"], r.wire)


def t_usage(port, srv):
    r = chat(port, usage=True)
    s = summarize(r)
    check_stream_shape("include_usage", s, expected_text("hello world"))
    eq("one usage chunk", len(s.usage_chunks), 1)
    pt = ptoks("be brief" + "hello world")
    eq("usage values", s.usage_chunks[0]["usage"],
       {"prompt_tokens": pt, "completion_tokens": 16, "total_tokens": pt + 16})
    check("usage chunk before DONE", s.chunks[-1] is s.usage_chunks[0])
    check("others usage null", all(c_["usage"] is None for c_ in s.chunks[:-1]))
    s = summarize(chat(port, "usage=never", usage=True))
    eq("never", s.usage_chunks, [])
    s = summarize(chat(port, "usage=always"))
    eq("always", len(s.usage_chunks), 1)
    s = summarize(chat(port, "usage=continuous;tokens=4"))
    eq("continuous per-chunk",
       [c_["usage"]["completion_tokens"] for c_ in s.chunks],
       [0, 1, 2, 3, 4, 4, 4])
    eq("continuous final", s.usage_chunks[-1]["usage"]["completion_tokens"], 4)
    r = chat(port, "prompt_truncate_to=2", prompt="x" * 400, stream=False)
    eq("prompt_truncate_to", r.json["usage"]["prompt_tokens"], 2)
    r = chat(port, "usage=never", stream=False)
    check("non-stream usage=never", "usage" not in r.json)


def t_echo_unicode(port, srv):
    p = "  spaced  out\tprompt " + "z" * 300
    s = summarize(chat(port, "reply=echo", prompt=p))
    eq("echo text", s.text, "echo: " + p[:200])
    eq("echo tokens", len(s.content_chunks), len(expected_tokens(p, reply="echo")))
    r = chat(port, "unicode=1;tokens=64", prompt="u")
    s = summarize(r)
    eq("unicode text", s.text, expected_text("u", 64, unicode=True))
    check("unicode raw utf8", any(b >= 0x80 for b in r.body))
    r = chat(port, "unicode=1;tokens=64;json_ascii=1", prompt="u")
    check("json_ascii body ascii", all(b < 0x80 for b in r.body))
    check("json_ascii surrogate pair", b"\\ud83d" in r.body)
    eq("json_ascii same text", summarize(r).text, expected_text("u", 64, unicode=True))
    r = chat(port, "unicode=1;tokens=64", prompt="u", stream=False)
    eq("unicode non-stream", r.json["choices"][0]["message"]["content"],
       expected_text("u", 64, unicode=True))


def t_chunking(port, srv):
    s = summarize(chat(port, "tokens=10;chunk_tokens=4"))
    eq("chunk_tokens sizes", [len(c_["choices"][0]["delta"]["content"].split())
                              for c_ in s.content_chunks], [4, 4, 2])
    eq("chunk_tokens text", s.text, expected_text("hello world", 10))
    r = chat(port, "write_bytes=7")
    sizes = [len(c_) for c_ in r.chunks]
    check("write_bytes chunk sizes", all(n == 7 for n in sizes[:-1]) and 0 < sizes[-1] <= 7,
          sizes[:20])
    check_stream_shape("write_bytes", summarize(r), expected_text("hello world"))
    r = chat(port, "write_bytes=1;eol=crlf;tokens=3")
    check("write_bytes=1 splits CRLF", all(len(c_) == 1 for c_ in r.chunks) and
          b"\r" in r.chunks and b"\n" in r.chunks)
    check_stream_shape("write_bytes=1", summarize(r), expected_text("hello world", 3))
    r = chat(port, "write_bytes=10", stream=False)
    eq("write_bytes non-stream", r.json["choices"][0]["message"]["content"],
       expected_text("hello world"))
    r = chat(port, "write_bytes=random")
    sizes = [len(c_) for c_ in r.chunks]
    check("random sizes", all(1 <= n <= 16 for n in sizes) and len(set(sizes)) > 3, sizes[:20])
    check_stream_shape("random", summarize(r), expected_text("hello world"))
    r = chat(port, "unicode=1;split_utf8=1;tokens=32", prompt="s")
    bad = 0
    for c_ in r.chunks:
        try:
            c_.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    check("split_utf8 produces non-UTF-8 pieces", bad > 5, bad)
    check_stream_shape("split_utf8", summarize(r), expected_text("s", 32, unicode=True))
    # write_gap_ms spaces the pieces out in time
    r = chat(port, "write_bytes=200;write_gap_ms=100;tokens=4")
    span = r.chunk_times[-1] - r.chunk_times[0]
    check("write_gap_ms", span >= 0.9 * 0.01 * (len(r.chunks) - 1), span)


def t_eol(port, srv):
    for eol, ok in (("crlf", lambda b: b.count(b"\r\n") == b.count(b"\n") == b.count(b"\r")),
                    ("cr", lambda b: b"\n" not in b and b"\r\r" in b),
                    ("lf", lambda b: b"\r" not in b)):
        r = chat(port, "eol=" + eol)
        check("eol %s raw" % eol, ok(r.body))
        check_stream_shape("eol " + eol, summarize(r), expected_text("hello world"))
    r = chat(port, "eol=mixed")
    b = r.body
    check("mixed has all", b"\r\n\r\n" in b and b"\r\r" in b and b"}\n\n" in b)
    check_stream_shape("eol mixed", summarize(r), expected_text("hello world"))


def t_sse_extras(port, srv):
    r = chat(port, "ttft_ms=500;ping_ms=100;tokens=3")
    s = summarize(r)
    check("pings", len(s.sse.comments) >= 3 and set(s.sse.comments) == {"ping"},
          s.sse.comments)
    first_content = r.body.index(b'"content":"', r.body.index(b'"content":"') + 1)
    check("pings before first token", r.body.count(b": ping", 0, first_content) >= 3)
    check_stream_shape("ping", s, expected_text("hello world", 3))
    r = chat(port, "ttft_ms=300;ping_ms=100;ping_text=keepalive%20now;tokens=1")
    check("ping_text", ": keepalive now" in r.body.decode())
    r = chat(port, "event_lines=1;tokens=3")
    s = summarize(r)
    check("event lines", all(e["event"] == "message" for e in s.sse.events))
    eq("ids", [e["id"] for e in s.sse.events], [str(i) for i in range(1, len(s.sse.events) + 1)])
    check("retry line", r.body.startswith(b"retry: 3000\n"))
    check_stream_shape("event_lines", s, expected_text("hello world", 3))
    r = chat(port, "multiline_data=1;tokens=3")
    s = summarize(r)
    check("multiline", r.body.count(b'\ndata: "choices":') == len(s.chunks))
    check_stream_shape("multiline", s, expected_text("hello world", 3))
    r = chat(port, "bom=1;tokens=3")
    check("bom", r.body.startswith(b"\xef\xbb\xbfdata: "))
    check_stream_shape("bom", summarize(r), expected_text("hello world", 3))
    s = summarize(chat(port, "role_content=null;tokens=2"))
    eq("role null", s.chunks[0]["choices"][0]["delta"], {"role": "assistant", "content": None})
    s = summarize(chat(port, "role_content=absent;tokens=2"))
    eq("role absent", s.chunks[0]["choices"][0]["delta"], {"role": "assistant"})
    r = chat(port, "line_bytes=200000;tokens=3")
    lines = r.body.split(b"\n")
    eq("line_bytes", max(len(x) for x in lines), 200000)
    check_stream_shape("line_bytes", summarize(r), expected_text("hello world", 3))
    r = chat(port, "line_bytes=5000", stream=False)
    check("line_bytes non-stream", len(r.body) == 5000 and r.json["pad"].startswith("xx"))
    r = chat(port, "content_type=text/plain%3B%20charset=utf-8;tokens=1")
    eq("content_type", r.headers.get("content-type"), "text/plain; charset=utf-8")
    r = chat(port, "garbage=2;tokens=4")
    s = summarize(r)
    eq("garbage", s.nonjson, ["{this is not json"])
    eq("garbage position", s.sse.events[3]["data"], "{this is not json")
    eq("garbage text intact", s.text, expected_text("hello world", 4))
    r = chat(port, "garbage=0", stream=False)
    check("garbage non-stream", r.status == 200 and r.json is None and
          r.body.startswith(b"this is not json"))


def t_quirks(port, srv):
    r = chat(port, "content_type=none;tokens=2")
    eq("no content-type", r.headers.get("content-type"), None)
    check_stream_shape("no content-type", summarize(r), expected_text("hello world", 2))
    p = "a \U0001F600 b"
    s = summarize(chat(port, "reply=echo;split_surrogates=1", prompt=p))
    halves = [c["choices"][0]["delta"]["content"] for c in s.content_chunks]
    check("surrogate halves", "\ud83d" in halves and any(h.startswith("\ude00")
                                                          for h in halves))
    eq("surrogates joined", s.text.encode("utf-16", "surrogatepass").decode("utf-16"),
       "echo: " + p)
    s = summarize(chat(port, "empty_choices=1;tokens=3;usage=never"))
    eq("empty choices", len([c for c in s.chunks if c.get("choices") == []]), 4)
    eq("empty choices text", s.text, expected_text("hello world", 3))
    r = chat(port, "stream_reply=0;tokens=2")
    check("stream_reply=0", r.json["object"] == "chat.completion" and
          r.json["choices"][0]["message"]["content"] == expected_text("hello world", 2))
    r = chat(port, "status=403;err_body=error_message;err_msg=why")
    eq("error_message body", r.json, {"error": "Forbidden", "message": "why"})


def t_finish_done(port, srv):
    s = summarize(chat(port, "finish_style=merged;tokens=3"))
    eq("merged finish", s.finish, ["stop"])
    check("merged on content", s.content_chunks[-1]["choices"][0]["finish_reason"] == "stop")
    eq("merged chunk count", len(s.chunks), 4)
    s = summarize(chat(port, "finish_style=none;tokens=3"))
    eq("none finish", s.finish, [])
    check("none done", s.done)
    s = summarize(chat(port, "finish_reason=length;tokens=3"))
    eq("finish_reason override", s.finish, ["length"])
    r = chat(port, "done=no;tokens=2")
    s = summarize(r)
    check("done=no", not s.done and r.end == "complete" and r.body.endswith(b"}\n\n"))
    r = chat(port, "done=no_blank_line;tokens=2")
    s = summarize(r)
    check("done=no_blank_line raw", r.body.endswith(b"}\n\ndata: [DONE]\n"))
    check("done=no_blank_line pending", not s.done and s.sse.pending == "[DONE]")
    r = chat(port, "done=no_eol;tokens=2")
    check("done=no_eol raw", r.body.endswith(b"\n\ndata: [DONE]"))
    eq("done=no_eol tail", sse_parse(r.body).tail, "data: [DONE]")


def t_tools_reasoning(port, srv):
    r = chat(port, "tool_calls=2;tokens=0;tool_frag_bytes=5", prompt="weather?")
    s = summarize(r)
    calls = {}
    first = {}
    for c_ in s.chunks:
        for ch in c_["choices"]:
            for tc in ch["delta"].get("tool_calls", []):
                i = tc["index"]
                if "id" in tc:
                    first[i] = (tc["id"], tc["function"]["name"])
                calls[i] = calls.get(i, "") + tc["function"].get("arguments", "")
    eq("tool ids", first, {0: ("call_fake_0", "fn_0"), 1: ("call_fake_1", "fn_1")})
    eq("tool args", [json.loads(calls[i]) for i in (0, 1)],
       [{"i": 0, "q": "weather?"}, {"i": 1, "q": "weather?"}])
    eq("tool finish", s.finish, ["tool_calls"])
    frag = [len(tc["function"]["arguments"]) for c_ in s.chunks for ch in c_["choices"]
            for tc in ch["delta"].get("tool_calls", []) if "id" not in tc]
    check("tool fragments <= 5", frag and max(frag) <= 5, frag)
    s = summarize(chat(port, "tool_calls=1;tokens=0;tool_whole=1", prompt="w"))
    tcs = [tc for c_ in s.chunks for ch in c_["choices"] for tc in ch["delta"].get(
        "tool_calls", [])]
    eq("tool_whole", tcs, [{"index": 0, "id": "call_fake_0", "type": "function",
                            "function": {"name": "fn_0", "arguments": '{"i":0,"q":"w"}'}}])
    r = chat(port, "tool_calls=1;tokens=0", prompt="w", stream=False)
    m = r.json["choices"][0]["message"]
    check("tool non-stream", m["content"] is None and
          m["tool_calls"][0]["function"]["arguments"] == '{"i":0,"q":"w"}')
    s = summarize(chat(port, "reasoning_field=reasoning_content;reasoning_tokens=3;tokens=2",
                       usage=True))
    rs = [c_["choices"][0]["delta"].get("reasoning_content") for c_ in s.chunks[1:4]]
    eq("reasoning deltas", rs, ["think "] * 3)
    eq("reasoning usage", s.usage_chunks[0]["usage"]["completion_tokens"], 5)
    eq("reasoning text", s.text, expected_text("hello world", 2))


ERR_SHAPES = {
    "openai": lambda j, st: j["error"]["message"] and "type" in j["error"],
    "vllm": lambda j, st: j["error"]["code"] == st,
    "vllm_flat": lambda j, st: j["object"] == "error" and j["code"] == st,
    "ollama_str": lambda j, st: isinstance(j["error"], str),
    "anthropic": lambda j, st: j["type"] == "error" and j["error"]["type"],
}


def t_errors(port, srv):
    for fmt, ok in ERR_SHAPES.items():
        r = chat(port, "status=503;err_body=" + fmt)
        check("err %s" % fmt, r.status == 503 and r.json is not None and ok(r.json, 503),
              r.body[:200])
    r = chat(port, "status=502;err_body=html")
    check("err html", r.status == 502 and r.headers["content-type"] == "text/html" and
          r.body.startswith(b"<html>"))
    r = chat(port, "status=504;err_body=empty")
    check("err empty", r.status == 504 and r.body == b"" and
          r.headers["content-length"] == "0")
    r = chat(port, "status=429;ra=2;ra_ms=1500;should_retry=false;code=insufficient_quota")
    eq("429 headers", (r.status, r.headers.get("retry-after"), r.headers.get("retry-after-ms"),
                       r.headers.get("x-should-retry")), (429, "2", "1500", "false"))
    eq("insufficient_quota", (r.json["error"]["code"], r.json["error"]["type"]),
       ("insufficient_quota", "insufficient_quota"))
    check("err is not SSE", r.headers["content-type"] == "application/json")
    r = chat(port, "status=529;err_body=anthropic")
    eq("529 anthropic", (r.status, r.json["error"]["type"]), (529, "overloaded_error"))
    r = chat(port, "status=503;ra_date=30")
    d = email.utils.parsedate_to_datetime(r.headers["retry-after"]).timestamp()
    check("ra_date", 27 <= d - time.time() <= 33, d - time.time())
    r = chat(port, "status=400;err_msg=too%20long;etype=invalid_request_error;"
             "code=context_length_exceeded", stream=False)
    eq("err_msg/etype/code", r.json["error"], {"message": "too long",
                                               "type": "invalid_request_error",
                                               "param": None,
                                               "code": "context_length_exceeded"})
    key = "sk-fake-0123456789abcdef"
    r = call(port, "POST", "/v1/chat/completions", chat_body(stream=False),
             {"X-Fake-Scenario": "status=401;err_quote_key=full",
              "Authorization": "Bearer " + key})
    check("err_quote_key full", r.status == 401 and
          r.json["error"]["message"].startswith("Incorrect API key provided: %s. " % key),
          r.body[:200])
    r = call(port, "POST", "/v1/chat/completions", chat_body(stream=False),
             {"X-Fake-Scenario": "status=401;err_quote_key=masked",
              "Authorization": "Bearer " + key})
    check("err_quote_key masked", r.status == 401 and
          ("provided: sk-fake-" + "*" * 12 + "cdef. ") in r.json["error"]["message"],
          r.body[:200])
    r = chat(port, "rl_headers=1;tokens=1")
    check("rl_headers", all(("x-ratelimit-%s-%s" % (a, b)) in r.headers
                            for a in ("limit", "remaining", "reset")
                            for b in ("requests", "tokens")), r.headers)
    st = last_stat(port)
    eq("status in stats", st["status"], 200)
    r = chat(port, "status=500", stream=False)
    eq("stats error status", last_stat(port)["status"], 500)
    r = chat(port, "bogus_knob=1")
    check("unknown knob -> 400", r.status == 400 and "bogus_knob" in r.json["error"]["message"])
    r = chat(port, "tokens=abc")
    eq("bad value -> 400", r.status, 400)


def t_rate_limit(port, srv):
    post(port, "/__reset", {})
    eq("config", post(port, "/__config", {"rpm": 2}).json["rpm"], 2)
    a = chat(port, stream=False)
    b = chat(port, stream=False)
    c = chat(port, stream=False)
    eq("rpm statuses", (a.status, b.status, c.status), (200, 200, 429))
    ms = int(c.headers["retry-after-ms"])
    check("rpm retry-after-ms within scaled window", 0 < ms <= 6000, ms)
    eq("rpm remaining", c.headers["x-ratelimit-remaining-requests"], "0")
    check("rpm reset fmt", re.fullmatch(r"(\d+ms|[\d.]+s)", c.headers[
        "x-ratelimit-reset-requests"]), c.headers["x-ratelimit-reset-requests"])
    eq("rpm stats src", last_stat(port)["scenario_src"], "rate_limit")
    post(port, "/__config", {"rpm": 0, "tpm": 50})
    post(port, "/__reset", {})
    eq("reset clears config", chat(port, stream=False, max_tokens=10).status, 200)
    post(port, "/__config", {"tpm": 50})
    a = chat(port, stream=False, max_tokens=30)
    b = chat(port, stream=False, max_tokens=30)
    eq("tpm", (a.status, b.status), (200, 429))
    post(port, "/__reset", {})


def t_rate_bucket(port, srv):
    """rl_mode=bucket: a second's worth at once, then paced at limit/60 per second."""
    post(port, "/__reset", {})
    eq("bad mode", post(port, "/__config", {"rl_mode": "leaky"}).status, 400)
    post(port, "/__config", {"rpm": 120, "rl_mode": "bucket"})  # 2 a (scaled) second
    st = [chat(port, stream=False).status for _ in range(4)]
    eq("bucket burst", st, [200] * 2 + [429] * 2)
    r = chat(port, stream=False)
    ms = int(r.headers["retry-after-ms"])
    check("bucket retry-after-ms: under half a second (scaled)",
          0 < ms <= 500 * SCALE + 1, ms)
    time.sleep(ms / 1000.0 + 0.005)
    eq("bucket refilled", chat(port, stream=False).status, 200)
    eq("bucket empty again", chat(port, stream=False).status, 429)
    # rl_headers=1: what is left in the bucket, and the time until it is full
    time.sleep(1.0 * SCALE + 0.05)
    a = chat(port, "rl_headers=1", stream=False)
    b = chat(port, "rl_headers=1", stream=False)
    eq("bucket headers: one left", a.headers["x-ratelimit-remaining-requests"], "1")
    eq("bucket headers: none left", b.headers["x-ratelimit-remaining-requests"], "0")
    check("bucket headers: full again in about a (scaled) second",
          re.fullmatch(r"\d+ms|[\d.]+s", b.headers["x-ratelimit-reset-requests"]),
          b.headers["x-ratelimit-reset-requests"])
    post(port, "/__reset", {})
    eq("reset: window mode", post(port, "/__config", {}).status, 200)
    eq("window after reset", [chat(port, stream=False).status for _ in range(6)], [200] * 6)


def t_fail(port, srv):
    r = chat(port, "fail_after_tokens=3;code=boom;tokens=8")
    s = summarize(r)
    eq("fail text", s.text, expected_text("hello world", 3))
    eq("fail error", [e["error"]["code"] for e in s.errors], ["boom"])
    check("fail no done", not s.done and r.end == "complete" and not s.finish)
    eq("fail stats", (last_stat(port)["ended"], last_stat(port)["tokens_sent"]),
       ("fail_event", 3))
    s = summarize(chat(port, "fail_after_tokens=2;fail_fmt=data_error_then_done"))
    check("error then done", len(s.errors) == 1 and s.done and
          json.loads(s.sse.events[-2]["data"])["error"])
    r = chat(port, "fail_after_tokens=1;fail_fmt=legacy_error_line")
    s = summarize(r)
    check("legacy error line", b"\n\nerror: {" in r.body and "error" in s.sse.fields and
          not s.errors and not s.done)
    s = summarize(chat(port, "fail_after_tokens=0"))
    check("fail at 0", s.text == "" and len(s.errors) == 1 and len(s.chunks) == 1)
    s = summarize(chat(port, "fail_after_tokens=999;tokens=4"))
    check("fail after all tokens", s.text == expected_text("hello world", 4) and
          not s.finish and s.errors)


def t_cut(port, srv):
    c = Client(port)
    c.send("POST", "/v1/chat/completions",
           chat_body(), {"X-Fake-Scenario": "cut_after_tokens=3;cut_mode=fin_clean"})
    r = c.read_response()
    s = summarize(r)
    check("fin_clean framing complete", r.end == "complete", r.end)
    check("fin_clean no finish/done", not s.finish and not s.done and
          s.text == expected_text("hello world", 3), s.text)
    c.send("POST", "/v1/chat/completions", chat_body(stream=False))
    r2 = c.read_response()
    eq("fin_clean keeps conn", r2.status, 200)
    c.close()
    eq("fin_clean stats", get_stats(port)[-2]["ended"], "cut_fin_clean")
    eq("fin_clean text_sent", get_stats(port)[-2]["text_sent"], expected_text("hello world", 3))

    r = chat(port, "cut_after_tokens=3")
    check("fin_raw eof", r.end == "eof" and summarize(r).text ==
          expected_text("hello world", 3), r.end)
    eq("fin_raw stats", last_stat(port)["ended"], "cut_fin_raw")

    r = chat(port, "cut_after_tokens=3;cut_mode=rst")
    eq("rst reset", r.end, "reset")
    eq("rst stats", last_stat(port)["ended"], "cut_rst")

    r = chat(port, "cut_after_tokens=3;cut_mode=close_delimited")
    s = summarize(r)
    check("close_delimited", r.framing == "close" and r.end == "close" and
          "transfer-encoding" not in r.headers and r.headers.get("connection") == "close")
    check("close_delimited content", s.text == expected_text("hello world", 3) and not s.done)
    eq("close_delimited stats", last_stat(port)["ended"], "cut_close")

    r = chat(port, "cut_after_bytes=100")
    eq("cut bytes exact", (len(r.body), r.end), (100, "eof"))
    r = chat(port, "cut_after_bytes=100;write_bytes=30")
    eq("cut bytes split", ([len(x) for x in r.chunks], r.end), ([30, 30, 30, 10], "eof"))
    r = chat(port, "cut_after_bytes=50", stream=False)
    check("non-stream cut", r.end == "eof" and len(r.body) == 50 and
          int(r.headers["content-length"]) > 50, (r.end, len(r.body)))
    r = chat(port, "cut_after_tokens=1", stream=False)
    check("non-stream cut tokens", r.end == "eof" and
          len(r.body) == int(r.headers["content-length"]) // 2)
    r = chat(port, "status=500;cut_after_bytes=10")
    check("error body cut", r.status == 500 and r.end == "eof" and len(r.body) == 10)


def wait_stat(port, seq, want, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        st = [e for e in get_stats(port) if e["seq"] == seq][0]
        if st["ended"] == want:
            return st
        time.sleep(0.02)
    return st


def t_stall(port, srv):
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(),
           {"X-Fake-Scenario": "stall_after_tokens=2"})
    r = c.read_response(timeout=0.5)
    s = summarize(r)
    check("stall timeout", r.end == "timeout" and s.text == expected_text("hello world", 2),
          (r.end, s.text))
    st = last_stat(port)
    eq("stall stats", st["ended"], "stalled")
    c.close()
    eq("stall client closed", wait_stat(port, st["seq"], "stall_client_closed")["ended"],
       "stall_client_closed")

    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(),
           {"X-Fake-Scenario": "stall_after_tokens=2;stall_pings=1;ping_ms=500"})
    r = c.read_response(timeout=0.4)
    s = summarize(r)
    check("stall pings", r.end == "timeout" and len(s.sse.comments) >= 4 and
          s.text == expected_text("hello world", 2), (r.end, len(s.sse.comments)))
    c.close()
    wait_stat(port, last_stat(port)["seq"], "stall_client_closed")

    t0 = time.monotonic()
    r = chat(port, "stall_after_tokens=2;stall_ms=3000;tokens=4")
    el = time.monotonic() - t0
    s = summarize(r)
    check_stream_shape("stall_ms resumes", s, expected_text("hello world", 4))
    gaps = [b - a for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    check("stall_ms gap", el >= 0.28 and max(gaps) >= 0.25, (el, gaps))
    r = chat(port, "stall_after_tokens=0", stream=False, timeout=0.3)
    check("non-stream stall: headers only", r.status == 200 and r.end == "timeout" and
          r.body == b"", (r.status, r.end))


def t_timing(port, srv):
    t0 = time.monotonic()
    r = chat(port, "latency_ms=3000;ttft_ms=2000;tokens=5;tps=2")
    head = r.t_head - t0
    first = r.chunk_times[0] - t0  # role chunk is sent with headers
    s = summarize(r)
    check("latency", 0.29 <= head, head)
    check("role chunk with headers", first - head < 1.0, first - head)
    st = last_stat(port)
    ttft = st["t_first_token"] - st["t_headers"]
    check("ttft", 0.19 <= ttft, ttft)
    # Only the lower bound: a loaded machine may be slower, never faster. The server
    # keeps a schedule from the request's start (ttft, then a gap a token): a first
    # token sent late is followed by the rest sooner, so the pacing is measured from
    # the headers, not from the first token.
    paced = st["t_end"] - st["t_headers"]
    check("tps pacing", 0.38 <= paced, paced)  # (2000 ms + 4 gaps * 500 ms) * 0.1
    check_stream_shape("timed", s, expected_text("hello world", 5))
    t0 = time.monotonic()
    r = chat(port, "latency_ms=1000;ttft_ms=1000;tps=20;tokens=5", stream=False)
    el = time.monotonic() - t0
    check("non-stream waits whole generation", 0.21 <= el, el)  # (1+1+4/20 s)*0.1
    a = chat(port, "jitter=50;tps=200;tokens=6")
    b = chat(port, "jitter=50;tps=200;tokens=6")
    eq("jitter text deterministic", summarize(a).text, summarize(b).text)
    r = chat(port, "header_delay_ms=2000;tokens=1", stream=False)
    check("header_delay_ms", r.t_head - r.t0 >= 0.19, r.t_head - r.t0)


def t_accept_delay(port, srv):
    c = Client(port)
    t0 = time.monotonic()
    c.send("POST", "/v1/chat/completions", chat_body(stream=False),
           {"X-Fake-Scenario": "accept_delay_ms=3000"}, expect100=True)
    r = c.read_response()
    c.close()
    check("100-continue delayed", r.got_100 is not None and r.got_100 - t0 >= 0.29,
          r.got_100 and r.got_100 - t0)
    eq("after 100", r.json["choices"][0]["message"]["content"], expected_text("hello world"))
    post(port, "/__config", {"defaults": "accept_delay_ms=3000"})
    t0 = time.monotonic()
    r = call(port, "GET", "/health")
    el = time.monotonic() - t0
    post(port, "/__config", {"defaults": ""})
    check("connection-level accept delay", el >= 0.29 and r.status == 200, el)


def t_hold(port, srv):
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(stream=False),
           {"X-Fake-Scenario": "hold=h1;status=503"})
    end = time.time() + 5
    while not [e for e in get_stats(port) if e["scenario"] == "hold=h1;status=503"]:
        check("held request arrives", time.time() < end)
        time.sleep(0.02)
    time.sleep(0.2)  # held, it stays so however long we look
    st = [e for e in get_stats(port) if e["scenario"] == "hold=h1;status=503"][0]
    eq("held: no headers yet", (st["ended"], st["t_headers"]), ("in_progress", None))
    eq("release", post(port, "/__release", {"name": "h1"}).json, {"ok": True, "name": "h1"})
    r = c.read_response()
    c.close()
    eq("released answer", r.status, 503)
    r = chat(port, "hold=h1;tokens=2", stream=False)
    eq("a released name holds no more", (r.status, r.end == "timeout"), (200, False))
    eq("release without a name", post(port, "/__release", {}).status, 400)


def t_concurrency(port, srv):
    post(port, "/__reset", {})
    eq("concurrency after reset", call(port, "GET", "/__concurrency").json,
       {"inflight": 0, "peak": 0, "held": {}})
    cs = []
    for i in range(3):
        c = Client(port)
        c.send("POST", "/v1/chat/completions", chat_body(stream=False),
               {"X-Fake-Scenario": "hold=cc;tokens=2"})
        cs.append(c)
    end = time.time() + 5
    while call(port, "GET", "/__concurrency").json["inflight"] < 3:
        check("three held requests in flight", time.time() < end)
        time.sleep(0.02)
    eq("three in flight", call(port, "GET", "/__concurrency").json,
       {"inflight": 3, "peak": 3, "held": {"cc": 3}})
    post(port, "/__reset", {})  # releases them; the peak counts only later calls
    for c in cs:
        eq("held answer", c.read_response().status, 200)
        c.close()
    r = chat(port, "tokens=2", stream=False)
    eq("one more", r.status, 200)
    cc = call(port, "GET", "/__concurrency").json
    eq("none in flight, peak kept", (cc["inflight"], 1 <= cc["peak"] <= 3), (0, True))
    eq("none held once released", cc["held"], {})


def t_framing(port, srv):
    r = chat(port, "framing=close", stream=False)
    check("close non-stream", r.framing == "close" and r.end == "close" and
          r.json["choices"][0]["message"]["content"] == expected_text("hello world"))
    r = chat(port, "framing=close")
    check("close stream", r.framing == "close" and r.end == "close")
    check_stream_shape("close stream", summarize(r), expected_text("hello world"))
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(stream=False),
           {"X-Fake-Scenario": "keepalive=0"})
    r = c.read_response()
    eq("keepalive=0 header", r.headers.get("connection"), "close")
    check("keepalive=0 closes", c.sock.recv(10) == b"")
    c.close()
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(), version="HTTP/1.0")
    r = c.read_response()
    check("HTTP/1.0 close-delimited", r.framing == "close" and
          summarize(r).text == expected_text("hello world"))
    c.close()
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(stream=False), chunked_body=True)
    r = c.read_response()
    eq("chunked request body", r.json["choices"][0]["message"]["content"],
       expected_text("hello world"))
    c.send("POST", "/v1/chat/completions", chat_body(stream=False), {"Connection": "close"})
    r = c.read_response()
    check("Connection: close honoured", r.status == 200 and c.sock.recv(10) == b"")
    c.close()
    post(port, "/__config", {"defaults": "framing=close"})
    r = chat(port, stream=False)
    post(port, "/__config", {"defaults": ""})
    eq("framing via defaults", r.framing, "close")
    r = chat(port, "", stream=False, model="m", timeout=5)
    eq("framing default restored", r.framing, "length")


def t_completions(port, srv):
    r = call(port, "POST", "/v1/completions", {"model": "m", "prompt": "once upon",
                                               "max_tokens": 5})
    eq("completions object", r.json["object"], "text_completion")
    eq("completions text", r.json["choices"][0]["text"], expected_text("once upon"))
    r = call(port, "POST", "/v1/completions", {"model": "m", "prompt": ["list p", "x"],
                                               "stream": True,
                                               "stream_options": {"include_usage": True}},
             {"X-Fake-Scenario": "tokens=4"})
    s = summarize(r)
    eq("completions stream text", s.text, expected_text("list p", 4))
    eq("completions finish", s.finish, ["stop"])
    check("completions objects", all(c_["object"] == "text_completion" for c_ in s.chunks))
    check("completions usage", len(s.usage_chunks) == 1 and s.done)
    check("completions no role chunk", "delta" not in json.dumps(s.chunks))


def t_embeddings(port, srv):
    r = call(port, "POST", "/v1/embeddings", {"model": "e", "input": "abc"})
    eq("embed default dim", r.json["data"][0]["embedding"], expected_vec("abc", 16))
    r = call(port, "POST", "/v1/embeddings", {"model": "e", "input": ["abc", "def"],
                                              "dimensions": 5, "encoding_format": "base64"})
    vecs = [list(struct.unpack("<5f", base64.b64decode(d["embedding"])))
            for d in r.json["data"]]
    eq("embed base64", vecs, [expected_vec("abc", 5), expected_vec("def", 5)])
    eq("embed indexes", [d["index"] for d in r.json["data"]], [0, 1])
    eq("embed usage", r.json["usage"], {"prompt_tokens": 2, "total_tokens": 2})
    r = call(port, "POST", "/v1/embeddings", {"model": "e", "input": [1, 2, 3]},
             {"X-Fake-Scenario": "dim=4"})
    eq("embed token input", r.json["data"][0]["embedding"], expected_vec("[1,2,3]", 4))
    r = call(port, "POST", "/v1/embeddings", {"model": "e", "input": "x"},
             {"X-Fake-Scenario": "status=429;ra=1"})
    eq("embed error", (r.status, r.headers.get("retry-after")), (429, "1"))


def t_selection(port, srv):
    post(port, "/__reset", {})
    r = post(port, "/__script", {"model": "m1", "scenarios": ["status=429;ra=1",
                                                              "status=429", "tokens=2"]})
    eq("script queued", r.json["queued"], 3)
    post(port, "/__script", {"model": "*", "scenarios": ["tokens=7"]})
    eq("script GET", call(port, "GET", "/__script").json,
       {"m1": ["status=429;ra=1", "status=429", "tokens=2"], "*": ["tokens=7"]})
    r = chat(port, "tokens=3", model="m1", stream=False)
    eq("header wins, script untouched", r.json["usage"]["completion_tokens"], 3)
    r = chat(port, model="fake/tokens=4,chunk_tokens=2", stream=False)
    eq("model scenario", r.json["usage"]["completion_tokens"], 4)
    seq = [chat(port, model="m1", stream=False) for _ in range(4)]
    eq("script FIFO 429,429,ok", [x.status for x in seq], [429, 429, 200, 200])
    eq("script third", seq[2].json["usage"]["completion_tokens"], 2)
    eq("after exact queue: '*' used", seq[3].json["usage"]["completion_tokens"], 7)
    eq("then defaults", chat(port, model="m1", stream=False).json["usage"][
        "completion_tokens"], 16)
    r = chat(port, model="fake/plainname", stream=False)
    eq("fake/ without k=v is a plain model", r.json["usage"]["completion_tokens"], 16)
    st = get_stats(port)
    eq("sources", [e["scenario_src"] for e in st],
       ["header", "model", "script", "script", "script", "script", "default", "default"])
    eq("raw scenarios", [e["scenario"] for e in st][:6],
       ["tokens=3", "tokens=4,chunk_tokens=2", "status=429;ra=1", "status=429", "tokens=2",
        "tokens=7"])
    eq("knobs", st[1]["knobs"], {"tokens": 4, "chunk_tokens": 2})
    r = post(port, "/__script", {"model": "m", "scenarios": ["nope=1"]})
    eq("bad script rejected", r.status, 400)
    post(port, "/__script", {"model": "m2", "scenarios": ["tokens=1"]})
    post(port, "/__script", {"model": "m2", "scenarios": ["tokens=2"], "replace": True})
    eq("replace", call(port, "GET", "/__script").json.get("m2"), ["tokens=2"])
    post(port, "/__reset", {})
    eq("reset clears scripts", call(port, "GET", "/__script").json, {})


def t_stats(port, srv):
    post(port, "/__reset", {})
    eq("reset clears stats", get_stats(port), [])
    t0 = time.time()
    chat(port, "tokens=2", stream=False, prompt="stat me")
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(prompt="abort me"),
           {"X-Fake-Scenario": "tps=10;tokens=50", "X-Stainless-Retry-Count": "2"})
    time.sleep(0.15)
    c.close()
    st = get_stats(port)
    e = st[0]
    for k in ("seq", "t", "t_headers", "t_first_token", "t_end", "conn", "conn_req", "method",
              "path", "query", "headers", "body", "body_bytes", "model", "prompt", "stream",
              "scenario", "scenario_src", "knobs", "status", "bytes_sent", "tokens_sent",
              "text", "tokens", "text_sent", "ended"):
        check("field " + k, k in e)
    check("arrival time", t0 - 1 <= e["t"] <= time.time(), e["t"])
    eq("entry basics", (e["seq"], e["method"], e["path"], e["status"], e["ended"],
                        e["prompt"], e["stream"]),
       (1, "POST", "/v1/chat/completions", 200, "complete", "stat me", False))
    eq("body parsed", e["body"]["messages"][1]["content"], "stat me")
    eq("text + tokens", (e["text"], e["tokens"]),
       (expected_text("stat me", 2), expected_tokens("stat me", 2)))
    check("in progress / aborted visible", st[1]["ended"] in ("in_progress", "client_closed"))
    eq("request headers recorded", st[1]["headers"].get("x-stainless-retry-count"), "2")
    e2 = wait_stat(port, 2, "client_closed")
    eq("client abort", e2["ended"], "client_closed")
    check("partial tokens", 0 < e2["tokens_sent"] < 50, e2["tokens_sent"])
    eq("since", [x["seq"] for x in get_stats(port, since=2)], [2])
    c = Client(port)
    c.send("POST", "/v1/chat/completions", chat_body(),
           {"X-Fake-Scenario": "latency_ms=2000"})
    time.sleep(0.05)
    c.close()
    e3 = wait_stat(port, 3, "client_closed")
    check("closed before headers", e3["ended"] == "client_closed" and e3["bytes_sent"] == 0,
          (e3["ended"], e3["bytes_sent"]))
    check("control paths not logged", all(not x["path"].startswith("/__")
                                          for x in get_stats(port)))


# ---------------------------------------------------------------- throughput --------
def bench(n=1000, tps=0):
    srv = Server("--time-scale", "1", "--latency-ms", "1000", "--tokens", "32")
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    port = srv.port
    extra = "" if not tps else "X-Fake-Scenario: tps=%d\r\n" % tps

    async def one(i):
        body = json.dumps(chat_body("bench prompt %d" % i, usage=True)).encode()
        req = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               "application/json\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra)
               ).encode() + body
        rd, wr = await asyncio.open_connection("127.0.0.1", port)
        t1 = time.monotonic()
        wr.write(req)
        data = bytearray()
        while not data.endswith(b"\r\n0\r\n\r\n"):
            d = await rd.read(65536)
            if not d:
                break
            data += d
        wr.close()
        durs.append(time.monotonic() - t1)
        return bytes(data)

    async def run():
        t0 = time.monotonic()
        res = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        return time.monotonic() - t0, res

    durs = []
    try:
        wall, res = asyncio.run(run())
        st = get_stats(port)
        span = max(e["t_end"] for e in st) - min(e["t"] for e in st)
        durs.sort()
        ok = 0
        for i, d in enumerate(res):
            if isinstance(d, Exception):
                continue
            head, _, rest = d.partition(b"\r\n\r\n")
            body = b""
            while rest:
                ln, _, rest = rest.partition(b"\r\n")
                k = int(ln, 16)
                if k == 0:
                    break
                body += rest[:k]
                rest = rest[k + 2:]
            r = R()
            r.body = body
            s = summarize(r)
            if head.startswith(b"HTTP/1.1 200") and s.done and \
                    s.text == expected_text("bench prompt %d" % i, 32) and \
                    len(s.content_chunks) == 32 and s.usage_chunks:
                ok += 1
        errs = [repr(x) for x in res if isinstance(x, Exception)][:3]
        return wall, ok, errs, span, durs[len(durs) // 2], durs[-1]
    finally:
        srv.stop()


# ---------------------------------------------------------------- main --------------
TESTS = [t_basic, t_nonstream_chat, t_expected, t_stream_default, t_usage, t_echo_unicode,
         t_chunking, t_eol, t_sse_extras, t_quirks, t_finish_done, t_tools_reasoning, t_errors,
         t_rate_limit, t_rate_bucket, t_fail, t_cut, t_stall, t_timing, t_accept_delay, t_hold, t_concurrency,
         t_framing,
         t_completions, t_embeddings, t_selection, t_stats]


def main():
    global CURRENT, FAILED
    args = sys.argv[1:]
    filt = args[args.index("-k") + 1] if "-k" in args else None
    srv = Server("--time-scale", str(SCALE))
    try:
        for t in TESTS:
            if filt and filt not in t.__name__:
                continue
            CURRENT = t.__name__
            t0 = time.monotonic()
            try:
                t(srv.port, srv)
            except Exception:
                FAILED += 1
                print("FAIL %s: exception" % t.__name__)
                traceback.print_exc()
            print("  %-20s %.2fs" % (t.__name__, time.monotonic() - t0), flush=True)
    finally:
        out, err = srv.stop()
        CURRENT = "server"
        eq("no further stdout", out, b"")
        check("no stderr", err == b"", err[-2000:])
    if "--no-bench" not in args and not filt:
        CURRENT = "bench"
        for tps in (0, 64):
            wall, ok, errs, span, med, mx = bench(1000, tps)
            print("bench: 1000 concurrent streams, latency 1000 ms, 32 tokens, tps=%s: "
                  "wall %.2f s (incl. client connects); server first-arrival..last-end "
                  "%.2f s; per-stream median %.2f s, max %.2f s; %d/1000 correct"
                  % (tps or "inf", wall, span, med, mx, ok), flush=True)
            eq("bench tps=%d all correct" % tps, ok, 1000)
            if errs:
                print("  errors:", errs)
    print("fake_llm: %d passed, %d failed" % (PASSED, FAILED))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
