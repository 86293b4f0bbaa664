"""Progress bars of the long commands (``fp4ext tune``, ``fp4ext bench``).

A :class:`Progress` is a tqdm bar on stderr whose postfix names the step just done and the best
time so far (:func:`best_postfix`). tqdm comes with SGLang, so it is there wherever fp4ext runs;
it is imported when a bar is made, and without it the bar is silent. The bar is off when its
stream is not a terminal (CI logs, pytest's capture), so what the commands print to stdout, and
logs of redirected runs, stay exactly as they were.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["Progress", "best_postfix"]


def best_postfix(best: Mapping[str, float | None], unit: str = "us") -> str:
    """``"best decode 12.3 us, prefill 45.6 us"`` from ``{path: time or None}``; ``""`` when
    nothing was measured yet (a ``None`` path is left out)."""
    parts = [f"{name} {v:.1f} {unit}" for name, v in best.items() if v is not None]
    return "best " + ", ".join(parts) if parts else ""


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no file descriptor, or not a terminal
        return 0


class Progress:
    """``total`` steps labelled ``label`` on ``stream`` (default stderr): :meth:`step` after each
    one, :meth:`postfix` to show what runs now. ``enabled=None``: on iff ``stream`` is a TTY."""

    def __init__(self, total: int, label: str, stream=None, *, unit: str = "step", enabled=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.total, self.n = max(total, 1), 0
        self._bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # not in this environment: no bar, nothing else changes
                self.enabled = False
            else:
                # A terminal that reports a 0 x 0 size (``script``, some CI ptys) gets no bar at
                # all from tqdm (it hides bars below the last row): give it 100 x 24.
                width = _width(self.stream)
                self._bar = tqdm(
                    total=self.total, desc=label, unit=unit, file=self.stream, leave=True,
                    dynamic_ncols=width > 0, ncols=None if width > 0 else 100,
                    nrows=None if width > 0 else 24,
                )  # fmt: skip

    def postfix(self, text: str) -> None:
        """Show ``text`` after the bar (the current step, the best so far)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def step(self, what: str = "") -> None:
        """One step done; ``what`` becomes the postfix. Closes the bar after the last step."""
        self.n += 1
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)
            if self.n >= self.total:
                self.close()

    def write(self, text: str, stream) -> None:
        """``text`` and a newline on ``stream`` without tearing the bar (same bytes when off)."""
        if self._bar is not None:
            self._bar.write(text, file=stream)
        else:
            stream.write(text + "\n")
        stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
