"""A command-line parser that behaves as gflags 2.2 does, for the drop-ins of Caffe's tools.

Caffe's tools call ``gflags::ParseCommandLineFlags(&argc, &argv, true)``; scripts written
for them pass gflags spellings and gflags' and glog's own flags. This module parses a
command line the same way (``gflags.cc``'s ``ParseNewCommandLineFlags``):

- ``--name=value``, ``--name value``, ``-name=value``, ``-name value``; flags and file names
  in any order (non-flags are moved to the end); ``--`` ends the flags (what follows comes
  first among the positional arguments, as gflags permutes them); ``-`` is an argument.
- Booleans: ``--x``, ``--nox``, ``--x=true|false|t|f|yes|no|y|n|1|0`` (any case); ``--nox=…``
  sets false whatever the value. Dashes in names match underscores (``--batch-size``).
- Numbers as ``strtoll``: leading white space, a sign, ``0x`` for hexadecimal; int32 values
  outside int32 are illegal; unsigned flags refuse a minus sign.
- gflags' own flags: ``--flagfile=F[,F…]`` (lines ``--flag=value``, ``#`` comments, program
  name globs starting a section; unknown flags in a flagfile are ignored, as gflags does),
  ``--fromenv``/``--tryfromenv`` (``FLAGS_<name>`` variables), ``--undefok=a,b`` (those
  unknown flags are ignored; a value given as a separate word then counts as an argument),
  ``--help`` and friends, ``--version``.
- glog's flags (glog 0.6, as Debian 12 builds Caffe): typed and stored, with their
  ``GLOG_<name>`` environment defaults; the logging ones are honoured by :mod:`mnist2db.caffe_tools.glog`.
- Errors are collected per flag, reported together, one ``ERROR: …`` line each, in flag-name
  order; the caller exits 1 (``gflags_exitfunc(1)``). Help wins over errors, as in gflags.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections import namedtuple

#: A flag: its name, gflags type name, default, help text, an optional validator, and
#: optional ``(low, high)`` bounds that replace the type's range (an mnist2db extension: a
#: seed is an int64 flag, so that -1 can mean "fresh", that also takes 2**63 … 2**64-1).
Flag = namedtuple("Flag", "name kind default help validate bounds", defaults=(None, None))


class FlagError(Exception):
    """A command line gflags would reject; the message is gflags' ``ERROR: …`` line(s)."""


def _flags(*flags: Flag) -> dict[str, Flag]:
    return {flag.name: flag for flag in flags}


#: gflags' own flags (gflags.cc, gflags_reporting.cc, gflags_completions.cc).
GFLAGS_FLAGS = _flags(
    Flag("flagfile", "string", "", "load flags from file"),
    Flag("fromenv", "string", "", "set flags from the environment [use 'export FLAGS_flag1=value']"),
    Flag("tryfromenv", "string", "", "set flags from the environment if present"),
    Flag("undefok", "string", "", "comma-separated list of flag names that it is okay to specify on the command line even if the program does not define a flag with that name.  IMPORTANT: flags in this list that have arguments MUST use the flag=value format"),
    Flag("help", "bool", False, "show help on all flags [tip: all flags can have two dashes]"),
    Flag("helpfull", "bool", False, "show help on all flags -- same as -help"),
    Flag("helpshort", "bool", False, "show help on only the main module for this program"),
    Flag("helppackage", "bool", False, "show help on all modules in the main package"),
    Flag("helpxml", "bool", False, "produce an xml version of help"),
    Flag("helpon", "string", "", "show help on the modules named by this flag value"),
    Flag("helpmatch", "string", "", "show help on modules whose name contains the specified substr"),
    Flag("version", "bool", False, "show version and build info and exit"),
    Flag("tab_completion_word", "string", "", "If non-empty, HandleCommandLineCompletions() will hijack the process and attempt to do bash-style command line flag completion on this value."),
    Flag("tab_completion_columns", "int32", 80, "Number of columns to use in output for tab completion"),
)  # fmt: skip

