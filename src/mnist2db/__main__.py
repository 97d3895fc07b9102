"""``mnist2db`` and ``python -m mnist2db``: the click command line of :mod:`mnist2db.cli.app`."""

from __future__ import annotations

from mnist2db.cli.app import main
from mnist2db.interrupt import as_script


def script() -> None:
    """The installed ``mnist2db`` script and ``python -m mnist2db``: the click group, the
    process ended without the interpreter's teardown (:func:`mnist2db.interrupt.as_script`)."""
    as_script(main)


if __name__ == "__main__":
    script()
