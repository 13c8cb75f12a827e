#!/usr/bin/env bash
# gen-man.sh -- writes the man pages of celeriac into OUTDIR: celeriac.1 and one
# celeriac-COMMAND.1 per command that `celeriac --help` lists, each printed by
# the binary from the option table its --help comes from (`celeriac help-man`),
# so the pages cannot drift from the options.
#
#   bash scripts/gen-man.sh BIN OUTDIR      (make man)
set -euo pipefail
bin=$1 out=$2
mkdir -p "$out"
tmp=$(mktemp -d "$out/.gen.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The command names: the indented lines under "commands:", up to the blank line.
cmds=$("$bin" --help | awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on {print $1}')
[ -n "$cmds" ] || { echo "gen-man: no commands in '$bin --help'" >&2; exit 1; }
"$bin" help-man >"$tmp/celeriac.1"
for c in $cmds; do
    "$bin" help-man "$c" >"$tmp/celeriac-$c.1"
done
rm -f "$out"/celeriac*.1
mv "$tmp"/*.1 "$out"/
