"""SGLang plugin entry point: ``sglang.srt.plugins: fp4ext = sglang_fp4ext.plugin:register``.

SGLang calls ``register()`` in every process it starts (server main, scheduler/TP workers, DP
controller, detokenizer) through ``sglang.srt.plugins.load_plugins()``, then applies all hooks.
``register()`` is cheap and idempotent, imports SGLang only after the version check, and does
nothing (with one warning) when the installed SGLang is outside the verified range.

Its cost is SGLang's, paid once per process either way: in ``python -m sglang.launch_server``
it takes ~9 s of CPU, nearly all importing SGLang's MoE and quantization modules, sgl_kernel
and flashinfer, which the launcher's next step (``http_server``) imports anyway (launcher total
24-26 s of CPU with or without fp4ext); the scheduler and detokenizer import them before
loading plugins, and there it takes ~0.2 s. Deferring the imports would not shorten a start.

It first checks every ``SGLANG_FP4EXT_*`` setting (``envs.py``). A bad one stops the process
with one line naming the variable, its value and the allowed values, raised as ``SystemExit``:
SGLang's loader catches ``Exception`` from plugins and carries on without them, so an ordinary
error would only surface at the first MoE call, after the weights have loaded. The server's
main process loads plugins before it parses its arguments, so nothing has loaded yet.
"""

from __future__ import annotations

import logging

from sglang_fp4ext import __version__, compat, envs

__all__ = ["register"]

logger = logging.getLogger("sglang_fp4ext")


def register() -> None:
    """Make ``--moe-runner-backend fp4ext`` available in this process."""
    bad = envs.problems()
    if bad:
        raise SystemExit("sglang_fp4ext: bad setting: " + "; ".join(bad))
    if envs.LOG_LEVEL.value():
        logger.setLevel(envs.LOG_LEVEL.value())
    status = compat.check_sglang()
    if not status.ok:
        logger.warning(
            "sglang_fp4ext %s is inactive: %s. --moe-runner-backend fp4ext is not registered.",
            __version__,
            status.reason,
        )
        return

    from sglang.srt.plugins.hook_registry import HookRegistry, _current_plugin_source

    from sglang_fp4ext import sglang_backend

    applied = sglang_backend.install()
    if _current_plugin_source.get() is None:
        # Called directly (a script, not SGLang's loader): nobody applies the hooks for us.
        HookRegistry.apply_hooks()
    if applied:
        logger.info(
            "sglang_fp4ext %s registered with SGLang %s: %s",
            __version__,
            status.version,
            ", ".join(applied),
        )
