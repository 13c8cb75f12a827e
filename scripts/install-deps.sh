#!/usr/bin/env bash
# install-deps.sh -- installs the Debian packages celeriac needs, if any is missing.
# Idempotent and quiet when everything is there. Needs root (or sudo) to install.
set -euo pipefail

PKGS=(
    gcc make pkg-config clang clang-format valgrind
    librabbitmq-dev libcurl4-openssl-dev libcjson-dev libhiredis-dev libuv1-dev
    libwebsockets-dev libpcre2-dev libssl-dev zlib1g-dev check
    rabbitmq-server redis-server
    python3-celery python3-redis python3-amqp python3-pytest python3-pytest-xdist
    python3-websocket python3-yaml
    chromium
    python3-prometheus-client
    python3-rq
)

# kombu's SQS transport (the Python side of the SQS tests): boto3 for its
# blocking calls, pycurl for the receive loop.
PKGS+=(python3-boto3 python3-pycurl)

# The gateway's browser test (tests/browser) drives Debian's chromium with
# playwright-core from npm; node and npm may come from elsewhere (NodeSource).
command -v npm >/dev/null || PKGS+=(nodejs npm)

# make bench: Python Celery's gevent pool and HTTP client, and the chart.
PKGS+=(python3-gevent python3-requests gnuplot-nox)

# The TLS rows of make bench and the HTTP/2 test: a private nginx as the TLS
# and HTTP/2 front of the fake LLM server (started by them, never as a service).
PKGS+=(nginx-light openssl)

# playwright-core into tests/browser, once (no browser download: the test
# uses /usr/bin/chromium); and local-aws-sqs into tests/sqs-emu, the SQS
# emulator scripts/sqs_emu.js runs, again when its lock file changed.
npm_deps() {
    local root dir
    root="$(cd "$(dirname "$0")/.." && pwd)"
    dir=$root/tests/browser
    if [ ! -d "$dir/node_modules/playwright-core" ]; then
        echo "install-deps: npm ci in tests/browser"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    fi
    # npm ci writes node_modules/.package-lock.json last: newer than the
    # committed lock file means the pinned tree is in place.
    dir=$root/tests/sqs-emu
    if [ ! -f "$dir/node_modules/local-aws-sqs/package.json" ] ||
        [ ! "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ]; then
        echo "install-deps: npm ci in tests/sqs-emu"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    fi
}

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ "${#missing[@]}" -eq 0 ] && { npm_deps; exit 0; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Debian's maintainer scripts try to start services through policy-rc.d; we
# start our own instances, so a refused start is fine.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
npm_deps
