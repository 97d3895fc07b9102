#!/usr/bin/env sh
# This script converts the mnist data into leveldb format: a drop-in for Caffe's
# examples/siamese/create_mnist_siamese.sh, run from the Caffe (or project) root.
# It writes $EXAMPLE/mnist_siamese_train_$BACKEND and $EXAMPLE/mnist_siamese_test_$BACKEND
# from $DATA, replacing existing databases as Caffe's does (a directory that is not a
# database is never removed).
#
# Variables: BACKEND (leveldb or lmdb; default leveldb, as Caffe), DATASET (a dataset
# stored under MNIST's file names: mnist, fashion-mnist, kmnist, emnist-<split>; default
# mnist), DATA (default data/$DATASET), EXAMPLE (default examples/siamese for mnist, as
# Caffe; examples/siamese/$DATASET for another dataset, so that it never replaces MNIST's
# pairs), SEED (a number: the same pairs on every run; default fresh pairs each run, as
# Caffe), MNIST2DB (the mnist2db command to run). Extra arguments (e.g. --balanced) go to
# `mnist2db siamese`; -q or --quiet also silences this script's own lines.
set -e

BACKEND="${BACKEND:-leveldb}"
DATASET="${DATASET:-mnist}"
DATA="${DATA:-data/$DATASET}"
if [ "$DATASET" = mnist ]; then
  EXAMPLE="${EXAMPLE:-examples/siamese}"
else
  EXAMPLE="${EXAMPLE:-examples/siamese/$DATASET}"
fi

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

SEED_OPTION=""
if [ -n "$SEED" ]; then
  SEED_OPTION="--seed=$SEED"
fi

for split in train t10k; do
  name=train
  if [ "$split" = t10k ]; then
    name=test
  fi
  $MNIST2DB siamese --backend "$BACKEND" --overwrite $SEED_OPTION \
    "$DATA/$split-images-idx3-ubyte" "$DATA/$split-labels-idx1-ubyte" \
    "$EXAMPLE/mnist_siamese_${name}_$BACKEND" "$@"
done

say "Done."
