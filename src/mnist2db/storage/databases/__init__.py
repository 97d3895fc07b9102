"""LMDB and LevelDB: the backends, their writers, read handles, the checks before an open, the readers."""
