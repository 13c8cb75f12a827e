"""A small OTLP/HTTP trace receiver for the tests: POST /v1/traces in
http/json or http/protobuf, each span kept as a plain dict. The protobuf is
read with the few lines of wire-format decoding below (opentelemetry-proto
cannot be installed here), so the worker's encoder is checked against an
independent reader, not against itself."""
import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """Yields (field number, wire type, value) of one message."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v = struct.unpack_from("<Q", b, i)[0]
            i += 8
        elif wt == 5:
            v = struct.unpack_from("<I", b, i)[0]
            i += 4
        elif wt == 2:
            n, i = _varint(b, i)
            v = bytes(b[i:i + n])
            assert len(v) == n, "length past the end"
            i += n
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def _any(b):
    for num, _, v in fields(b):
        if num == 1:
            return v.decode()
        if num == 3:
            return v - (1 << 64) if v >= 1 << 63 else v
        if num == 5:  # ArrayValue { AnyValue values = 1 }
            return [_any(x) for n, _, x in fields(v) if n == 1]
    return None


def _kv(b):
    key = val = None
    for num, _, v in fields(b):
        if num == 1:
            key = v.decode()
        elif num == 2:
            val = _any(v)
    return key, val


def _span_pb(b):
    s = {"attributes": {}, "status": {"code": 0}}
    for num, _, v in fields(b):
        if num == 1:
            s["traceId"] = v.hex()
        elif num == 2:
            s["spanId"] = v.hex()
        elif num == 3:
            s["traceState"] = v.decode()
        elif num == 4:
            s["parentSpanId"] = v.hex()
        elif num == 5:
            s["name"] = v.decode()
        elif num == 6:
            s["kind"] = v
        elif num == 7:
            s["start"] = v
        elif num == 8:
            s["end"] = v
        elif num == 9:
            k, val = _kv(v)
            s["attributes"][k] = val
        elif num == 15:
            for n2, _, v2 in fields(v):
                if n2 == 2:
                    s["status"]["message"] = v2.decode()
                elif n2 == 3:
                    s["status"]["code"] = v2
        elif num == 16:
            s["flags"] = v
    return s


def decode_protobuf(body):
    """ExportTraceServiceRequest -> (resource attributes, [span])."""
    res, spans = {}, []
    for num, _, rs in fields(body):
        assert num == 1
        for n2, _, v in fields(rs):
            if n2 == 1:
                res.update(_kv(a) for n3, _, a in fields(v) if n3 == 1)
            elif n2 == 2:
                spans += [_span_pb(sp) for n3, _, sp in fields(v) if n3 == 2]
    return res, spans


def _anyj(v):
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_anyj(x) for x in v["arrayValue"].get("values", [])]
    return None


def decode_json(body):
    doc = json.loads(body)
    res, spans = {}, []
    for rs in doc["resourceSpans"]:
        res.update((a["key"], _anyj(a["value"])) for a in rs["resource"]["attributes"])
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                s = dict(sp)
                s["attributes"] = {a["key"]: _anyj(a["value"]) for a in sp.get("attributes", [])}
                s["start"] = int(sp["startTimeUnixNano"])
                s["end"] = int(sp["endTimeUnixNano"])
                s.setdefault("status", {}).setdefault("code", 0)
                spans.append(s)
    return res, spans


class Receiver:
    def __init__(self, status=200):
        self.status = status
        self.spans = []
        self.requests = []  # (path, content-type, headers)
        self.resource = {}
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ctype = self.headers.get("Content-Type", "")
                with outer.lock:
                    outer.requests.append((self.path, ctype, dict(self.headers)))
                if outer.status != 200:
                    self.send_response(outer.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if ctype == "application/x-protobuf":
                    res, spans = decode_protobuf(body)
                    reply, rtype = b"", "application/x-protobuf"
                else:
                    res, spans = decode_json(body)
                    reply, rtype = b"{}", "application/json"
                with outer.lock:
                    outer.resource.update(res)
                    outer.spans += spans
                self.send_response(200)
                self.send_header("Content-Type", rtype)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, name):
        with self.lock:
            return [s for s in self.spans if s.get("name") == name]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
