"""glog-style log lines for the drop-ins of Caffe's tools, honouring glog's flags.

A line is ``I20261130 13:22:14.123456 12345 convert_mnist_data.cpp:88] A total of …``
(glog 0.6: severity, date with the year, time, thread id, source location, message). Caffe's
own messages carry Caffe's source location, so logs compare line for line; mnist2db's own
(errors) carry the drop-in's. Where a line goes follows glog: nothing below
``--minloglevel``; stdout with ``--logtostdout``; stderr with ``--logtostderr`` or
``--alsologtostderr`` (Caffe's convert_mnist_data and compute_image_mean set the latter) or
at ``--stderrthreshold`` and above (ERROR by default). glog would also write log files under
``--log_dir`` (``/tmp``); the drop-ins write none. ``--log_prefix=false`` drops the prefix,
``--log_year_in_prefix=false`` the year, ``--log_utc_time`` uses UTC.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from mnist2db.fastpath import TYPE_CHECKING

if TYPE_CHECKING:
    from mnist2db.caffe_tools.gflags import ParsedArgs

SEVERITIES = {"I": 0, "W": 1, "E": 2, "F": 3}


class Logger:
    """Writes glog lines as the parsed glog flags say."""

    def __init__(self, flags: ParsedArgs) -> None:
        self.minloglevel = int(flags["minloglevel"])  # type: ignore[call-overload]
        self.stderrthreshold = int(flags["stderrthreshold"])  # type: ignore[call-overload]
        self.to_stdout = bool(flags["logtostdout"])
        self.to_stderr = bool(flags["logtostderr"]) or bool(flags["alsologtostderr"])
        self.prefix = bool(flags["log_prefix"])
        self.year = bool(flags["log_year_in_prefix"])
        self.utc = bool(flags["log_utc_time"])

    def enabled(self, severity: str) -> bool:
        level = SEVERITIES[severity]
        if level < self.minloglevel:
            return False
        return self.to_stdout or self.to_stderr or level >= self.stderrthreshold

    def log(self, severity: str, where: str, message: str) -> None:
        """Write one line at ``severity`` (``"I"``, ``"W"``, ``"E"``), from ``where`` (file:line)."""
        if not self.enabled(severity):
            return
        line = message
        if self.prefix:
            now = time.time()
            parts = time.gmtime(now) if self.utc else time.localtime(now)
            date = time.strftime("%Y%m%d" if self.year else "%m%d", parts)
            clock = time.strftime("%H:%M:%S", parts)
            micros = int((now % 1) * 1_000_000)
            tid = threading.get_native_id() if hasattr(threading, "get_native_id") else os.getpid()
            line = f"{severity}{date} {clock}.{micros:06d} {tid:5d} {where}] {message}"
        stream = sys.stdout if self.to_stdout else sys.stderr
        stream.write(line + "\n")
        stream.flush()
