"""export --to webdataset: tar shards, their manifest, written and committed on threads."""
