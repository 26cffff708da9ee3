"""Progress bars on stderr for the long steps of a command (rich), never in anyone's way.

A bar is drawn only when the caller turned bars on (the command line does, except with
``--json``), stderr is a terminal, and the step has already run ``DELAY`` seconds; it is
transient (erased when the step ends), so short commands, pipes, logs and tests never see one.
Code marks a long step with ``with task("planning"):`` (a spinner with the elapsed time, or a bar
when it calls the yielded ``advance`` towards a ``total``) or a long loop with
``track(items, "verifying")``; without bars turned on both cost a context-variable read.

    >>> with task("counting", total=3) as advance:
    ...     for _ in range(3):
    ...         advance()
    >>> list(track(range(3), "walking"))
    [0, 1, 2]
"""

from __future__ import annotations

import contextlib
import sys
import threading
from contextvars import ContextVar

DELAY = 2.0  # seconds a step runs before its bar appears

_CONF: ContextVar = ContextVar("shardlayout_progress", default=None)  # (console, delay) when on
_ACTIVE: ContextVar = ContextVar("shardlayout_progress_bar", default=None)


@contextlib.contextmanager
def enabled(on: bool = True, console=None, delay: float | None = None):
    """Turn bars on for the steps run inside (when stderr is a terminal, or on ``console``)."""
    if on and console is None:
        stream = sys.stderr
        on = bool(getattr(stream, "isatty", None) and stream.isatty())
    token = _CONF.set((console, DELAY if delay is None else delay) if on else None)
    try:
        yield
    finally:
        _CONF.reset(token)


class _Bar:
    """One rich Progress, started by a timer after the delay, stopped (and erased) at the end."""

    def __init__(self, console, delay: float):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        class Count(ProgressColumn):  # "3/8" when the total is known, nothing for a spinner
            def render(self, t):
                return Text("" if t.total is None else f"{int(t.completed)}/{int(t.total)}", style="dim")

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), Count(),
                                 TimeElapsedColumn(), console=console or Console(file=sys.stderr),
                                 transient=True, redirect_stdout=False, redirect_stderr=False)
        self.lock = threading.Lock()
        self.started = self.stopped = False
        self.timer = threading.Timer(delay, self._start)
        self.timer.daemon = True
        self.timer.start()

    def _start(self) -> None:
        with self.lock:
            if not self.stopped:
                self.progress.start()
                self.started = True

    def stop(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.stopped = True
            if self.started:
                self.progress.stop()


@contextlib.contextmanager
def task(description: str, total: int | None = None):
    """A step that may take long; yields ``advance(n=1)`` (a no-op when no bar is drawn)."""
    conf = _CONF.get()
    if conf is None:
        yield _nothing
        return
    bar, own = _ACTIVE.get(), False
    if bar is None:
        bar, own = _Bar(*conf), True
    token = _ACTIVE.set(bar)
    tid = bar.progress.add_task(description, total=total)
    try:
        yield lambda n=1: bar.progress.advance(tid, n)
    finally:
        _ACTIVE.reset(token)
        if own:
            bar.stop()
        else:
            bar.progress.remove_task(tid)


def _nothing(n: int = 1) -> None:
    return None


def track(iterable, description: str, total: int | None = None):
    """``iterable``, advancing a bar by one per item (``total``: its length, when known)."""
    if _CONF.get() is None:
        yield from iterable
        return
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    with task(description, total) as advance:
        for x in iterable:
            yield x
            advance()


__all__ = ["DELAY", "enabled", "task", "track"]
