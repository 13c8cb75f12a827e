#!/usr/bin/env bash
# run-integration.sh -- integration tests against real RabbitMQ, Redis, Python Celery
# and the fake LLM server. Starts private service instances on free ports and stops
# them afterwards, whatever happens.
#   scripts/run-integration.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=$(mktemp -d /tmp/celeriac-it.XXXXXX)
export CELERIAC_IT_DIR=$dir
cleanup() {
    bash "$root/scripts/services.sh" stop "$dir" >/dev/null 2>&1
    pkill -f "$dir" >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 130" INT TERM
bash scripts/services.sh start "$dir" >/dev/null || { echo "integration: cannot start services"; exit 1; }

/usr/bin/python3 tests/integration/test_fake_llm.py > "$dir/fake_llm.log" 2>&1
fake_rc=$?
tail -n 1 "$dir/fake_llm.log"

cd "$root/tests/integration"
# The log is re-read at the end so that what failed is the last thing CI's tail shows.
/usr/bin/python3 -m pytest -p no:cacheprovider -q -ra --durations=10 "$@" 2>&1 | tee "$dir/pytest.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
    echo "===== integration: what did not pass ====="
    grep -E '^(FAILED|ERROR) |(passed|failed|error).* in [0-9.]+s' "$dir/pytest.log" | tail -n 40
fi
[ $fake_rc -ne 0 ] && { tail -n 30 "$dir/fake_llm.log"; rc=1; }
exit $rc
