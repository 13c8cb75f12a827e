#!/usr/bin/env bash
# run-unit.sh -- runs every Check unit-test binary given and prints one summary line.
# The binaries run UNIT_JOBS at a time (default: the number of cores): each is its own
# process with its own fixtures, and under ASan the suite is CPU-bound, so the cores
# halve it. Their output is printed afterwards in the order given. Each binary is
# bounded by UNIT_TIMEOUT seconds (default 600) as a whole: under CK_FORK=no (as
# `make asan` runs) Check's per-test timeouts do not apply, and a hang must still end.
set -u
pass=0; fail=0; bad=()
out_dir=$(mktemp -d /tmp/celeriac-unit.XXXXXX)
trap 'rm -rf "$out_dir"' EXIT
jobs=${UNIT_JOBS:-$(nproc 2>/dev/null || echo 2)}
export UNIT_TIMEOUT=${UNIT_TIMEOUT:-600}
# Check's per-test timeouts (4 s unless a case sets its own) stretched threefold:
# on a 2-core machine busy with the integration suite or a second build, an OOM
# sweep of 4 s alone was seen cut off. A hang still ends, only later.
export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-3}
# Each binary writes its output and exit code under its index, so names never clash.
i=0
for t in "$@"; do printf '%d\0%s\0' "$i" "$t"; i=$((i + 1)); done |
    xargs -0 -n 2 -P "$jobs" sh -c 'timeout -k 10 "$UNIT_TIMEOUT" "$2" > "$0/$1.out" 2>&1; echo $? > "$0/$1.rc"' "$out_dir"
i=0
for t in "$@"; do
    out=$(cat "$out_dir/$i.out" 2>/dev/null); rc=$(cat "$out_dir/$i.rc" 2>/dev/null || echo 127)
    i=$((i + 1))
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+%: Checks: ' | tail -n 1)
    case $rc in 124 | 137) line="killed after ${UNIT_TIMEOUT}s (UNIT_TIMEOUT)" ;; esac
    echo "$(basename "$t"): ${line:-no Check summary (exit $rc)}"
    n=$(sed -nE 's/.*Checks: ([0-9]+), Failures: ([0-9]+), Errors: ([0-9]+).*/\1 \2 \3/p' <<<"$line")
    if [ -z "$n" ]; then fail=$((fail + 1)); bad+=("$t"); printf '%s\n' "$out" | tail -n 20; continue; fi
    read -r c f e <<<"$n"
    pass=$((pass + c - f - e)); fail=$((fail + f + e))
    if [ "$rc" -ne 0 ] || [ $((f + e)) -gt 0 ]; then
        bad+=("$t"); printf '%s\n' "$out" | grep -vE '^[0-9]+%: Checks' | tail -n 30
    fi
done
echo "unit: $pass passed, $fail failed"
[ "${#bad[@]}" -eq 0 ]
