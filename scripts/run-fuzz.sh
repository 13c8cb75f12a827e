#!/usr/bin/env bash
# run-fuzz.sh SECONDS BIN... -- runs each libFuzzer target in a bounded way:
# first every input of its kept corpus (tests/fuzz/corpus/<name>/) once, then a
# random run of SECONDS on a copy of that corpus. An input slower than
# FUZZ_INPUT_TIMEOUT seconds, over FUZZ_RSS_MB of memory or crashing fails the
# step and is written as tests/fuzz/found-<name>-<kind>-<sha1>, to be fixed and
# then kept in the corpus. timeout(1) ends a target that libFuzzer itself would
# not stop, so the step can never hang CI.
set -u
secs=${1:?usage: run-fuzz.sh SECONDS BIN...}
shift
input_timeout=${FUZZ_INPUT_TIMEOUT:-5}
rss_mb=${FUZZ_RSS_MB:-2048}
found_dir=tests/fuzz

fail() { # name log what
    local name=$1 log=$2 what=$3 f
    tail -40 "$log"
    echo "fuzz $name: $what"
    # Replaying files, libFuzzer names each one before it runs it.
    f=$(sed -n 's/^Running: //p' "$log" | tail -1)
    [ -n "$f" ] && echo "fuzz $name: failing input $f"
    f=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
    [ -n "$f" ] && echo "fuzz $name: found input $f (fix, then move it to tests/fuzz/corpus/$name/)"
    exit 1
}

check() { # name log rc what limit
    case $3 in
    0) ;;
    124 | 137) fail "$1" "$2" "$4 killed by timeout(1) after $5s" ;;
    *) fail "$1" "$2" "$4 failed (exit $3)" ;;
    esac
}

run_target() { # bin (run in a subshell of its own: its EXIT trap and variables stay there)
    bin=$1
    name=${bin##*/fuzz_}
    corpus=tests/fuzz/corpus/$name
    flags=(-timeout="$input_timeout" -rss_limit_mb="$rss_mb" -max_len=65536
           -print_final_stats=0 -artifact_prefix="$found_dir/found-$name-")
    tmp=$(mktemp -d)
    log=$tmp.log
    trap 'rm -rf "$tmp" "$log"' EXIT

    # The kept corpus, one run per input: the inputs once found are replayed
    # even when the random run would not reach them again.
    files=("$corpus"/*)
    if [ -e "${files[0]}" ]; then
        limit=$((60 + input_timeout * ${#files[@]}))
        timeout -k 10 "$limit" "$bin" "${flags[@]}" "${files[@]}" >"$log" 2>&1
        check "$name" "$log" $? "corpus replay" "$limit"
        echo "fuzz $name: ${#files[@]} corpus inputs replayed"
        cp "${files[@]}" "$tmp"/
    fi

    echo "fuzz $name for ${secs}s"
    limit=$((secs + 60 + input_timeout))
    timeout -k 10 "$limit" "$bin" "${flags[@]}" -max_total_time="$secs" "$tmp" >"$log" 2>&1
    check "$name" "$log" $? "random run" "$limit"
    grep -E "^(#[0-9]+ *DONE|Done)" "$log" | tail -1
}

# The targets run FUZZ_JOBS at a time (default: one a core; each is one thread
# and still gets its SECONDS), each into its own file, printed in order, those
# that failed last so that CI's tail shows them.
par=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
i=0
for bin in "$@"; do
    while [ "$(jobs -pr | wc -l)" -ge "$par" ]; do wait -n; done
    ( (run_target "$bin"); echo $? >"$out/$i.rc" ) >"$out/$i.out" 2>&1 &
    i=$((i + 1))
done
wait
bad=()
for ((j = 0; j < i; j++)); do
    if [ "$(cat "$out/$j.rc" 2>/dev/null)" = 0 ]; then cat "$out/$j.out"; else bad+=("$j"); fi
done
for j in "${bad[@]}"; do cat "$out/$j.out"; done
[ "${#bad[@]}" -eq 0 ]
