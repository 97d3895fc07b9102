"""The decoding worker processes: the pool, a worker's loop, its messages and its shared ring."""
