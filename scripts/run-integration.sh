#!/usr/bin/env bash
# run-integration.sh -- integration tests against real RabbitMQ, Redis, Python Celery
# and the fake LLM server. Starts private service instances on free ports and stops
# them afterwards, whatever happens.
#   scripts/run-integration.sh [pytest args...]
#
# The whole suite runs in CELERIAC_IT_WORKERS pytest-xdist workers (default 4: the
# tests mostly wait on brokers, workers and the fake LLM, so more workers than cores
# pay), each with its own RabbitMQ node, Redis and fake LLM server (conftest.py's
# `services` fixture starts them). Given test files (a.py, a.py::test) without
# CELERIAC_IT_WORKERS, or with CELERIAC_IT_WORKERS=0, it is one pytest process on
# one pair started here.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=$(mktemp -d /tmp/celeriac-it.XXXXXX)
export CELERIAC_IT_DIR=$dir
# The RabbitMQ nodes run as the rabbitmq user and must reach their dirs below it.
chmod 755 "$dir"
cleanup() {
    # The run's own pair, and any a worker left behind (one that died does not
    # stop its own).
    local envf
    for envf in "$dir"/env "$dir"/*/env; do
        [ -f "$envf" ] && bash "$root/scripts/services.sh" stop "$(dirname "$envf")" >/dev/null 2>&1
    done
    pkill -f "$dir" >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 130" INT TERM

workers=${CELERIAC_IT_WORKERS:-4}
for a in "$@"; do
    case $a in
    # a file list runs in one process unless CELERIAC_IT_WORKERS asks otherwise
    *.py | *.py::*) [ -z "${CELERIAC_IT_WORKERS:-}" ] && workers=0 ;;
    -n | -n* | --numprocesses*) workers=0 ;;
    esac
done
xdist=()
if [ "$workers" -gt 0 ]; then
    # loadgroup: tests are handed out one by one, heaviest first (conftest.py),
    # except a file marked xdist_group (its module fixtures, TLS servers and
    # nginx, start once), whose tests share one worker.
    xdist=(-n "$workers" --dist "${CELERIAC_IT_DIST:-loadgroup}")
else
    bash scripts/services.sh start "$dir" >/dev/null || { echo "integration: cannot start services"; exit 1; }
fi

# The fake LLM server's own self-test needs no broker: it runs beside pytest.
/usr/bin/python3 tests/integration/test_fake_llm.py > "$dir/fake_llm.log" 2>&1 &
fake_pid=$!

cd "$root/tests/integration"
/usr/bin/python3 -m pytest -p no:cacheprovider -q -ra --durations=10 "${xdist[@]}" "$@" 2>&1 \
    | tee "$dir/pytest.log"
rc=${PIPESTATUS[0]}

wait "$fake_pid"
fake_rc=$?
tail -n 1 "$dir/fake_llm.log"
[ $fake_rc -ne 0 ] && { tail -n 30 "$dir/fake_llm.log"; rc=1; }
# The log is re-read at the end so that what failed is the last thing CI's tail
# shows, pytest's summary line last of all.
if [ "$rc" -ne 0 ]; then
    echo "===== integration: what did not pass ====="
    grep -E '^(FAILED|ERROR) |(passed|failed|error).* in [0-9.]+s' "$dir/pytest.log" | tail -n 40
fi
exit $rc
