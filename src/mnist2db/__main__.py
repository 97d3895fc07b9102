"""``mnist2db`` and ``python -m mnist2db``: a click-free fast path for a plain ``convert`` call.

Importing click costs about 25 ms, a quarter of converting the whole MNIST training set. A
command line that is exactly ``mnist2db convert [options] IMAGES LABELS OUT_DB`` with the
options spelled plainly (``--backend``, ``--batch-size``, ``--overwrite``, ``-q/--quiet``)
and no progress bar to draw is run here, with the same output, messages and exit codes as
the click command in :mod:`mnist2db.cli.app`. Everything else (help, version, other commands,
the conversion options ``--transpose``, ``--label-column``, ``--shuffle``/``--seed``,
``--offset``/``--count``, anything unusual or wrong) goes to click unchanged, so click stays the one definition of the
interface; ``tests/test_main.py`` checks that both paths behave the same.
"""

from __future__ import annotations

import sys


def parse_convert(args: list[str]) -> dict[str, object] | None:
    """The keyword arguments of a plain ``convert`` command line, or None to let click decide.

    Only what is unambiguous is accepted: three positional arguments that are not empty and
    do not start with ``-``, each option at most once, ``--batch-size`` as plain digits.
    """
    if not args or args[0] != "convert":
        return None
    from mnist2db.storage.backends import BACKENDS

    found: dict[str, object] = {}
    positional: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if not arg.startswith("-"):
            if not arg:
                return None
            positional.append(arg)
            continue
        name, has_value, value = arg.partition("=")
        if name in ("--backend", "--batch-size"):
            if not has_value:
                value = next(rest, "")
            key = name[2:].replace("-", "_")
            if key in found:
                return None
            if key == "backend":
                if value.lower() not in BACKENDS:
                    return None
                found[key] = value.lower()
            else:
                if not (value.isascii() and value.isdigit()) or int(value) < 1:
                    return None
                found[key] = int(value)
        elif name in ("--overwrite", "-q", "--quiet") and not has_value:
            key = "quiet" if name != "--overwrite" else "overwrite"
            if key in found:
                return None
            found[key] = True
        else:
            return None
    if len(positional) != 3:
        return None
    found["images"], found["labels"], found["out"] = positional
    return found


def _run_convert(options: dict[str, object]) -> int:
    from mnist2db.conversion import convert
    from mnist2db.errors import Mnist2dbError
    from mnist2db.storage.backends import DEFAULT_BACKEND, DEFAULT_BATCH_SIZE

    quiet = bool(options.get("quiet", False))
    try:
        result = convert(
            str(options["images"]),
            str(options["labels"]),
            str(options["out"]),
            backend=str(options.get("backend", DEFAULT_BACKEND)),
            batch_size=int(options.get("batch_size", DEFAULT_BATCH_SIZE)),  # type: ignore[call-overload]
            overwrite=bool(options.get("overwrite", False)),
        )
    except Mnist2dbError as exc:
        sys.stderr.write(f"Error: {exc}\n")
        return 1
    if not quiet:
        sys.stderr.write(result.summary() + "\n")
    return 0


def main() -> None:
    """Entry point of the ``mnist2db`` console script and of ``python -m mnist2db``."""
    options = parse_convert(sys.argv[1:])
    # A progress bar (stderr is a terminal and not --quiet) is click's job.
    if options is not None and (options.get("quiet") or not sys.stderr.isatty()):
        from mnist2db.interrupt import run

        sys.exit(run(lambda: _run_convert(options)))
    from mnist2db.cli.app import main as click_main

    click_main()


def script() -> None:
    """The installed ``mnist2db`` script and ``python -m mnist2db``: :func:`main`, the
    process ended without the interpreter's teardown (:func:`mnist2db.interrupt.as_script`)."""
    from mnist2db.interrupt import as_script

    as_script(main)


if __name__ == "__main__":
    script()
