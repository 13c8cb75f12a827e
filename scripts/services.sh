#!/usr/bin/env bash
# services.sh -- starts private RabbitMQ and Redis instances for tests and the demo.
#
#   scripts/services.sh start DIR   starts both under DIR on free ports (idempotent)
#                                    and writes DIR/env (AMQP_PORT, REDIS_PORT, ...)
#   scripts/services.sh stop DIR    stops them
#   scripts/services.sh rabbit-stop DIR / rabbit-start DIR   (outage tests)
#   scripts/services.sh redis-stop DIR / redis-start DIR
#
# Each DIR gets its own RabbitMQ node (own name, ports and data) and its own
# Redis, so test runs never share state and reruns never see leftovers.
# Redis has 64 databases: 1..15 hold results, 16 + that db a test's Redis broker.
set -euo pipefail

cmd=${1:?usage: services.sh start|stop|... DIR}
dir=${2:?usage: services.sh start|stop|... DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# The RabbitMQ node runs as the rabbitmq user and must reach its data dir.
chmod 755 "$dir"

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

rabbit_env() {
    # shellcheck disable=SC1091
    . "$dir/env"
    export RABBITMQ_NODENAME="$RABBIT_NODE"
    export RABBITMQ_NODE_PORT="$AMQP_PORT"
    export RABBITMQ_DIST_PORT="$RABBIT_DIST_PORT"
    export RABBITMQ_MNESIA_BASE="$dir/rabbit/mnesia"
    export RABBITMQ_LOG_BASE="$dir/rabbit/log"
    export RABBITMQ_PID_FILE="$dir/rabbit/pid"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/rabbit/enabled_plugins"
    export RABBITMQ_CONFIG_FILE="$dir/rabbit/rabbitmq"
}

ctl() { rabbitmqctl -q -n "$RABBIT_NODE" "$@"; }

# Whether the node's Erlang VM is registered with the port mapper. Asked in the
# loops below instead of `rabbitmqctl ping`, which boots an Erlang VM of its
# own (about a second of CPU) for every try.
registered() {
    epmd -names 2>/dev/null | grep -q "^name ${RABBIT_NODE%@*} "
}

# Whether the node takes AMQP connections (bash's own /dev/tcp: no process).
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$AMQP_PORT") 2>/dev/null
}

# Waits for a started node: its VM registered with epmd, then its AMQP listener
# open, which RabbitMQ opens at the end of its boot (what `rabbitmqctl
# await_startup` waits for, without an Erlang VM of its own). Fails when the VM
# goes away meanwhile (a node that refused to boot) or after two minutes.
booted() {
    local i seen=""
    for i in $(seq 1 1200); do
        if registered; then
            seen=1
            listening && return 0
        elif [ -n "$seen" ] || [ "$i" -gt 600 ]; then
            return 1 # gone again, or never there
        fi
        sleep 0.1
    done
    return 1
}

