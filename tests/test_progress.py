"""progress: the one callback signature, a no-op when off, a name put in front."""

from __future__ import annotations

from mnist2db.progress import labelled, named_reporting, reporting


def test_off_is_a_callable_no_op() -> None:
    assert reporting(None)(3, 10) is None
    assert named_reporting(None)("file", 3, 10) is None


def test_on_is_the_callback_itself() -> None:
    seen: list[tuple[int, int]] = []

    def report(done: int, total: int) -> None:
        seen.append((done, total))

    assert reporting(report) is report
    reporting(report)(5, 9)
    assert seen == [(5, 9)]


def test_labelled_reports_under_the_name() -> None:
    seen: list[tuple[str, int, int]] = []

    def named(name: str, done: int, total: int) -> None:
        seen.append((name, done, total))

    report = labelled(named, "mnist_train_lmdb")
    report(1000, 60000)
    report(60000, 60000)
    assert seen == [("mnist_train_lmdb", 1000, 60000), ("mnist_train_lmdb", 60000, 60000)]
