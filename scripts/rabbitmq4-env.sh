#!/bin/bash
# rabbitmq4-env.sh -- runs RabbitMQ 4 (Debian trixie's rabbitmq-server, Erlang 27)
# from a chroot, for checking celeriac by hand against it on a Debian 12 host,
# whose own package is RabbitMQ 3.10. Not used by `make test` or CI.
#
#   bash scripts/rabbitmq4-env.sh up   [ROOT] [BIN]   builds ROOT if missing, mounts
#                                                     /proc, /dev and /tmp into it and
#                                                     writes the wrappers into BIN
#   bash scripts/rabbitmq4-env.sh down [ROOT] [BIN]   unmounts (refuses while a node
#                                                     from ROOT still runs)
#
# ROOT defaults to /work/rmq4-root, BIN to /tmp/rmq4-bin. Then:
#
#   export PATH=/tmp/rmq4-bin:$PATH
#   rabbitmqctl version                                 # 4.0.5
#   CELERIAC_BIN=build/celeriac bash scripts/run-integration.sh test_quorum.py
#
# BIN holds rabbitmq-server, rabbitmqctl, rabbitmq-plugins, rabbitmq-diagnostics,
# rabbitmq-queues and epmd: each runs ROOT's own program with the caller's
# environment (RABBITMQ_NODENAME, RABBITMQ_MNESIA_BASE, ...), so scripts/services.sh
# and the integration tests start and drive 4.x nodes unchanged. Their data and
# logs live under /tmp/celeriac-it.*, hence the bind mount of /tmp. Server and
# rabbitmqctl both run inside ROOT as its rabbitmq user, so they share one Erlang
# cookie (ROOT's /var/lib/rabbitmq/.erlang.cookie). ROOT's rabbitmq user is given
# the host's uid and gid, since services.sh chowns the node's dirs by the host's
# names. Building ROOT needs debootstrap and the trixie archive (about 300 MB).
set -euo pipefail
cmd=${1:-up}
ROOT=${2:-/work/rmq4-root}
BIN=${3:-/tmp/rmq4-bin}
MIRROR=${RABBITMQ4_MIRROR:-http://deb.debian.org/debian}
MOUNTS="proc dev tmp"

build_root() {
    command -v debootstrap >/dev/null || apt-get install -y debootstrap
    mkdir -p "$ROOT"
    debootstrap --variant=minbase trixie "$ROOT" "$MIRROR"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    mount -t proc proc "$ROOT/proc"
    mount --bind /dev "$ROOT/dev"
    chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
        sh -c 'apt-get update && apt-get install -y --no-install-recommends rabbitmq-server' ||
        { umount "$ROOT/dev" "$ROOT/proc"; exit 1; }
    umount "$ROOT/dev" "$ROOT/proc"
}

# ROOT's rabbitmq user gets the host's uid and gid (files under ROOT follow).
match_ids() {
    id rabbitmq >/dev/null 2>&1 || return 0
    local hu hg ru rg
    hu=$(id -u rabbitmq)
    hg=$(id -g rabbitmq)
    ru=$(chroot "$ROOT" id -u rabbitmq)
    rg=$(chroot "$ROOT" id -g rabbitmq)
    [ "$hu:$hg" = "$ru:$rg" ] && return 0
    for m in $MOUNTS; do
        if mountpoint -q "$ROOT/$m"; then
            echo "rabbitmq4-env: $ROOT/$m is mounted; run down first" >&2
            exit 1
        fi
    done
    chroot "$ROOT" groupmod -g "$hg" rabbitmq
    chroot "$ROOT" usermod -u "$hu" -g "$hg" rabbitmq
    find "$ROOT" -xdev -uid "$ru" -exec chown -h "$hu" {} +
    find "$ROOT" -xdev -gid "$rg" -exec chgrp -h "$hg" {} +
}

mount_all() {
    mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
    mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
    mountpoint -q "$ROOT/tmp" || mount --bind /tmp "$ROOT/tmp"
}

write_wrappers() {
    mkdir -p "$BIN"
    for p in rabbitmq-server rabbitmqctl rabbitmq-plugins rabbitmq-diagnostics \
        rabbitmq-queues epmd; do
        local target=/usr/sbin/$p
        [ "$p" = epmd ] && target=/usr/bin/epmd
        # PATH is reset so that nothing inside ROOT finds these wrappers again
        # through the shared /tmp.
        cat > "$BIN/$p" <<WRAP
#!/bin/sh
if ! mountpoint -q "$ROOT/tmp"; then
    echo "$p: $ROOT is not mounted (bash scripts/rabbitmq4-env.sh up)" >&2
    exit 1
fi
PATH=/usr/sbin:/usr/bin:/sbin:/bin exec chroot "$ROOT" $target "\$@"
WRAP
        chmod 755 "$BIN/$p"
    done
}

case "$cmd" in
up)
    [ -x "$ROOT/usr/sbin/rabbitmq-server" ] || build_root
    match_ids
    mount_all
    write_wrappers
    PATH=$BIN:$PATH rabbitmqctl version 2>/dev/null | sed 's/^/rabbitmq4-env: RabbitMQ /' || true
    echo "rabbitmq4-env: export PATH=$BIN:\$PATH"
    ;;
down)
    # A node still running from ROOT would lose its /tmp under it.
    for pid in $(pgrep -x beam.smp || true); do
        if [ "$(readlink "/proc/$pid/root")" = "$ROOT" ]; then
            echo "rabbitmq4-env: process $pid still runs inside $ROOT" >&2
            exit 1
        fi
    done
    # The first node to start runs epmd, so the tier's may have started the
    # one every node of the machine uses. Stopped only when no node is
    # registered with it any more (a host node may be, and needs it).
    for pid in $(pgrep -x epmd || true); do
        [ "$(readlink "/proc/$pid/root")" = "$ROOT" ] || continue
        if epmd -names 2>/dev/null | grep -q '^name '; then
            echo "rabbitmq4-env: epmd ($pid) inside $ROOT still serves nodes" >&2
            exit 1
        fi
        kill "$pid" 2>/dev/null
        for _ in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    done
    for m in tmp dev proc; do
        if mountpoint -q "$ROOT/$m"; then umount "$ROOT/$m"; fi
    done
    rm -rf "$BIN"
    ;;
*)
    echo "usage: rabbitmq4-env.sh up|down [ROOT] [BIN]" >&2
    exit 2
    ;;
esac
