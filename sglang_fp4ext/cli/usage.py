"""What a user may type: the model presets every command shares, and the error for a mistake.

A :class:`UsageError` is a user's mistake, not a bug: ``fp4ext`` prints its message as one line
and exits 2 (``--debug`` shows the stack, with the error that caused it)."""

from __future__ import annotations

from sglang_fp4ext.model_shapes import PRESETS

__all__ = ["UsageError", "PRESET_HELP", "DEFAULT_PRESET"]

DEFAULT_PRESET = "glm5-tp8"

#: The presets, for every command's ``--help``.
PRESET_HELP = "model presets: " + ", ".join(PRESETS)


class UsageError(Exception):
    """A user mistake: one line on stderr, exit status 2."""
