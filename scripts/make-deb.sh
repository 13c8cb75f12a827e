#!/usr/bin/env bash
# make-deb.sh -- builds BUILD/celeriac_<version>_<arch>.deb with dpkg-deb alone
# (make deb). The tree is `make install PREFIX=/usr` into a staging directory,
# with the man pages gzipped and the unit in /lib/systemd/system as Debian 12
# keeps them. Depends: what dpkg-shlibdeps finds the binary linked against,
# plus the libwebsockets libuv plugin, which libwebsockets dlopen()s at run
# time (so no linker tool sees it) and without which the gateway and the
# metrics listener cannot start, and adduser for the maintainer scripts.
#
#   bash scripts/make-deb.sh BUILD
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath -m "${1:-build}")
version=$(sed -n 's/^#define CELERIAC_VERSION "\(.*\)"$/\1/p' util/version.h)
arch=$(dpkg --print-architecture)
[ -n "$version" ] || { echo "make-deb: no CELERIAC_VERSION in util/version.h" >&2; exit 1; }
stage=$build/deb/root
rm -rf "$build/deb"
mkdir -p "$stage/DEBIAN"
make --no-print-directory -s install DESTDIR="$stage" PREFIX=/usr UNITDIR=/lib/systemd/system \
    BUILD="$build" >/dev/null
# The debugging symbols stay in build/celeriac.
strip --strip-unneeded "$stage/usr/bin/celeriac"
gzip -9n "$stage"/usr/share/man/man1/*.1
install -d "$stage/usr/share/doc/celeriac"
gzip -9nc README.md >"$stage/usr/share/doc/celeriac/README.md.gz"

# dpkg-shlibdeps wants to run from a source tree: a throwaway one with the
# least debian/control it accepts.
shl=$(mktemp -d)
trap 'rm -rf "$shl"' EXIT
mkdir -p "$shl/debian"
printf 'Source: celeriac\n\nPackage: celeriac\nArchitecture: any\n' >"$shl/debian/control"
cp "$stage/usr/bin/celeriac" "$shl/celeriac"
shlibs=$(cd "$shl" && dpkg-shlibdeps -O -e celeriac 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || { echo "make-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
evlib=$(dpkg-query -W -f='${Version}' libwebsockets-evlib-uv 2>/dev/null || true)
depends="$shlibs, libwebsockets-evlib-uv${evlib:+ (>= ${evlib%%-*})}, adduser"

size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: celeriac
Version: $version
Architecture: $arch
Maintainer: celeriac developers <celeriac@localhost>
Installed-Size: $size
Depends: $depends
Section: net
Priority: optional
Description: native Celery worker for LLM jobs
 A worker in C that speaks Celery's message protocol on RabbitMQ or Redis
 and runs LLM tasks (llm.generate, llm.chat, llm.embed), with an HTTP and
 WebSocket gateway, a dead-letter tool and a terminal view of workers.
 .
 The service reads /etc/default/celeriac and is not started on installation.
CONTROL
[ -e "$stage/etc/default/celeriac" ] && echo /etc/default/celeriac >"$stage/DEBIAN/conffiles"

# The service runs as the system user celeriac; installing starts nothing (the
# broker URL and the API key are to be set first).
cat >"$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    adduser --system --group --quiet --home /var/lib/celeriac --no-create-home \
        --gecos "celeriac worker" celeriac
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null || true
    fi
fi
exit 0
POSTINST
cat >"$stage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
if [ "$1" = purge ] && getent passwd celeriac >/dev/null; then
    deluser --system --quiet celeriac || true
fi
exit 0
POSTRM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/postrm"
# A unit is stopped before its binary goes away.
if [ -e "$stage/lib/systemd/system/celeriac.service" ]; then
    cat >"$stage/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    systemctl stop celeriac.service >/dev/null 2>&1 || true
fi
exit 0
PRERM
    chmod 0755 "$stage/DEBIAN/prerm"
fi

deb=$build/celeriac_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
