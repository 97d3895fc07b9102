"""Where records live: LMDB and LevelDB backends, readers, staged placement, file helpers, spill files."""
