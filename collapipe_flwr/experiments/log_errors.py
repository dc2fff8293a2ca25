"""The one line that says why a run failed, read from its log (``flwr.log``, ``superlink.log``)."""

from __future__ import annotations

import re

_ERROR_LINE = re.compile(r"\berror: (.+)$")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # a terminal colour or cursor code, as rich writes them


def error_line(log_text: str) -> str:
    """The most telling one-line error of a failed run's log ("" when none is found).

    Prefers the last ``error: <message>`` line (the project's one-line user errors), then the flwr
    CLI's last error panel, then the last traceback's final line (``SomeError: ...``), then the last
    line mentioning ERROR.
    """
    lines = [ANSI.sub("", line).strip() for line in log_text.splitlines()]
    lines = [line for line in lines if line]
    for line in reversed(lines):
        match = _ERROR_LINE.search(line)
        if match:
            return match.group(1).strip()
    box = _last_error_box(lines)
    if box:
        return box
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback"):
            tail = [line for line in lines[i + 1 :] if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line)]
            if tail:
                return tail[-1]
    for line in reversed(lines):
        if "ERROR" in line:
            return line
    return ""


def _last_error_box(lines: list[str]) -> str:
    """The text of the last rich ``╭─ Error ─╮ ... ╰─╯`` panel the flwr CLI prints, as one line."""
    starts = [i for i, line in enumerate(lines) if line.startswith("╭") and "Error" in line]
    if not starts:
        return ""
    body = []
    for line in lines[starts[-1] + 1 :]:
        if line.startswith("╰"):
            break
        body.append(line.strip("│").strip())
    return " ".join(part for part in body if part)
