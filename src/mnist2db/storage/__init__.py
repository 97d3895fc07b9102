"""Where outputs go and how they are placed: destinations checked, databases staged and placed,
file helpers, spill files, the records' digest; LMDB and LevelDB themselves are :mod:`.databases`."""
