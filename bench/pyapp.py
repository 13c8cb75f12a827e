"""pyapp.py -- the Python Celery 5 side of `make bench`: the same tasks on the same broker,
backend and fake LLM server as celeriac.

    cd bench && BENCH_BROKER=amqp://... BENCH_BACKEND=redis://... \
        OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 \
        /usr/bin/python3 -m celery -A pyapp worker -P prefork|solo|threads|gevent ...

celery.accumulate is Celery's own built-in. llm.generate makes the call
celeriac makes: a streamed POST /chat/completions (requests, one pooled
session per process, so connections are reused as libcurl reuses them),
reading the SSE events and joining the text deltas. Everything else is
Celery's defaults. "BENCH-READY" goes to stderr when the worker is consuming,
because the "ready." line is only logged at INFO.
"""
import json
import os
import sys

from celery import Celery, signals

app = Celery("pyapp", broker=os.environ.get("BENCH_BROKER", "amqp://guest:guest@127.0.0.1//"),
             backend=os.environ.get("BENCH_BACKEND", "redis://127.0.0.1:6379/1"))
app.conf.update(result_expires=86400, broker_connection_retry_on_startup=True)
# The SQS section passes kombu's transport options (region, endpoint's scheme,
# wait_time_seconds) as JSON; the other brokers need none.
if os.environ.get("BENCH_TRANSPORT_OPTIONS"):
    app.conf.broker_transport_options = json.loads(os.environ["BENCH_TRANSPORT_OPTIONS"])

# The fleet section (issue 38): Celery's own rate_limit on the LLM task, one
# share of the provider's limit per worker.
if os.environ.get("BENCH_RATE_LIMIT"):
    app.conf.task_annotations = {"llm.generate": {"rate_limit": os.environ["BENCH_RATE_LIMIT"]}}

BASE = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
_session = None


def session():
    # Created lazily so that each prefork child gets its own, after the fork.
    global _session
    if _session is None:
        import requests
        from requests.adapters import HTTPAdapter
        s = requests.Session()
        s.mount("http://", HTTPAdapter(pool_connections=4, pool_maxsize=20000))
        _session = s
    return _session


@app.task(name="llm.generate")
def generate(prompt, model=None, system=None, template=None, **params):
    if template:
        prompt = template.replace("{input}", prompt)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    body = dict(params, model=model or "gpt-4o-mini", messages=messages, stream=True,
                stream_options={"include_usage": True})
    text = []
    with session().post(BASE + "/chat/completions", json=body, stream=True, timeout=300,
                        headers={"Accept": "text/event-stream"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            for choice in json.loads(data).get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
    return "".join(text)


@signals.worker_ready.connect
def _ready(**kwargs):
    sys.stderr.write("BENCH-READY\n")
    sys.stderr.flush()
