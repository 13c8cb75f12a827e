#!/usr/bin/env bash
# bench.sh -- `make bench`: celeriac against Python Celery, same machine, same run.
#
#   scripts/bench.sh                 full run (about ten minutes)
#   BENCH_QUICK=1 scripts/bench.sh   small workloads, under three minutes (checks the harness)
#   BENCH_DOC=docs/benchmarks.md     also write the table and chart into that page
#   BENCH_ONLY=dispatch,latency      a subset: limits dispatch concurrency memory latency cpu canvas
#                                    redis (dispatch and concurrency over the Redis broker, db 2,
#                                    beside the AMQP figures, and the bare Redis loop)
#                                    tls (10,000 one-second calls through a private nginx,
#                                    TLS and HTTP/2, against plain HTTP; RSS per stream)
#                                    sqs (dispatch and the 1 s LLM workload over Amazon SQS,
#                                    on a local emulator started and stopped by run.py)
#                                    fleet (three workers, 1,000 short calls, a provider
#                                    enforcing 1,200 rpm: limits shared in Redis, none,
#                                    and Python Celery's rate_limit split three ways)
#   BENCH_IMPL=celeriac              skip the Python runs
#   BENCH_BASELINE=<git rev>         A/B instead: this tree's build/celeriac against the
#                                    worker built from <rev>, alternating, same run
#                                    (bench/ab.py; BENCH_ONLY=dispatch or memory)
#
# Starts private RabbitMQ and Redis instances (scripts/services.sh) and the fast
# fake LLM server in a temporary directory, and stops all of them at the end,
# whatever happens. Results: build/bench/out/{results.json,table.md,bench.png}
# (A/B: results.json with the key "ab", and table.md).
#
# The baseline is built in a temporary git worktree (git worktree add --detach), with
# that revision's own Makefile, and the worktree is removed as soon as its binary is
# copied out (and again on exit, should the build fail or be interrupted).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
out=${BENCH_OUT:-$root/build/bench/out}
dir=$(mktemp -d /tmp/celeriac-bench.XXXXXX)
base_wt=""
cleanup() {
    bash "$root/scripts/services.sh" stop "$dir" >/dev/null 2>&1
    [ -n "$base_wt" ] && git -C "$root" worktree remove --force "$base_wt" >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Thousands of sockets per process (the worker and libcurl raise their own
# soft limit too; Python and the tools inherit this one).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

for t in build/celeriac build/bench/fake_fast build/bench/publish build/bench/consume_ack \
         build/bench/redis_limit build/bench/redis_loop build/bench/idle_streams; do
    [ -x "$t" ] || { echo "bench: $t missing: run 'make all bench-tools'" >&2; exit 1; }
done

if [ -n "${BENCH_BASELINE:-}" ]; then
    rev=$(git -C "$root" rev-parse --verify --quiet "${BENCH_BASELINE}^{commit}") ||
        { echo "bench: BENCH_BASELINE '$BENCH_BASELINE' is not a commit" >&2; exit 1; }
    base_label="$BENCH_BASELINE ($(git -C "$root" rev-parse --short "$rev"))"
    base_wt=$dir/baseline
    echo "bench: building the baseline worker of $base_label in $base_wt" >&2
    git -C "$root" worktree add --detach --quiet "$base_wt" "$rev" ||
        { echo "bench: git worktree add failed" >&2; exit 1; }
    # A make of its own, not a part of the `make bench` that may have started us.
    (cd "$base_wt" && env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS \
        make -j"$(nproc 2>/dev/null || echo 2)" all >"$dir/baseline-build.log" 2>&1) ||
        { tail -n 30 "$dir/baseline-build.log" >&2; echo "bench: the baseline build failed" >&2; exit 1; }
    cp "$base_wt/build/celeriac" "$dir/celeriac-baseline" || exit 1
    git -C "$root" worktree remove --force "$base_wt" && base_wt=""
fi

bash scripts/services.sh start "$dir" >/dev/null || { echo "bench: cannot start services" >&2; exit 1; }

if [ -n "${BENCH_BASELINE:-}" ]; then
    /usr/bin/python3 bench/ab.py "$dir" "$out" "$dir/celeriac-baseline" "$base_label" || exit 1
    exit 0
fi
/usr/bin/python3 bench/run.py "$dir" "$out" || exit 1
/usr/bin/python3 bench/report.py "$out" ${BENCH_DOC:+"$BENCH_DOC"}
