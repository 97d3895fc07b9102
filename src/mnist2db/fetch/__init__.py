"""Getting a dataset: the catalog (data, no network imports), the transport, the sink that hashes and unpacks, the manifest, archives, and the orchestration (:mod:`.fetcher`)."""
