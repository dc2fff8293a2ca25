"""Where a launched run's streamed log goes: the job's ``flwr.log`` and the console, the console without
Flower's lines that do not apply to a collapipe run and without tracebacks (both stay in flwr.log)."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from collapipe_flwr.experiments.log_errors import ANSI

# Flower lines that do not apply to a collapipe run (it sets num-supernodes itself); kept in flwr.log.
QUIET_LINES = (
    "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "To change federation size, use the following command:",
    "flwr federation simulation-config",
    "Manually terminating ClientAppActor",  # Flower stopping its simulation workers at the end of every run
    # a ServerApp that raised: the run's own "error:" line says why, its traceback is in flwr.log
    "Simulation raised an exception",
    "Exit Code: 700",
    "An unhandled exception occurred when running the simulation.",
    "ref-exit-codes/700.html",
)


class ConsoleEcho:
    """A write-only stream for the launcher's log pump: every line to ``out`` (default: the current
    ``sys.stdout``) except :data:`QUIET_LINES` and Python tracebacks, unless ``verbose``.

    A run that fails prints its one-line ``error:`` first; the traceback Flower logs after it (about 40 lines of
    Flower's and the project's frames) stays in flwr.log, and the console gets one line saying where it is."""

    def __init__(self, out: TextIO | None = None, verbose: bool = False) -> None:
        self.out = out
        self.verbose = verbose
        self._traceback = ""  # "" | "in" (inside one) | "after" (its last line seen)
        self._pointed = False  # the pointer to flwr.log was written for this traceback

    def write(self, line: str) -> int:
        if self.verbose or not self._hidden(ANSI.sub("", line)):
            (self.out or sys.stdout).write(line)
        return len(line)

    def _hidden(self, plain: str) -> bool:
        """Whether the line is one of QUIET_LINES or part of a traceback (chained ones included: after a
        traceback's last line, blank lines and "The above exception ..." keep it going)."""
        stripped = plain.strip()
        if self._traceback == "after":  # the exception's own line was the last: does a chained part follow?
            if not stripped:
                return True
            self._traceback = "in" if stripped.startswith(TRACEBACK_JOINS) else ""
            if self._traceback:
                return True
            self._pointed = False
        if plain.startswith("Traceback (most recent call last):"):
            self._traceback = "in"
            return True
        if self._traceback == "in":
            if stripped and not plain[:1].isspace() and not stripped.startswith(TRACEBACK_JOINS):
                self._traceback = "after"  # the exception's own line: the run's error line said it already
                if not self._pointed:
                    (self.out or sys.stdout).write(
                        "(the traceback is in the run's flwr.log; --verbose shows it here)\n"
                    )
                    self._pointed = True
            return True
        return any(quiet in plain for quiet in QUIET_LINES)

    def flush(self) -> None:
        (self.out or sys.stdout).flush()


# lines of a chained traceback that join two of its parts (the traceback goes on after them)
TRACEBACK_JOINS = ("The above exception was the direct cause", "During handling of the above exception", "Traceback")


CONSOLE = ConsoleEcho()  # the default echo of a launch: this process's stdout, Flower's known noise left off


class LineSink(Protocol):
    """Where the streamed log goes: a text file, the console, or a filter in front of it."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def pump_lines(stream, sinks: list[LineSink]) -> None:
    """Copy ``stream`` line by line to every sink until it ends (a sink that fails misses the line), then close it."""
    for line in iter(stream.readline, ""):
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except (ValueError, OSError):
                pass
    stream.close()
