#!/usr/bin/env bash
# check-src.sh -- `make check-src`: the source gates, one line per violation.
#
#   scripts/check-src.sh [ROOT]      checks the tree at ROOT (default: the repository)
#   scripts/check-src.sh --selftest  runs the gate on tests/check-src/bad (must fail with
#                                    exactly tests/check-src/bad.expected) and on
#                                    tests/check-src/good (must pass)
#
# Three gates, each line printed as "file:line: what [rule]":
#   banned   functions curl's checksrc bans: sprintf strcpy strcat strtok atoi gets
#   layer    an #include that runs against the layers (ARCHITECTURE.md, "Nevers"):
#              worker    nothing outside cmd/ and worker/ includes worker/
#              engine    engine/ includes no net/, no llm/llm_client.h, no <uv.h>
#              gateway   gateway/ includes neither worker/ nor engine/
#              protocol  protocol/ includes only protocol/ and util/ (and no <uv.h>)
#              util      util/ includes only util/ (and no <uv.h>)
#              llm       llm/ includes only llm/, protocol/ and util/
#              vsession  net/vsession.[ch], the pure transport session, includes only
#                        util/, protocol/ and net/vsession.h, and no <uv.h> or <hiredis/...>
#              net       net/ includes only net/, protocol/ and util/
#            System headers (<...> that is not a file of the tree) are free, except <uv.h>
#            where named. An include is resolved the way the compiler does with -I.:
#            first beside the including file ("x.h" in net/ is net/x.h, "../util/x.h"
#            is util/x.h), then from the root ("util/x.h"). A violation is reported
#            under the first rule above that forbids it.
#   format   clang-format --dry-run -Werror (the repository's .clang-format), one line
#            per file naming the lines that differ
# Exit status: 0 when clean, 1 when anything was reported, 2 on a usage error.
set -uo pipefail
export LC_ALL=C # the order of globs and of the report, whatever the locale
here=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--selftest" ]; then
    fx=$here/tests/check-src
    got=$(bash "$0" "$fx/bad" 2>&1)
    rc=$?
    got=$(printf '%s\n' "$got" | grep -v '^check-src: ')
    bad=0
    if [ "$rc" -ne 1 ]; then
        echo "selftest: the gate exited $rc on tests/check-src/bad, not 1"
        bad=1
    fi
    while IFS= read -r line; do
        if grep -Fxq -- "$line" <<<"$got"; then
            echo "caught: $line"
        else
            echo "MISSED: $line"
            bad=1
        fi
    done <"$fx/bad.expected"
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        grep -Fxq -- "$line" "$fx/bad.expected" && continue
        echo "UNEXPECTED: $line"
        bad=1
    done <<<"$got"
    good=$(bash "$0" "$fx/good" 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "selftest: the gate failed (exit $rc) on the clean tree tests/check-src/good:"
        printf '%s\n' "$good"
        bad=1
    else
        echo "passed: tests/check-src/good"
    fi
    if [ "$bad" -eq 0 ]; then
        echo "check-src selftest: every rule caught, the clean tree passes"
    else
        echo "check-src selftest: FAILED"
    fi
    exit "$bad"
fi

root=${1:-$here}
[ -d "$root" ] || { echo "usage: check-src.sh [ROOT | --selftest]" >&2; exit 2; }
cd "$root" || exit 2
shopt -s nullglob
src=(*/*.c */*.h)
layered=()
for f in "${src[@]}"; do
    case $f in
    cmd/* | gateway/* | worker/* | engine/* | net/* | llm/* | protocol/* | util/*)
        layered+=("$f") ;;
    esac
done
fmt=("${src[@]}" tests/*/*.c)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# banned: the pattern the Makefile used before this script; snprintf, vsnprintf and
# strtok_r do not match (no word boundary before the name, or no "(" right after).
if [ "${#src[@]}" -gt 0 ]; then
    grep -nHE '\b(sprintf|strcpy|strcat|strtok|atoi|gets)\s*\(' "${src[@]}" |
        awk '{
            match($0, /^[^:]*:[0-9]+:/)
            loc = substr($0, 1, RLENGTH - 1)
            rest = substr($0, RLENGTH + 1)
            match(rest, /(^|[^A-Za-z0-9_])(sprintf|strcpy|strcat|strtok|atoi|gets)[ \t]*\(/)
            fn = substr(rest, RSTART, RLENGTH)
            sub(/^[^a-z]/, "", fn)
            sub(/[ \t]*\($/, "", fn)
            printf "%s: calls %s(), which is banned [banned]\n", loc, fn
        }' >>"$out"
fi

# layer: every #include of every layered file. The first input is the list of files
# that exist (the layers are flat), so that an include is resolved beside its file
# only when it is there.
if [ "${#layered[@]}" -gt 0 ]; then
    printf '%s\n' "${src[@]}" |
        awk '
        FNR == NR { exists[$0] = 1; next }
        function norm(p,    n, i, parts, out, k) {
            n = split(p, parts, "/")
            k = 0
            for (i = 1; i <= n; i++) {
                if (parts[i] == "" || parts[i] == ".")
                    continue
                if (parts[i] == "..") {
                    if (k > 0)
                        k--
                    else
                        out[++k] = ".."
                    continue
                }
                out[++k] = parts[i]
            }
            p = ""
            for (i = 1; i <= k; i++)
                p = p (i > 1 ? "/" : "") out[i]
            return p
        }
        function top(p) { return index(p, "/") ? substr(p, 1, index(p, "/") - 1) : "" }
        function layer(d) {
            return d ~ /^(cmd|gateway|worker|engine|net|llm|protocol|util)$/
        }
        function report(what, rule) {
            printf "%s:%d: includes %s: %s [%s]\n", FILENAME, FNR, what, msg[rule], rule
        }
        BEGIN {
            msg["worker"] = "only cmd/ and worker/ may include worker/"
            msg["engine"] = "engine/ includes no net/, no llm/llm_client.h, no <uv.h>"
            msg["gateway"] = "gateway/ includes neither worker/ nor engine/"
            msg["protocol"] = "protocol/ includes only protocol/ and util/, and no <uv.h>"
            msg["util"] = "util/ includes only util/, and no <uv.h>"
            msg["llm"] = "llm/ includes only llm/, protocol/ and util/"
            msg["net"] = "net/ includes only net/, protocol/ and util/"
            msg["vsession"] = "net/vsession.[ch] includes only util/, protocol/ and " \
                              "net/vsession.h, and no <uv.h> or <hiredis/...>"
        }
        FNR == 1 {
            dir = FILENAME; sub(/\/[^\/]*$/, "", dir); from = top(FILENAME)
            sess = FILENAME ~ /^net\/vsession\.[ch]$/
        }
        /^[ \t]*#[ \t]*include[ \t]*["<]/ {
            line = $0
            sub(/^[ \t]*#[ \t]*include[ \t]*/, "", line)
            q = substr(line, 1, 1)
            name = substr(line, 2)
            sub(q == "<" ? ">.*" : "\".*", "", name)
            shown = q == "<" ? "<" name ">" : "\"" name "\""
            if (q == "<") {
                if (sess && (name == "uv.h" || name ~ /^hiredis\//)) {
                    report(shown, "vsession"); next
                }
                if (name == "uv.h") {
                    if (from == "engine") { report(shown, "engine"); next }
                    if (from == "protocol" || from == "util") {
                        report(shown, from); next
                    }
                }
                # A system header, unless -I. makes it one of ours.
                t = norm(name)
                if (!(t in exists) || !layer(top(t)))
                    next
            } else {
                t = norm(dir "/" name)
                if (!(t in exists)) {
                    r = norm(name)
                    if (index(name, "/") && (r in exists || layer(top(r))))
                        t = r
                }
            }
            to = top(t)
            if (t != name)
                shown = shown " (" t ")"
            if (to == "worker" && from != "cmd" && from != "worker")
                report(shown, "worker")
            else if (from == "engine" && (to == "net" || t == "llm/llm_client.h"))
                report(shown, "engine")
            else if (from == "gateway" && (to == "worker" || to == "engine"))
                report(shown, "gateway")
            else if (from == "protocol" && to != "protocol" && to != "util")
                report(shown, "protocol")
            else if (from == "util" && to != "util")
                report(shown, "util")
            else if (from == "llm" && to != "llm" && to != "protocol" && to != "util")
                report(shown, "llm")
            else if (sess && to != "protocol" && to != "util" && t != "net/vsession.h")
                report(shown, "vsession")
            else if (from == "net" && to != "net" && to != "protocol" && to != "util")
                report(shown, "net")
        }' - "${layered[@]}" >>"$out"
fi

# format: clang-format names every column that differs; one line per file is enough
# to act on ("make format" or clang-format -i FILE fixes it).
if [ "${#fmt[@]}" -gt 0 ]; then
    if ! command -v clang-format >/dev/null; then
        echo "check-src: clang-format not found (apt-get install clang-format)" >>"$out"
    else
        # One run over every file (it goes on past the first bad one); a file whose
        # name has ":<digits>:" in it would confuse the parse, and none does.
        clang-format --dry-run -Werror "${fmt[@]}" 2>&1 |
            sed -nE 's/^(.*):([0-9]+):[0-9]+: error: code should be clang-formatted.*/\1 \2/p' |
            uniq | awk '
                function flush(    s, i) {
                    if (!n)
                        return
                    for (i = 1; i <= n && i <= 8; i++)
                        s = s (i > 1 ? " " : "") lines[i]
                    if (n > 8)
                        s = s " ..."
                    printf "%s:%d: not clang-formatted, %d line%s differ%s (%s) [format]\n",
                           f, lines[1], n, (n > 1 ? "s" : ""), (n > 1 ? "" : "s"), s
                    n = 0
                }
                $1 != f { flush(); f = $1 }
                { lines[++n] = $2 }
                END { flush() }' >>"$out"
    fi
fi

if [ -s "$out" ]; then
    cat "$out"
    echo "check-src: $(wc -l <"$out") violation(s)"
    exit 1
fi
exit 0
