"""The child process of tests/test_faults.py: runs ``mnist2db`` (or ``convert_mnist_data``)
with ``argv[1]`` (JSON: argv, flag file, where to pause), after replacing the staging
checkpoint hook or the CLI's progress reporter with a pause that writes the flag file and
waits, so that the test knows exactly where the child is when it strikes."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time

import mnist2db.cli.app as cli
import mnist2db.cli.convert_commands as convert_command
import mnist2db.storage.files as conv

cfg = json.loads(sys.argv[1])


def pause(where: str, flag: str = cfg["flag"], release: str | None = None) -> None:
    release = release if release is not None else cfg.get("release")
    with open(flag + ".tmp", "w") as f:
        f.write(where)
    os.rename(flag + ".tmp", flag)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if release and os.path.exists(release):
            return
        time.sleep(0.005)


stage = cfg.get("pause")
if stage == "midway":
    paused = []

    @contextlib.contextmanager
    def reporter(label, quiet):
        def report(done, total):
            if not paused and 2 * done >= total:
                paused.append(done)
                pause(str(done))

        yield report

    convert_command.progress_reporter = reporter
    if cfg.get("pause_cleanup"):  # a second stop, while the staging directory is removed

        def checkpoint(s, staging):
            if s == "cleanup":
                pause(staging, cfg["flag"] + "-cleanup", cfg["release_cleanup"])

        conv.checkpoint = checkpoint
elif stage:

    def checkpoint(s, staging):
        if s == stage:
            pause(staging)

    conv.checkpoint = checkpoint

if cfg.get("fsize"):
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
if cfg.get("tool") == "convert_mnist_data":
    import mnist2db.caffe_tools.drop_ins as compat

    sys.argv = ["convert_mnist_data", *cfg["argv"]]
    compat.main()
else:
    cli.main(cfg["argv"], prog_name="mnist2db")
