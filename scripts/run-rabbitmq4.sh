#!/usr/bin/env bash
# run-rabbitmq4.sh -- the RabbitMQ 4 tier: integration tests against RabbitMQ 4
# configured as 4.3 ships, with transient non-exclusive queues and global QoS
# denied (services.sh, CELERIAC_RABBITMQ_43=1).
#
#   scripts/run-rabbitmq4.sh [pytest args...]   (make test-rabbitmq4)
#
# Debian 12 ships RabbitMQ 3.10, so the node is Debian trixie's (4.0.5, Erlang 27),
# run from a chroot that scripts/rabbitmq4-env.sh builds once (about 300 MB from
# Debian's archive, a minute or two) under RABBITMQ4_ROOT. Needs root (chroot and
# bind mounts). The Python clients declare their control and event queues
# exclusive as Celery 5.7 does (tests/integration/celery57/sitecustomize.py):
# Debian's Celery 5.2 declares them transient, which a 4.3 node refuses.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
ROOT=${RABBITMQ4_ROOT:-/var/tmp/celeriac-rmq4-root}
if [ "$(id -u)" -ne 0 ]; then
    echo "rabbitmq4: needs root (chroot and bind mounts for the RabbitMQ 4 node)" >&2
    exit 1
fi
bin=$(mktemp -d /tmp/celeriac-rmq4-bin.XXXXXX)
bash scripts/rabbitmq4-env.sh up "$ROOT" "$bin" | sed 's/^/  /' || exit 1
down() {
    bash "$root/scripts/rabbitmq4-env.sh" down "$ROOT" "$bin" >/dev/null 2>&1 ||
        echo "rabbitmq4: could not unmount $ROOT (a node still running?)" >&2
}
trap down EXIT
trap "exit 130" INT TERM

FILES=(test_rabbitmq43.py test_core.py test_reliability.py test_monitoring.py test_canvas.py
    test_quorum.py)
[ $# -gt 0 ] && FILES=("$@")
# Redis-broker variants of the same tests say nothing new here.
# Three xdist workers, each with its own 4.x node, a file to a worker
# (loadfile), as the outage tests restart their node: with tests spread one by
# one on four nodes, 4.0.5's refusal to boot again (see services.sh) came in
# every run; whole files on three nodes have passed.
# The tests' own control node (tests/integration/erlctl.py) talks to the 4.x
# nodes with their cookie, the chroot's.
export CELERIAC_ERLANG_COOKIE=$ROOT/var/lib/rabbitmq/.erlang.cookie
PATH=$bin:$PATH CELERIAC_RABBITMQ_43=1 CELERIAC_IT_WORKERS=${CELERIAC_IT_WORKERS:-3} \
    CELERIAC_IT_DIST=loadfile \
    PYTHONPATH="$root/tests/integration/celery57${PYTHONPATH:+:$PYTHONPATH}" \
    bash scripts/run-integration.sh -k "not redis" "${FILES[@]}"
