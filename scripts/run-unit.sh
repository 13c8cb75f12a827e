#!/usr/bin/env bash
# run-unit.sh -- runs every Check unit-test binary given and prints one summary line.
set -u
pass=0; fail=0; bad=()
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+%: Checks: ' | tail -n 1)
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
