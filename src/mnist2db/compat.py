"""``convert_mnist_data``: a drop-in for Caffe's tool, with Caffe's command line and log lines.

Usage, as in Caffe::

    convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file

Flags follow gflags syntax: ``--backend=leveldb``, ``--backend leveldb``,
``-backend=leveldb``, before or after the positional arguments, ``--`` ending the flags.
glog's own flags (``--logtostderr``, ``--v=1``, ...) that scripts pass to Caffe tools are
accepted; ``--minloglevel`` of 1 or more silences the INFO lines.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from . import __version__

__all__ = ["FlagError", "main", "parse_flags"]

PROG = "convert_mnist_data"

USAGE = """\
This script converts the MNIST dataset to
the lmdb/leveldb format used by Caffe to load data.
Usage:
    convert_mnist_data [FLAGS] input_image_file input_label_file output_db_file
The MNIST dataset could be downloaded at
    http://yann.lecun.com/exdb/mnist/
You should gunzip them after downloading,or directly use data/mnist/get_mnist.sh
(mnist2db also reads the .gz files as they are; `mnist2db fetch` downloads them.)
"""

#: name -> (type, default, help); the flags this tool defines.
FLAGS: dict[str, tuple[str, object, str]] = {
    "backend": ("string", "lmdb", "The backend for storing the result"),
    "batch_size": ("int32", 1000, "Records per transaction (mnist2db extension)"),
    "overwrite": (
        "bool",
        False,
        "Replace an existing database at output_db_file (mnist2db extension)",
    ),
}

#: glog flags Caffe tools accept; taken and ignored except minloglevel.
GLOG_BOOL_FLAGS = {"logtostderr", "alsologtostderr", "colorlogtostderr", "log_prefix"}
GLOG_VALUE_FLAGS = {"v", "vmodule", "minloglevel", "stderrthreshold", "log_dir", "logbuflevel"}


class FlagError(Exception):
    """A command line gflags would reject."""


@dataclass
class ParsedArgs:
    flags: dict[str, object] = field(
        default_factory=lambda: {n: d for n, (_, d, _) in FLAGS.items()}
    )
    positional: list[str] = field(default_factory=list)
    help: bool = False
    version: bool = False
    minloglevel: int = 0


def _set_value(parsed: ParsedArgs, name: str, value: str) -> None:
    kind = FLAGS[name][0]
    if kind == "int32":
        try:
            number = int(value)
        except ValueError:
            raise FlagError(f"illegal value '{value}' specified for int32 flag '{name}'") from None
        if name == "batch_size" and number < 1:
            raise FlagError(
                f"illegal value '{value}' specified for int32 flag '{name}': must be >= 1"
            )
        parsed.flags[name] = number
    elif kind == "bool":
        lowered = value.lower()
        if lowered in ("true", "t", "yes", "y", "1"):
            parsed.flags[name] = True
        elif lowered in ("false", "f", "no", "n", "0"):
            parsed.flags[name] = False
        else:
            raise FlagError(f"illegal value '{value}' specified for bool flag '{name}'")
    else:
        parsed.flags[name] = value


def parse_flags(argv: list[str]) -> ParsedArgs:
    """Parse a command line the way gflags' ParseCommandLineFlags does.

    Raises:
        FlagError: an unknown flag, a flag missing its value, or an illegal value.
    """
    parsed = ParsedArgs()
    args = iter(argv)
    for arg in args:
        if arg == "--":
            parsed.positional.extend(args)
            break
        if not arg.startswith("-") or arg == "-":
            parsed.positional.append(arg)
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        name, has_value, value = body.partition("=")
        if name in ("help", "helpfull", "helpshort", "h"):
            parsed.help = True
            continue
        if name == "version":
            parsed.version = True
            continue
        if name in FLAGS:
            if FLAGS[name][0] == "bool":
                _set_value(parsed, name, value if has_value else "true")
                continue
            if not has_value:
                try:
                    value = next(args)
                except StopIteration:
                    raise FlagError(f"flag '{arg}' is missing its argument") from None
            _set_value(parsed, name, value)
            continue
        if name.startswith("no") and name[2:] in FLAGS and FLAGS[name[2:]][0] == "bool":
            if has_value:
                raise FlagError(f"boolean flag '{name}' does not take a value")
            parsed.flags[name[2:]] = False
            continue
        if name in GLOG_BOOL_FLAGS or (name.startswith("no") and name[2:] in GLOG_BOOL_FLAGS):
            continue
        if name in GLOG_VALUE_FLAGS:
            if not has_value:
                try:
                    value = next(args)
                except StopIteration:
                    raise FlagError(f"flag '{arg}' is missing its argument") from None
            if name == "minloglevel":
                try:
                    parsed.minloglevel = int(value)
                except ValueError:
                    raise FlagError(
                        f"illegal value '{value}' specified for int32 flag 'minloglevel'"
                    ) from None
            continue
        raise FlagError(f"unknown command line flag '{name}'")
    return parsed


def usage_text(argv0: str) -> str:
    """Caffe's usage message followed by the flags, as gflags prints them."""
    lines = [f"{argv0}: {USAGE}", "", "  Flags from examples/mnist/convert_mnist_data.cpp:"]
    for name, (kind, default, text) in FLAGS.items():
        shown = f'"{default}"' if kind == "string" else str(default).lower()
        lines.append(f"    -{name} ({text}) type: {kind}")
        lines.append(f"      default: {shown}")
    return "\n".join(lines) + "\n"


def _log(level: str, message: str) -> None:
    """One glog-style line on stderr: ``I1129 21:22:14.123456 12345 convert_mnist_data] ...``."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now))
    micros = int((now % 1) * 1_000_000)
    sys.stderr.write(f"{level}{stamp}.{micros:06d} {os.getpid():5d} {PROG}] {message}\n")
    sys.stderr.flush()


def run(argv: list[str]) -> int:
    """Run the tool on ``argv`` (without the program name); returns the exit code."""
    argv0 = PROG
    try:
        parsed = parse_flags(argv)
    except FlagError as exc:
        sys.stderr.write(f"ERROR: {exc}\n")
        return 2
    if parsed.help:
        sys.stdout.write(usage_text(argv0))
        return 0
    if parsed.version:
        sys.stdout.write(f"{PROG} (mnist2db) version {__version__}\n")
        return 0
    if len(parsed.positional) != 3:
        sys.stderr.write(usage_text(argv0))
        return 2
    backend = str(parsed.flags["backend"])
    image_file, label_file, db_path = parsed.positional
    info = parsed.minloglevel < 1

    from .conversion import convert
    from .errors import Mnist2dbError

    try:
        result = convert(
            image_file,
            label_file,
            db_path,
            backend=backend,
            batch_size=int(parsed.flags["batch_size"]),  # type: ignore[call-overload]
            overwrite=bool(parsed.flags["overwrite"]),
        )
    except Mnist2dbError as exc:
        _log("E", str(exc))
        return 1
    if info:
        _log("I", f"Opened {result.backend} {result.path}")
        _log("I", f"A total of {result.count} items.")
        _log("I", f"Rows: {result.rows} Cols: {result.cols}")
        _log("I", f"Processed {result.count} files.")
    return 0


def main() -> None:
    """Entry point of the ``convert_mnist_data`` console script."""
    from .interrupt import Interrupted, exit_code, signals_raise_interrupted

    try:
        with signals_raise_interrupted():
            code = run(sys.argv[1:])
    except (Interrupted, KeyboardInterrupt) as exc:
        sys.stderr.write("Interrupted\n")
        sys.exit(exit_code(exc))
    sys.exit(code)
