"""``shardlayout(*argv, env=None)``: the command's exit code and output, as ``subprocess.run`` gives
them. In this process when no environment is given (its ranks fork from this process's forkserver,
which imported torch once for the session: a job costs seconds less than a fresh interpreter that
imports torch twice); in a subprocess with ``env`` (variables the ranks must see, e.g. a fault to
inject, reach them only through a fresh launcher)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys


def shardlayout(*argv, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    if env is not None:
        cmd = [sys.executable, "-m", "shardlayout", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    from shardlayout.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse usage errors
            code = e.code
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())