#: glog 0.6's flags: name -> (type, default). Those marked by GLOG_DEFINE take their default
#: from the environment variable GLOG_<name>; stderrthreshold does not.
GLOG_FLAGS = _flags(
    *(
        Flag(name, kind, default, f"glog flag --{name}")
        for name, kind, default in (
            ("timestamp_in_logfile_name", "bool", True),
            ("logtostderr", "bool", False),
            ("alsologtostderr", "bool", False),
            ("colorlogtostderr", "bool", False),
            ("colorlogtostdout", "bool", False),
            ("logtostdout", "bool", False),
            ("drop_log_memory", "bool", True),
            ("stderrthreshold", "int32", 2),
            ("alsologtoemail", "string", ""),
            ("log_prefix", "bool", True),
            ("log_year_in_prefix", "bool", True),
            ("minloglevel", "int32", 0),
            ("logbuflevel", "int32", 0),
            ("logbufsecs", "int32", 30),
            ("logcleansecs", "int32", 300),
            ("logemaillevel", "int32", 999),
            ("logmailer", "string", ""),
            ("logfile_mode", "int32", 0o664),
            ("log_dir", "string", ""),
            ("log_link", "string", ""),
            ("max_log_size", "uint32", 1800),
            ("stop_logging_if_full_disk", "bool", False),
            ("log_backtrace_at", "string", ""),
            ("log_utc_time", "bool", False),
            ("v", "int32", 0),
            ("vmodule", "string", ""),
            ("symbolize_stacktrace", "bool", True),
        )
    )
)
_GLOG_NO_ENV = {"stderrthreshold"}

_TRUE = ("1", "t", "true", "y", "yes")
_FALSE = ("0", "f", "false", "n", "no")
_RANGES = {
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}
_DECIMAL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_HEX = re.compile(r"[ \t\n\v\f\r]*([+-]?)(?:0[xX])?([0-9a-fA-F]+)")
_HELP_BOOLS = ("help", "helpfull", "helpshort", "helppackage", "helpxml")


def parse_value(kind: str, text: str, bounds: tuple[int, int] | None = None) -> object:
    """``FlagValue::ParseFrom``: the value, or raise ValueError when gflags would refuse it.
    ``bounds`` replaces the integer type's range."""
    if kind == "bool":
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(text)
    if kind == "string":
        return text
    if not text:
        raise ValueError(text)
    if kind == "double":
        try:
            return float(text)
        except ValueError:
            raise ValueError(text) from None
    # The base is decided on the raw text, as gflags does: "0x…" is hexadecimal.
    body = text
    if kind.startswith("uint"):
        body = body.lstrip(" ")
        if body.startswith("-"):
            raise ValueError(text)
    hexadecimal = text[:2] in ("0x", "0X")
    match = (_HEX if hexadecimal else _DECIMAL).fullmatch(body)
    if match is None:
        raise ValueError(text)
    number = int(match.group(1) + match.group(2), 16) if hexadecimal else int(match.group(1))
    low, high = bounds or _RANGES[kind]
    if kind.startswith("uint") and number < 0:
        number += 1 << 64  # strtoull wraps a negative: "+…" only reaches here
    if not low <= number <= high:
        raise ValueError(text)
    return number


def _env_default(flag: Flag) -> object:
    """glog's EnvToBool/EnvToInt/EnvToUInt/EnvToString on GLOG_<name>."""
    value = os.environ.get(f"GLOG_{flag.name}")
    if value is None or flag.name in _GLOG_NO_ENV:
        return flag.default
    if flag.kind == "bool":
        return (value[:1] or "\0") in "tTyY1\0"
    if flag.kind in ("int32", "uint32"):
        match = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", value)
        return int(match.group(1)) if match else 0
    return value


