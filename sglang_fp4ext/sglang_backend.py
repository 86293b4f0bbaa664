"""The SGLang side of fp4ext: the runner core and the hooks on SGLang's NVFP4 MoE method.

With ``plugin.py`` and ``compat.py`` this is the only module that imports SGLang. Everything it
installs acts only when ``--moe-runner-backend fp4ext`` is selected; with any other backend every
hooked method calls SGLang's original with the same arguments and returns its result unchanged.

Hooks (all AROUND, on ``ModelOptNvFp4FusedMoEMethod``; manifest in ``patches/README.md``):

* ``__init__`` - SGLang refuses NVFP4 MoE off Blackwell unless the backend is marlin; fp4ext runs
  on SM80+ (and on the CPU through the torch reference), so the original constructor runs under
  ``override_platform(is_blackwell=True)``.
* ``process_weights_after_loading`` - fp4ext builds its own kernel layout instead of SGLang's
  CUTLASS swizzle (which would overwrite the row-major block scales in place).
* ``apply`` - runs the fp4ext runner core instead of raising "Unsupported moe_runner_backend".

SGLang only logs exceptions raised by plugins and by ``HookRegistry.apply_hooks``; so the runner
factory, called while SGLang builds each MoE layer, checks that every hook is in place and raises
a clear error otherwise, instead of letting the layer fail later or run the wrong code.
"""

from __future__ import annotations

import logging
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from sglang.srt.layers.moe.moe_runner.base import DispatchMoeRunnerCore, MoeRunnerConfig
from sglang.srt.layers.moe.utils import get_moe_runner_backend, resolve_moe_runner_backend

logger = logging.getLogger("sglang_fp4ext")

BACKEND_NAME = "fp4ext"
METHOD_CLASS = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"

_PENDING = (
    "fp4ext: {what} for SGLang's NVFP4 MoE layers lands with issue 9 (SGLang wiring); the "
    "Triton kernels land with issue 4. Until then use another --moe-runner-backend."
)


def is_fp4ext(backend: Any) -> bool:
    """True for the fp4ext backend, given an enum member, a registered backend or a string."""
    return getattr(backend, "value", backend) == BACKEND_NAME


def _backend_of(method: Any) -> Any:
    # The method caches its backend in create_moe_runner; the global differs under speculative
    # decoding (the draft model may use another runner), so prefer the cached one.
    cached = getattr(method, "_moe_runner_backend", None)
    return cached if cached is not None else get_moe_runner_backend()


# ---- hooks -------------------------------------------------------------------------------------


def hook_init(original: Callable, self, *args, **kwargs):
    """AROUND ``__init__``: admit fp4ext on non-Blackwell platforms (SM80+, CPU)."""
    if not is_fp4ext(get_moe_runner_backend()):
        return original(self, *args, **kwargs)
    from sglang.srt.runtime_context import get_platform, override_platform

    if get_platform().is_blackwell:
        return original(self, *args, **kwargs)
    with override_platform(is_blackwell=True):
        return original(self, *args, **kwargs)


def hook_process_weights_after_loading(original: Callable, self, *args, **kwargs):
    """AROUND ``process_weights_after_loading``: fp4ext prepares its own layout."""
    if not is_fp4ext(_backend_of(self)):
        return original(self, *args, **kwargs)
    raise NotImplementedError(_PENDING.format(what="weight processing"))


def hook_apply(original: Callable, self, *args, **kwargs):
    """AROUND ``apply`` (called with keywords ``layer=``, ``dispatch_output=``)."""
    if not is_fp4ext(_backend_of(self)):
        return original(self, *args, **kwargs)
    raise NotImplementedError(_PENDING.format(what="the MoE forward"))


@dataclass(frozen=True)
class HookSpec:
    target: str
    hook: Callable
    why: str


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(f"{METHOD_CLASS}.__init__", hook_init, "admit NVFP4 MoE off Blackwell for fp4ext"),
    HookSpec(
        f"{METHOD_CLASS}.process_weights_after_loading",
        hook_process_weights_after_loading,
        "build the fp4ext kernel layout instead of the CUTLASS swizzle",
    ),
    HookSpec(f"{METHOD_CLASS}.apply", hook_apply, "run the fp4ext runner core"),
)


