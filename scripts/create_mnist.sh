#!/usr/bin/env sh
# This script converts the mnist data into lmdb/leveldb format,
# depending on the value assigned to $BACKEND: a drop-in for Caffe's
# examples/mnist/create_mnist.sh, run from the Caffe (or project) root.
# It writes $EXAMPLE/mnist_train_$BACKEND and $EXAMPLE/mnist_test_$BACKEND, replacing
# existing databases as Caffe's does (a directory that is not a database is never removed).
#
# Variables: BACKEND (lmdb or leveldb; default lmdb), DATASET (default mnist),
# DATA (default data/$DATASET), EXAMPLE (default examples/$DATASET), MNIST2DB (the
# mnist2db command to run). Extra arguments go to `mnist2db create`; -q or --quiet also
# silences this script's own lines.
set -e

BACKEND="${BACKEND:-lmdb}"
DATASET="${DATASET:-mnist}"
EXAMPLE="${EXAMPLE:-examples/$DATASET}"
DATA="${DATA:-data/$DATASET}"

QUIET=""
for arg in "$@"; do
  case "$arg" in
    -q | --quiet) QUIET=1 ;;
  esac
done
say() {
  [ -n "$QUIET" ] || echo "$@"
}

if [ -z "$MNIST2DB" ]; then
  HERE="$(cd "$(dirname "$0")" && pwd -P)"
  if command -v mnist2db >/dev/null 2>&1; then
    MNIST2DB=mnist2db
  elif [ -x "$HERE/../.venv/bin/mnist2db" ]; then
    MNIST2DB="$HERE/../.venv/bin/mnist2db"
  else
    MNIST2DB="python3 -m mnist2db"
  fi
fi

say "Creating ${BACKEND}..."

$MNIST2DB create --dataset "$DATASET" --data "$DATA" --out "$EXAMPLE" \
  --backend "$BACKEND" --overwrite "$@"

say "Done."