class ParsedArgs:
    """The outcome of :func:`parse_command_line`: flag values and positional arguments."""

    def __init__(self, flags: dict[str, Flag], argv0: str) -> None:
        self.flags = flags
        self.argv0 = argv0
        self.values: dict[str, object] = {
            name: (_env_default(flag) if name in GLOG_FLAGS else flag.default)
            for name, flag in flags.items()
        }
        self.positional: list[str] = []
        self.errors: dict[str, str] = {}
        self.undefined: set[str] = set()
        self.reading: list[str] = []  # flagfiles being read, innermost last

    def __getitem__(self, name: str) -> object:
        return self.values[name]

    @property
    def help(self) -> bool:
        v = self.values
        return any(v[name] for name in _HELP_BOOLS) or bool(v["helpon"] or v["helpmatch"])

    @property
    def version(self) -> bool:
        return bool(self.values["version"])

    # -- gflags' FlagRegistry and CommandLineFlagParser --------------------------------

    def find(self, name: str) -> Flag | None:
        flag = self.flags.get(name)
        if flag is None and "-" in name:
            flag = self.flags.get(name.replace("-", "_"))
        return flag

    def split(self, arg: str) -> tuple[str, Flag | None, str | None]:
        """``SplitArgumentLocked``: (key, flag or None, value or None); records errors."""
        key, has_value, text = arg.partition("=")
        value: str | None = text if has_value else None
        flag = self.find(key)
        if flag is None:
            base = self.find(key[2:]) if key.startswith("no") else None
            if base is None:
                self.undefined.add(key)
                self.errors[key] = f"ERROR: unknown command line flag '{key}'"
                return key, None, None
            if base.kind != "bool":
                self.undefined.add(key)
                self.errors[key] = (
                    f"ERROR: boolean value ({key}) specified for {base.kind} command line flag"
                )
                return key, None, None
            return base.name, base, "0"
        if value is None and flag.kind == "bool":
            value = "1"
        return key, flag, value

    def set(self, flag: Flag, value: str) -> None:
        """``ProcessSingleOptionLocked``: parse, validate, store; then the recursive flags."""
        try:
            parsed = parse_value(flag.kind, value, flag.bounds)
        except ValueError:
            self.errors[flag.name] = (
                f"ERROR: illegal value '{value}' specified for {flag.kind} flag '{flag.name}'"
            )
            return
        if flag.validate is not None and not flag.validate(parsed):
            shown = str(parsed).lower() if flag.kind == "bool" else str(parsed)
            self.errors[flag.name] = (
                f"ERROR: failed validation of new value '{shown}' for flag '{flag.name}'"
            )
            return
        self.values[flag.name] = parsed
        if flag.name == "flagfile":
            for path in _flag_list(str(parsed)):
                self.read_flagfile(path)
        elif flag.name in ("fromenv", "tryfromenv"):
            self.read_environment(str(parsed), fatal=flag.name == "fromenv")

    def read_flagfile(self, path: str) -> None:
        """``ProcessOptionsFromStringLocked`` on the file's contents."""
        if path in self.reading:
            # gflags recurses until the stack overflows; stop with one line instead.
            raise FlagError(f"ERROR: flagfile '{path}' includes itself")
        if len(self.reading) >= FLAGFILE_DEPTH:
            # A chain of distinct names (or one file under ever new spellings) would end in
            # Python's RecursionError.
            raise FlagError(
                f"ERROR: flagfile '{path}': flagfiles nested more than {FLAGFILE_DEPTH} deep"
            )
        contents = read_flagfile_text(path)
        self.reading.append(path)
        try:
            self._apply_flagfile(contents)
        finally:
            self.reading.pop()

    def _apply_flagfile(self, contents: str) -> None:
        relevant = True
        in_names = False
        names = {self.argv0, os.path.basename(self.argv0)}
        for raw_line in re.split(r"[\r\n]", contents):
            line = raw_line.lstrip(" \t\n\v\f\r")
            if not line or line.startswith("#"):
                continue
            if line.startswith("-"):
                in_names = False
                if not relevant:
                    continue
                body = line[2:] if line.startswith("--") else line[1:]
                key = body.partition("=")[0]
                before = (self.errors.get(key), key in self.undefined)
                _, flag, value = self.split(body)
                if flag is None:
                    # Errors in a flagfile's flag names are ignored, by gflags' API.
                    if before[0] is None:
                        self.errors.pop(key, None)
                    else:
                        self.errors[key] = before[0]
                    if not before[1]:
                        self.undefined.discard(key)
                elif value is not None:
                    self.set(flag, value)
            else:
                if not in_names:
                    in_names, relevant = True, False
                if not relevant:
                    relevant = any(
                        glob in names or any(fnmatch.fnmatchcase(n, glob) for n in names)
                        for glob in line.split(" ")
                        if glob
                    )

    def read_environment(self, names: str, *, fatal: bool) -> None:
        """``ProcessFromenvLocked``: set each named flag from ``FLAGS_<name>``."""
        for name in _flag_list(names):
            flag = self.find(name)
            if flag is None:
                self.errors[name] = (
                    f"ERROR: unknown command line flag '{name}' (via --fromenv or --tryfromenv)"
                )
                self.undefined.add(name)
                continue
            value = os.environ.get(f"FLAGS_{name}")
            if value is None:
                if fatal:
                    self.errors[name] = f"ERROR: FLAGS_{name} not found in environment"
                continue
            if value in ("fromenv", "tryfromenv"):
                self.errors[name] = f"ERROR: infinite recursion on environment flag '{value}'"
                continue
            self.set(flag, value)

    def report(self) -> None:
        """``ReportErrors``: forgive --undefok names, then raise every error at once."""
        for name in _flag_list(str(self.values["undefok"])):
            if name in self.undefined:
                self.errors[name] = ""
            elif f"no{name}" in self.undefined:
                self.errors[f"no{name}"] = ""
        messages = [message for _, message in sorted(self.errors.items()) if message]
        if messages:
            raise FlagError("\n".join(messages))