def _chain_has_hook(fn: Any, hook: Callable) -> bool:
    """Walk HookRegistry's wrapper chain (``__wrapped__``) looking for ``hook`` in a closure."""
    seen = 0
    while fn is not None and seen < 64:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def hook_status() -> dict[str, bool]:
    """For each hook target: is our hook in the live (patched) attribute?"""
    status = {}
    for spec in HOOKS:
        try:
            live = pkgutil.resolve_name(spec.target)
        except Exception:  # target moved: reported as not installed
            status[spec.target] = False
            continue
        status[spec.target] = _chain_has_hook(live, spec.hook)
    return status


def verify_hooks() -> None:
    """Raise a clear error when any fp4ext hook is not in effect."""
    missing = [t for t, ok in hook_status().items() if not ok]
    if missing:
        raise RuntimeError(
            "--moe-runner-backend fp4ext is selected but these sglang_fp4ext hooks are not in "
            f"effect: {', '.join(missing)}. SGLang logs (and swallows) plugin errors: look for "
            "'Failed to apply hooks' or 'Failed to execute general plugin: fp4ext' above, run "
            "`fp4ext info`, and check that SGLANG_PLUGINS (if set) includes 'fp4ext'."
        )


# ---- runner core -------------------------------------------------------------------------------


class Fp4ExtRunnerCore(DispatchMoeRunnerCore):
    """SGLang's ``DispatchMoeRunnerCore`` for fp4ext (standard dispatch, a2a ``none``)."""

    @property
    def runner_backend(self):
        return resolve_moe_runner_backend(BACKEND_NAME)

    def run_from_dispatch(self, dispatch_output, quant_info, runner_config, hooks=None):
        raise NotImplementedError(_PENDING.format(what="the runner core"))


def make_runner_core(config: MoeRunnerConfig) -> Fp4ExtRunnerCore:
    """The factory SGLang calls for every MoE layer built with ``--moe-runner-backend fp4ext``."""
    verify_hooks()
    return Fp4ExtRunnerCore(config)


# ---- installation ------------------------------------------------------------------------------


def install() -> list[str]:
    """Register the backend name, the runner core and the hooks; idempotent. Returns what it did.

    Safe to call many times in one process: each step checks whether it was already done
    (``register_moe_runner_core`` raises on a second registration, and ``HookRegistry.register``
    would stack duplicate AROUND hooks).
    """
    from sglang.srt.arg_groups.choices import (
        MOE_RUNNER_BACKEND_CHOICES,
        add_moe_runner_backend_choices,
    )
    from sglang.srt.layers.moe.moe_runner.runner import (
        _CUSTOM_RUNNER_CORE_FACTORIES,
        register_moe_runner_core,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    done = []
    if BACKEND_NAME not in MOE_RUNNER_BACKEND_CHOICES:
        add_moe_runner_backend_choices([BACKEND_NAME])
        done.append(f"--moe-runner-backend choice {BACKEND_NAME!r}")

    factory = _CUSTOM_RUNNER_CORE_FACTORIES.get(BACKEND_NAME)
    if factory is None:
        register_moe_runner_core(BACKEND_NAME, make_runner_core)
        done.append(f"runner core {BACKEND_NAME!r}")
    elif factory is not make_runner_core:
        raise RuntimeError(
            f"another package already registered an MoE runner core named {BACKEND_NAME!r} "
            f"({factory!r}); sglang_fp4ext cannot share the name"
        )

    for spec in HOOKS:
        registered = HookRegistry._hooks.get(spec.target, ())
        if not any(hook is spec.hook for _, hook, _ in registered):
            HookRegistry.register(spec.target, spec.hook, HookType.AROUND)
            done.append(f"hook {spec.target.rsplit('.', 2)[-2]}.{spec.target.rsplit('.', 1)[-1]}")
    return done
