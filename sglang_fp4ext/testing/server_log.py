"""Reading an SGLang server's log during start-up: which lines are fatal, how far it got.

``classify_log_line`` says whether one line means the server will not come up (``FatalLine``:
a port clash, worth a retry on fresh ports, or another fatal error); ``LogWatch`` reads a
growing log line by line and keeps those lines and the start-up stage (``_STAGES``). Used by
``server.SGLangServer``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["classify_log_line"]


#: A port clash: uvicorn's "[Errno 98] error while attempting to bind on address (...)", zmq's
#: "Address already in use", the TCPStore's "EADDRINUSE", SGLang's own port checks
#: (``PortArgs.init_new``: "Port is already in use.", ``wait_port_available``: "... is not
#: available in 30 seconds").
_BIND_RE = re.compile(
    r"\[Errno 98\]|address already in use|\bEADDRINUSE\b|Port is already in use"
    r"|\bis not available in \d+ seconds",
    re.IGNORECASE,
)
#: Warnings never stop a start: c10d/glog lines ("[W1201 12:00:00 ...", "W1201 ..."), Python
#: warnings ("...: UserWarning: ..."), WARNING-level lines. E.g. torch logs
#: "[W... socket.cpp] The server socket has failed to bind to [::]:29500 (errno: 98 - Address
#: already in use)." when the IPv6 side is taken and then serves on IPv4.
_WARNING_RE = re.compile(
    r"^\s*(?:\[\d{4}-\d\d-\d\d [^\]]*\]\s*)?(?:\[?W\d{4} |\[W |WARNING\b)|\w*Warning: "
)
#: SGLang's own death notices: a subprocess's top-level handler ("Scheduler hit an exception:
#: ...", which then SIGQUITs the launcher) and the launcher's SIGQUIT handler.
_FATAL_RE = re.compile(
    r"\b(?:Scheduler|DetokenizerManager|TokenizerManager|DataParallelController"
    r"|MultiTokenizerRouter|MultiDetokenizerRouter) hit an exception"
    r"|Received sigquit from a child process"
)
_TRACEBACK = "Traceback (most recent call last):"
#: The first frame of an exception escaping the launcher's main module (``python -m
#: sglang.launch_server``): the launcher's main thread is dying. Tracebacks SGLang logs from
#: inside its code (``logger.exception``) start in the catching function, not here.
_LAUNCHER_FRAME_RE = re.compile(r'^\s*File ".*[/\\]sglang[/\\]launch_server\.py", line \d+')
_PORT_IN_LINE_RES = (
    re.compile(r"\('[^']*', (\d+)\)"),  # uvicorn: ('127.0.0.1', 41179)
    re.compile(r"\bport:? (\d+)", re.IGNORECASE),  # TCPStore: "port: 28111"
    re.compile(r"\bat (\d+) is not available"),  # SGLang wait_port_available
    re.compile(r"tcp://[^\s:']+:(\d+)"),  # zmq addr='tcp://127.0.0.1:5555'
)
#: Start-up milestones in SGLang 0.5.23's log (the last one seen names the stage in "waiting
#: for ..." lines; before the first: importing SGLang, ~17 s of a ~45 s CPU start); FRONT_END
#: is when LISTEN_TIMEOUT starts.
_FRONT_END = "Application startup complete."
_STAGES = (
    ("server_args=", "starting the scheduler"),
    ("Init parallel begin", "initialising the model runner"),
    ("Load weight begin", "loading weights"),
    ("Load weight end", "allocating KV cache"),
    ("Started server process", "HTTP front end starting"),
    (_FRONT_END, "HTTP front end binding"),
)


@dataclass(frozen=True)
class FatalLine:
    """A log line that means the server will not come up.

    ``kind``: ``"bind"`` (a port clash: worth a retry on fresh ports) or ``"fatal"``;
    ``port``: the port the line names, if any.
    """

    kind: str
    line: str
    port: int | None = None


def classify_log_line(line: str, previous: str = "") -> FatalLine | None:
    """Whether one server log line (``previous``: the line before it) is fatal at start-up."""
    text = line.strip()
    if not text or _WARNING_RE.search(line):
        return None
    if _BIND_RE.search(line):
        port = next((int(m.group(1)) for r in _PORT_IN_LINE_RES if (m := r.search(line))), None)
        return FatalLine("bind", text, port)
    if _FATAL_RE.search(line):
        return FatalLine("fatal", text)
    if previous.strip().endswith(_TRACEBACK) and _LAUNCHER_FRAME_RE.search(line):
        return FatalLine("fatal", f"{_TRACEBACK} {text} (the launcher's main thread)")
    return None


class LogWatch:
    """Reads a growing log file line by line; keeps fatal lines and the start-up stage."""

    def __init__(self, path: Path):
        self.path, self._pos, self._rest, self._prev = path, 0, "", ""
        self.fatal: list[FatalLine] = []
        self.stage = "importing SGLang"
        self.front_end_at: float | None = None

    def scan(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return
        self._pos += len(data)
        *lines, self._rest = (self._rest + data.decode(errors="replace")).split("\n")
        for line in lines:
            hit = classify_log_line(line, self._prev)
            if hit is not None:
                self.fatal.append(hit)
            for marker, stage in _STAGES:
                if marker in line:
                    self.stage = stage
                    if marker == _FRONT_END and self.front_end_at is None:
                        self.front_end_at = time.monotonic()
            self._prev = line

    def verdict(self) -> FatalLine | None:
        """The fatal line to report: a port clash first (it is the cause a retry can fix)."""
        return next((f for f in self.fatal if f.kind == "bind"), None) or next(
            iter(self.fatal), None
        )