#: The largest flagfile read: a flagfile is a few lines of ``--flag=value``.
FLAGFILE_LIMIT = 1 << 20
#: How deep flagfiles may include flagfiles.
FLAGFILE_DEPTH = 64


def read_flagfile_text(path: str) -> str:
    """The text of the flagfile ``path``: a regular file (never a FIFO, which would wait for a
    writer, nor a device such as ``/dev/zero``, which never ends), at most
    :data:`FLAGFILE_LIMIT` bytes.

    Raises:
        FlagError: one line naming the file (gflags' ``PFATAL(filename)``: ``path: reason``).
    """
    import stat

    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer; the type is then checked
        # on what was opened (the name could change between a stat and the open).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise FlagError(f"{path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise FlagError(f"{path}: {kind}; a flagfile is a text file of --flag=value lines")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(FLAGFILE_LIMIT + 1)
    except OSError as exc:
        raise FlagError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > FLAGFILE_LIMIT:
        raise FlagError(
            f"{path}: larger than {FLAGFILE_LIMIT} bytes; a flagfile is a few --flag=value lines"
        )
    return data.decode("utf-8", errors="surrogateescape")


def _flag_list(value: str) -> list[str]:
    """gflags' ParseFlagList: comma-separated names, none empty, none starting with '-'."""
    items: list[str] = []
    rest = value
    while rest:
        item, comma, after = rest.partition(",")
        if not item:
            raise FlagError("ERROR: empty flaglist entry")
        if item.startswith("-"):
            raise FlagError(f"ERROR: flag \"{rest}\" begins with '-'")
        items.append(item)
        rest = after if comma else ""
    return items


def parse_command_line(
    argv: list[str],
    flags: dict[str, Flag],
    argv0: str,
    preset: dict[str, object] | None = None,
) -> ParsedArgs:
    """Parse ``argv`` (without the program name) against the program's ``flags``, plus
    gflags' and glog's own, as ``gflags::ParseCommandLineFlags(..., true)`` does.
    ``preset`` holds values the program assigns before parsing (``FLAGS_x = …``).

    Returns:
        The values (``parsed[name]``) and the positional arguments. When a help flag is
        given, ``parsed.help`` is true and errors are not raised (gflags prints help first).

    Raises:
        FlagError: the command line holds errors (all of them, one ``ERROR:`` line each).
    """
    parsed = ParsedArgs({**GFLAGS_FLAGS, **GLOG_FLAGS, **flags}, argv0)
    parsed.values.update(preset or {})  # what the program sets before parsing
    args = list(argv)
    moved: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            moved.append(arg)  # gflags moves non-flags to the end
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body:  # "--" (or a lone "-" after a dash) ends the flags
            parsed.positional = args[i:] + moved
            break
        key, flag, value = parsed.split(body)
        if flag is None:
            continue
        if value is None:
            # The next word that is not already an argument moved away is the value.
            if i >= len(args):
                parsed.errors[key] = (
                    f"ERROR: flag '{arg}' is missing its argument; flag description: {flag.help}"
                )
                break
            value = args[i]
            i += 1
        parsed.set(flag, value)
    else:
        parsed.positional = moved
    if not parsed.help:
        parsed.report()
    return parsed


def usage_text(argv0: str, usage: str, source: str, flags: dict[str, Flag]) -> str:
    """``ShowUsageWithFlagsRestrict(argv0, source)``: the usage, then the program's flags."""
    lines = [f"{os.path.basename(argv0)}: {usage}", "", f"  Flags from {source}:"]
    for name, flag in sorted(flags.items()):
        shown = f'"{flag.default}"' if flag.kind == "string" else str(flag.default).lower()
        lines.append(f"    -{name} ({flag.help}) type: {flag.kind}")
        lines.append(f"      default: {shown}")
    return "\n".join(lines) + "\n"
