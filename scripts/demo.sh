#!/usr/bin/env bash
# demo.sh -- the main job end to end: local RabbitMQ and Redis, the fake LLM
# server, a celeriac worker, and a plain Python Celery producer that sends a
# batch of prompts and prints the answers as they complete.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${CELERIAC_DEMO_DIR:-$root/build/demo}
mkdir -p "$dir"

echo "== starting RabbitMQ and Redis (private instances under $dir)"
bash scripts/services.sh start "$dir" >/dev/null
. "$dir/env"
broker="amqp://guest:guest@127.0.0.1:$AMQP_PORT//"
backend="redis://127.0.0.1:$REDIS_PORT/0"

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -z "${CELERIAC_DEMO_KEEP:-}" ]; then
        bash scripts/services.sh stop "$dir" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

echo "== starting the fake OpenAI-compatible server (300 ms latency, 40 tokens/s)"
/usr/bin/python3 scripts/fake_llm.py --port 0 --latency-ms 300 --tps 40 --tokens 24 \
    > "$dir/fake.port" 2>"$dir/fake.log" &
pids+=($!)
for _ in $(seq 1 50); do grep -q PORT "$dir/fake.port" 2>/dev/null && break; sleep 0.1; done
llm_port=$(sed -n 's/PORT //p' "$dir/fake.port")

echo "== starting the celeriac worker (-c 200)"
OPENAI_BASE_URL="http://127.0.0.1:$llm_port/v1" OPENAI_API_KEY=demo \
    ./build/celeriac worker -b "$broker" --result-backend "$backend" -c 200 -E \
    --task-alias tasks.summarize=llm.generate > "$dir/worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q " ready\." "$dir/worker.log" && break; sleep 0.1; done
grep -q " ready\." "$dir/worker.log" || { cat "$dir/worker.log"; exit 1; }
echo "   worker log: $dir/worker.log"

echo "== a Python Celery producer sends 50 prompts; answers print as they complete"
BROKER="$broker" BACKEND="$backend" /usr/bin/python3 - <<'PY'
import os, time
from celery import Celery
from celery.result import ResultSet

app = Celery("demo", broker=os.environ["BROKER"], backend=os.environ["BACKEND"])
topics = ["quantum computing", "the water cycle", "compound interest", "photosynthesis",
          "TCP handshakes", "black holes", "vaccines", "the printing press", "jazz", "DNA"]
t0 = time.time()
results = []
for i in range(50):
    topic = topics[i % len(topics)]
    if i % 5 == 4:   # an existing Python task name, run by celeriac through --task-alias
        r = app.send_task("tasks.summarize", args=["Summarize %s" % topic])
    else:
        r = app.send_task("llm.generate", args=["Explain %s (#%d)" % (topic, i)],
                          kwargs={"max_tokens": 64, "system": "Be brief."})
    results.append((i, r))
pending = dict(results)
while pending:
    for i, r in list(pending.items()):
        if r.ready():
            text = r.get()
            print("%5.2fs  #%02d  %s..." % (time.time() - t0, i, text[:60]))
            del pending[i]
    time.sleep(0.02)
chat = app.send_task("llm.chat", args=[[{"role": "user", "content": "Say hi"}]]).get(timeout=30)
print("chat   ->", {k: chat[k] for k in ("model", "finish_reason", "usage")})
emb = app.send_task("llm.embed", args=[["a", "b"]]).get(timeout=30)
print("embed  -> %d vectors of %d floats" % (len(emb), len(emb[0])))
print("50 prompts answered in %.2fs by one celeriac process" % (time.time() - t0))
PY
echo "== done (set CELERIAC_DEMO_KEEP=1 to leave RabbitMQ and Redis running)"
