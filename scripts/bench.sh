#!/usr/bin/env bash
# bench.sh -- `make bench`: celeriac against Python Celery, same machine, same run.
#
#   scripts/bench.sh                 full run (about ten minutes)
#   BENCH_QUICK=1 scripts/bench.sh   small workloads, under three minutes (checks the harness)
#   BENCH_DOC=docs/benchmarks.md     also write the table and chart into that page
#   BENCH_ONLY=dispatch,latency      a subset: limits dispatch concurrency memory latency cpu
#   BENCH_IMPL=celeriac              skip the Python runs
#
# Starts private RabbitMQ and Redis instances (scripts/services.sh) and the fast
# fake LLM server in a temporary directory, and stops all of them at the end,
# whatever happens. Results: build/bench/out/{results.json,table.md,bench.png}.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${BENCH_OUT:-$root/build/bench/out}
dir=$(mktemp -d /tmp/celeriac-bench.XXXXXX)
cleanup() {
    bash "$root/scripts/services.sh" stop "$dir" >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Thousands of sockets per process (the worker and libcurl raise their own
# soft limit too; Python and the tools inherit this one).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

for t in build/celeriac build/bench/fake_fast build/bench/publish build/bench/consume_ack \
         build/bench/redis_limit build/bench/idle_streams; do
    [ -x "$t" ] || { echo "bench: $t missing: run 'make all bench-tools'" >&2; exit 1; }
done
bash scripts/services.sh start "$dir" >/dev/null || { echo "bench: cannot start services" >&2; exit 1; }

/usr/bin/python3 bench/run.py "$dir" "$out" || exit 1
/usr/bin/python3 bench/report.py "$out" ${BENCH_DOC:+"$BENCH_DOC"}
