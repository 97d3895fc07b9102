#!/usr/bin/env sh
# This script converts the mnist data into leveldb format: a drop-in for Caffe's
# examples/siamese/create_mnist_siamese.sh, run from the Caffe (or project) root.
# It writes $EXAMPLE/mnist_siamese_train_$BACKEND and $EXAMPLE/mnist_siamese_test_$BACKEND
# from $DATA, replacing existing databases as Caffe's does (a directory that is not a
# database is never removed).
#
# Variables: BACKEND (leveldb or lmdb; default leveldb, as Caffe), DATA (default data/mnist),
# EXAMPLE (default examples/siamese), SEED (a number: the same pairs on every run; default
# fresh pairs each run, as Caffe), MNIST2DB (the mnist2db command to run). Extra arguments
# (e.g. --balanced) go to `mnist2db siamese`.
set -e

BACKEND="${BACKEND:-leveldb}"
EXAMPLE="${EXAMPLE:-examples/siamese}"
DATA="${DATA:-data/mnist}"

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

echo "Creating ${BACKEND}..."

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

echo "Done."