rabbit_start() {
    rabbit_env
    if registered && listening; then return 0; fi
    mkdir -p "$dir/rabbit"
    echo "[]." > "$dir/rabbit/enabled_plugins"
    # Loopback only; a short consumer_timeout is set by the tests that need it.
    cat > "$dir/rabbit/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
loopback_users = none
CONF
    # The RabbitMQ 4 tier: a 4.x node configured as 4.3 ships, denying the
    # two deprecated features a worker could rely on (3.x knows neither key).
    if [ -n "${CELERIAC_RABBITMQ_43:-}" ]; then
        cat >> "$dir/rabbit/rabbitmq.conf" <<CONF
deprecated_features.permit.transient_nonexcl_queues = false
deprecated_features.permit.global_qos = false
CONF
    fi
    # The Debian wrapper runs the server as the rabbitmq user.
    if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq:rabbitmq "$dir/rabbit"; fi
    (cd /tmp && rabbitmq-server -detached >/dev/null 2>&1)
    if ! booted; then
        # RabbitMQ 4.0.5 (Debian trixie's, the RabbitMQ 4 tier) can refuse to
        # boot again with transient non-exclusive queues denied although none
        # exist (its check counts other queues: rabbitmq-server PR 12840).
        # Such a restart (an outage test's) boots with that one permitted,
        # said here; global QoS stays denied.
        if [ -n "${CELERIAC_RABBITMQ_43:-}" ] &&
            grep -qs failed_to_deny_deprecated_features "$RABBITMQ_LOG_BASE"/*.log; then
            echo "services: RabbitMQ 4.0.5 refused to boot again with transient" \
                "non-exclusive queues denied (its bug); restarted with them permitted" >&2
            sed -i '/transient_nonexcl_queues/d' "$dir/rabbit/rabbitmq.conf"
            (cd /tmp && rabbitmq-server -detached >/dev/null 2>&1)
            booted && return 0
        fi
        # Why, where the caller shows it (the node's own log).
        echo "services: RabbitMQ node $RABBIT_NODE did not start; its log ends:" >&2
        tail -n 25 "$RABBITMQ_LOG_BASE"/*.log >&2 2>/dev/null || true
        return 1
    fi
}

# Whether process $1 runs (a zombie left for a reaper that never comes, as in
# some containers, does not count).
alive() {
    local st
    st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    case "$st" in Z*) return 1 ;; esac
}

rabbit_stop() {
    rabbit_env
    local pid=""
    [ -f "$RABBITMQ_PID_FILE" ] && pid=$(tr -dc 0-9 < "$RABBITMQ_PID_FILE")
    # Erlang stops the node as `rabbitmqctl stop` does on SIGTERM, without a
    # VM of its own to ask.
    if [ -n "$pid" ] && alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
    elif registered; then
        ctl stop >/dev/null 2>&1 || true
    fi
    for _ in $(seq 1 300); do
        registered || break
        sleep 0.1
    done
    # The node stops answering a few seconds before its Erlang VM has exited:
    # wait for that too, so that a stop leaves nothing running and a start
    # that follows does not meet the old node's name. A loaded 4.x node with
    # quorum queues can take tens of seconds; one still there after 45 s is
    # killed (what an outage test wants anyway).
    if [ -n "$pid" ]; then
        for _ in $(seq 1 450); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            kill -9 "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do
                alive "$pid" || break
                sleep 0.1
            done
        fi
    fi
}

redis_start() {
    . "$dir/env"
    if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then return 0; fi
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --databases 64 \
        --appendonly no --dbfilename dump.rdb --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
    for _ in $(seq 1 100); do
        redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "services: redis did not start on port $REDIS_PORT" >&2
    return 1
}

redis_stop() {
    . "$dir/env"
    redis-cli -p "$REDIS_PORT" shutdown save >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do
        redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || return 0
        sleep 0.1
    done
}

case "$cmd" in
start)
    if [ ! -f "$dir/env" ]; then
        tag=$(basename "$dir" | tr -c 'a-zA-Z0-9\n' '_')
        {
            echo "AMQP_PORT=${AMQP_PORT:-$(free_port)}"
            echo "RABBIT_DIST_PORT=$(free_port)"
            echo "RABBIT_NODE=celeriac_${tag}_$$@localhost"
            echo "REDIS_PORT=${REDIS_PORT:-$(free_port)}"
        } > "$dir/env"
    fi
    rabbit_start
    redis_start
    cat "$dir/env"
    ;;
stop)
    [ -f "$dir/env" ] || exit 0
    redis_stop
    rabbit_stop
    # rabbitmq-server starts Erlang's port mapper daemon, which outlives it:
    # stop that too once no Erlang node is registered with it any more.
    # Not when the caller runs its own (.ci/run, for the RabbitMQ 4 tier's chroot:
    # killed here between two nodes, the next one to start would start another,
    # maybe the chroot's, which then keeps the chroot mounted).
    if [ -z "${CELERIAC_KEEP_EPMD:-}" ] && command -v epmd >/dev/null 2>&1 &&
        ! epmd -names 2>/dev/null | grep -q '^name '; then
        epmd -kill >/dev/null 2>&1 || true
    fi
    ;;
rabbit-start) rabbit_start ;;
rabbit-stop) rabbit_stop ;;
redis-start) redis_start ;;
redis-stop) redis_stop ;;
*)
    echo "usage: services.sh start|stop|rabbit-start|rabbit-stop|redis-start|redis-stop DIR" >&2
    exit 2
    ;;
esac
