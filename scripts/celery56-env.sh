#!/bin/bash
# celery56-env.sh -- lays out Celery 5.6 and its own libraries for Debian's
# /usr/bin/python3, without pip, from bare git mirrors already on this machine.
#
#   bash scripts/celery56-env.sh [MIRRORS] [DEST]
#
# MIRRORS holds one bare git dir per project as <owner>+<name>/repo
# (default /work/.mirror); DEST (default /tmp/py56) receives the package
# directories. Then:
#
#   export PYTHONPATH=/tmp/py56
#   /usr/bin/python3 -c 'import celery, kombu; print(celery.__version__, kombu.__version__)'
#
# tzlocal comes from regebro/tzlocal, redis-py 5.3 from redis/redis-py
# (Celery 5.6's Redis backend needs a newer one than Debian's 4.3). click, click-didyoumean, click-repl, click-plugins and python-dateutil come
# from Debian's packages; billiard runs without its C extension. Not used by
# `make test`.
set -euo pipefail
MIRRORS=${1:-/work/.mirror}
DEST=${2:-/tmp/py56}
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
mkdir -p "$DEST"
# mirror tag package-directory
while read -r proj tag pkg; do
    mkdir -p "$SRC/$proj"
    git --git-dir="$MIRRORS/$proj/repo" archive "$tag" | tar -x -C "$SRC/$proj"
    rm -rf "${DEST:?}/$pkg"
    cp -r "$SRC/$proj/$pkg" "$DEST/$pkg"
    echo "$proj $tag -> $DEST/$pkg"
done <<'LIST'
celery+celery v5.6.3 celery
celery+kombu v5.6.2 kombu
celery+py-amqp v5.3.1 amqp
celery+vine v5.1.0 vine
celery+billiard v4.2.4 billiard
regebro+tzlocal 5.4.4 tzlocal
redis+redis-py v5.3.1 redis
LIST
PYTHONPATH="$DEST" /usr/bin/python3 -c 'import celery, kombu, amqp, vine, billiard; print("celery", celery.__version__, "kombu", kombu.__version__, "amqp", amqp.__version__, "vine", vine.__version__, "billiard", billiard.__version__)'
