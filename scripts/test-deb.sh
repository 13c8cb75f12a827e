#!/usr/bin/env bash
# test-deb.sh -- installs the package `make deb` built into a fresh Debian 12
# root with apt (which pulls its dependencies from Debian's archive) and runs it
# there: `celeriac worker --help`, the man pages through man-db, the system
# user, the defaults file, the unit when the package has one, and the
# libwebsockets libuv plugin the gateway and the metrics listener load.
#
#   bash scripts/test-deb.sh [BUILD]      (make test-deb; needs root)
#
# The root is debootstrap's bookworm minbase (about 200 MB, a minute or two),
# built once under CELERIAC_DEB_ROOT (default /var/tmp/celeriac-deb-root) and
# kept pristine: each run works on a copy and removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ROOT=${CELERIAC_DEB_ROOT:-/var/tmp/celeriac-deb-root}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$(id -u)" -ne 0 ]; then
    echo "test-deb: needs root (debootstrap and chroot)" >&2
    exit 1
fi
debs=("$build"/celeriac_*.deb)
[ -e "${debs[0]}" ] || { echo "test-deb: no $build/celeriac_*.deb (make deb)" >&2; exit 1; }
deb=${debs[-1]}

if [ ! -e "$ROOT/etc/debian_version" ]; then
    command -v debootstrap >/dev/null || apt-get install -y debootstrap
    rm -rf "$ROOT.tmp"
    echo "test-deb: debootstrap bookworm into $ROOT (once)"
    debootstrap --variant=minbase bookworm "$ROOT.tmp" "$MIRROR" >"$ROOT.log" 2>&1 ||
        { echo "test-deb: debootstrap failed, see $ROOT.log" >&2; exit 1; }
    # Renamed only when complete: a half-built root is never reused.
    mv "$ROOT.tmp" "$ROOT"
fi

work=$(mktemp -d /var/tmp/celeriac-deb-test.XXXXXX)
cleanup() {
    for m in dev/pts dev proc; do
        mountpoint -q "$work/$m" && umount "$work/$m"
    done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM
cp -a "$ROOT/." "$work/"
mount -t proc proc "$work/proc"
mount --bind /dev "$work/dev"
cp /etc/resolv.conf "$work/etc/resolv.conf"
cat >"$work/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://security.debian.org/debian-security bookworm-security main
SOURCES
cp "$deb" "$work/tmp/celeriac.deb"
in_root() { chroot "$work" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

fail=0
check() { # what, command... (its output dropped)
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then
        echo "  ok: $what"
    else
        echo "  FAIL: $what" >&2
        fail=1
    fi
}
echo "test-deb: installing $(basename "$deb") into a copy of $ROOT"
in_root apt-get -q update >/dev/null
# man-db only to read the pages back; the package itself recommends nothing.
in_root env DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends \
    install /tmp/celeriac.deb man-db >"$work.apt.log" 2>&1 ||
    { cat "$work.apt.log" >&2; rm -f "$work.apt.log"; exit 1; }
rm -f "$work.apt.log"

check "celeriac worker --help runs" \
    sh -c "chroot '$work' /usr/bin/celeriac worker --help | grep -q -- '--broker'"
for page in celeriac celeriac-worker celeriac-gateway celeriac-dlq celeriac-top; do
    check "man -w $page" in_root man -w "$page"
done
check "celeriac-worker(1) renders its options" \
    sh -c "chroot '$work' env MANWIDTH=200 man celeriac-worker 2>/dev/null | grep -q -- '--result-backend'"
check "the system user celeriac" in_root getent passwd celeriac
check "/etc/default/celeriac names the broker" \
    grep -q '^CELERY_BROKER_URL=' "$work/etc/default/celeriac"
check "the libwebsockets libuv plugin" \
    sh -c "ls '$work'/usr/lib/*/libwebsockets-evlib_uv.so >/dev/null"
if dpkg-deb -c "$deb" | grep 'lib/systemd/system/celeriac.service' >/dev/null; then
    check "the unit runs /usr/bin/celeriac" \
        grep -q '^ExecStart=/usr/bin/celeriac ' "$work/lib/systemd/system/celeriac.service"
fi
# No process of the package is left running inside the root.
in_root_pids() {
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$work" ] && echo "${p#/proc/}"
    done
    return 0
}
check "nothing started" test -z "$(in_root_pids)"
exit $fail
