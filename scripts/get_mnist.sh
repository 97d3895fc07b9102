#!/usr/bin/env sh
# This script downloads the mnist data and unzips it: a drop-in for Caffe's
# data/mnist/get_mnist.sh, run from the Caffe (or project) root like create_mnist.sh.
# Files land in data/$DATASET (data/mnist), verified against the published checksums;
# files already present and verified are not downloaded again.
#
# Variables: DATASET (mnist, fashion-mnist, kmnist, emnist-<split> for byclass, bymerge,
# balanced, letters, digits, mnist, qmnist, qmnist-nist; default mnist), DATA (default
# data/$DATASET), MNIST2DB_MIRROR (a mirror tried first: URL or directory), MNIST2DB (the
# mnist2db command to run). EMNIST's gzip.zip is kept in data/emnist for every split. Extra
# arguments go to `mnist2db fetch`; -q or --quiet also silences this script's own lines.
set -e

DATASET="${DATASET:-mnist}"
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

say "Downloading..."

$MNIST2DB fetch --dataset "$DATASET" --data "$DATA" "$@"

say "Done."
