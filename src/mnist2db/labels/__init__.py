"""Labels beyond one integer: a label database of float values beside an image database,
under the same keys (:mod:`.databases`: written, paired, verified); the pair is read back as
``(image, values)`` by the reading API (:mod:`mnist2db.reading.labeled_dataset`)."""
