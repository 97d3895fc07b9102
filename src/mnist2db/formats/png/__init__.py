"""PNG written for encoded Datums: the encoder and its fast deflate streams."""
