"""Labels beyond one integer: a label database of float targets beside an image database,
under the same keys (:mod:`.databases`: written, paired, verified), and the pair read back as
``(image, targets)`` (:mod:`.dataset`, ``open_db(images, labels=...)``)."""
