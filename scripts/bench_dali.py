"""NVIDIA DALI's CPU pipeline over a Caffe LMDB, timed in its own process (DALI lives in its
own environment: make test-dali makes .venv-dali). Run by scripts/bench_read.py.

    .venv-dali/bin/python scripts/bench_dali.py DB {raw,png} [--batch 500] [--threads 2]
        [--repeat 3]

Prints the best records/s of ``--repeat`` epochs (one untimed epoch first): fn.readers.caffe,
and for PNG records fn.decoders.image(..., output_type=types.GRAY), on the CPU
(device_id=None), each batch's outputs taken as numpy arrays (one copy a batch).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from nvidia.dali import fn, pipeline_def, types


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("kind", choices=["raw", "png"])
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    @pipeline_def(batch_size=args.batch, num_threads=args.threads, device_id=None)
    def pipeline():  # type: ignore[no-untyped-def]
        data, label = fn.readers.caffe(path=args.db, random_shuffle=False, name="reader")
        if args.kind == "png":
            data = fn.decoders.image(data, device="cpu", output_type=types.GRAY)
        return data, label

    pipe = pipeline()
    pipe.build()
    total = pipe.epoch_size("reader")
    batches = -(-total // args.batch)

    def epoch() -> float:
        start = time.perf_counter()
        for _ in range(batches):
            data, label = pipe.run()
            np.asarray(data.as_array())  # one (batch, ...) array each
            np.asarray(label.as_array())
        return time.perf_counter() - start

    epoch()
    best = min(epoch() for _ in range(args.repeat))
    print(batches * args.batch / best)


if __name__ == "__main__":
    main()
