"""The SGLang side of fp4ext: the runner core and the hooks on SGLang's NVFP4 MoE method.

With ``plugin.py``, ``compat.py`` and ``sglang_weights.py`` (the weight processing and quant info
the hooks and the runner core call) this is the only module that imports SGLang at import time
(``capture_hooks.py``, the capture policy's hooks, imports it inside its functions). Everything it
installs acts only when ``--moe-runner-backend fp4ext`` is selected; with any other backend every
hooked method calls SGLang's original with the same arguments and returns its result unchanged.

Hooks (all AROUND, on ``ModelOptNvFp4FusedMoEMethod``; manifest in ``patches/README.md``):

* ``__init__`` - SGLang refuses NVFP4 MoE off Blackwell unless the backend is marlin; fp4ext runs
  on SM80+ (and on the CPU through the torch reference), so the original constructor runs under
  ``override_platform(is_blackwell=True)``.
* ``process_weights_after_loading`` - fp4ext builds its own kernel layout instead of SGLang's
  CUTLASS swizzle (which would overwrite the row-major block scales in place). W4A16: the static
  input scales are not used, so nothing of SGLang's alpha/input-scale math runs either.
* ``apply`` - runs the fp4ext runner core instead of raising "Unsupported moe_runner_backend".

Where SGLang has the extension points of ``patches/`` (detected by capability, see
``sglang_fp4ext.patches``), no hook is installed: the runner core is registered with
``supports_platform`` and, being a ``WeightOwningRunnerCore``, gets SGLang's delegated
``process_weights_after_loading`` / ``build_quant_info`` calls, which run the same functions as
the hooks.

Expert paths (chosen per layer from its device, announced once per process in the log):
``triton`` on a CUDA GPU of SM80 or newer (``moe.decode.fused_moe_nvfp4`` on the kernel layout),
``reference`` elsewhere (CPU, older GPUs: ``moe.reference.fused_moe_nvfp4_torch`` in fp32 on
the checkpoint layout; correct and slow, meant for tests and bring-up). Each layer's runner core
logs one INFO line the first time it runs (``fp4ext served MoE layer <id>: <path> path, <n> local
experts``), so a server log shows which MoE layers fp4ext served.

SGLang only logs exceptions raised by plugins and by ``HookRegistry.apply_hooks``; so the runner
factory, called while SGLang builds each MoE layer, checks that every hook is in place and raises
a clear error otherwise, instead of letting the layer fail later or run the wrong code.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.srt.layers.moe.moe_runner.base import DispatchMoeRunnerCore, MoeRunnerConfig
from sglang.srt.layers.moe.utils import get_moe_runner_backend, resolve_moe_runner_backend

from sglang_fp4ext import patches
from sglang_fp4ext.moe.experts import run_experts
from sglang_fp4ext.sglang_hooks import BACKEND_NAME, chain_has_hook, is_fp4ext
from sglang_fp4ext.sglang_weights import Fp4ExtQuantInfo, process_weights, quant_info_of

logger = logging.getLogger("sglang_fp4ext")

METHOD_CLASS = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"


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
    layer = kwargs["layer"] if "layer" in kwargs else args[0]
    process_weights(self, layer)


def supports_platform() -> bool:
    """fp4ext runs NVFP4 MoE everywhere SGLang runs: Triton on SM80+ CUDA GPUs, the torch
    reference elsewhere (what ``hook_init`` admits). Registered where SGLang asks (patches/0001)."""
    return True


def hook_apply(original: Callable, self, *args, **kwargs):
    """AROUND ``apply`` (called with keywords ``layer=``, ``dispatch_output=``)."""
    if not is_fp4ext(_backend_of(self)):
        return original(self, *args, **kwargs)
    names = ("layer", "dispatch_output")
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    layer, dispatch_output = bound["layer"], bound["dispatch_output"]
    return self.runner.run(dispatch_output, quant_info_of(layer))


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


def _upstream_in_effect(target: str) -> bool:
    """Is fp4ext wired to SGLang's own extension point that replaces ``target``'s hook?"""
    from sglang.srt.layers.moe.moe_runner.runner import _CUSTOM_RUNNER_CORE_FACTORIES

    if _CUSTOM_RUNNER_CORE_FACTORIES.get(BACKEND_NAME) is not make_runner_core:
        return False
    point = patches.upstream_object(target)
    if target.endswith(".__init__"):
        return point(resolve_moe_runner_backend(BACKEND_NAME))
    return isinstance(point, type) and issubclass(Fp4ExtRunnerCore, point)


def hook_modes() -> dict[str, str]:
    """For each hook target: ``hook`` (our hook is in the live attribute), ``upstream`` (SGLang
    has the extension point and fp4ext is registered with it; no hook needed) or ``missing``."""
    modes = {}
    for spec in HOOKS:
        if patches.upstream_has(spec.target):
            modes[spec.target] = "upstream" if _upstream_in_effect(spec.target) else "missing"
            continue
        try:
            live = pkgutil.resolve_name(spec.target)
        except Exception:  # target moved: reported as not installed
            modes[spec.target] = "missing"
            continue
        modes[spec.target] = "hook" if chain_has_hook(live, spec.hook) else "missing"
    return modes


def hook_status() -> dict[str, bool]:
    """For each hook target: is it in effect (our hook live, or SGLang's extension point used)?"""
    return {t: mode != "missing" for t, mode in hook_modes().items()}


def verify_hooks() -> None:
    """Raise a clear error when any fp4ext hook is not in effect (in this, a model process)."""
    from sglang_fp4ext import capture_hooks

    status = hook_status()
    # The capture policy's resolution hook acts in the launcher process only; its masking hook
    # must be live where the model runs.
    status[capture_hooks.MASK_TARGET] = capture_hooks.hook_status()[capture_hooks.MASK_TARGET]
    missing = [t for t, ok in status.items() if not ok]
    if missing:
        raise RuntimeError(
            "--moe-runner-backend fp4ext is selected but these sglang_fp4ext hooks are not in "
            f"effect: {', '.join(missing)}. SGLang logs (and swallows) plugin errors: look for "
            "'Failed to apply hooks' or 'Failed to execute general plugin: fp4ext' above, run "
            "`fp4ext info` and `fp4ext patches check`, and check that SGLANG_PLUGINS (if set) "
            "includes 'fp4ext'."
        )


# ---- runner core -------------------------------------------------------------------------------


# SGLang with patches/0002 (or its upstream form) delegates weight processing and apply to a
# WeightOwningRunnerCore; without it the hooks call the same functions.
_CoreBase = patches.upstream_object(f"{METHOD_CLASS}.apply") or DispatchMoeRunnerCore


class Fp4ExtRunnerCore(_CoreBase):
    """SGLang's ``DispatchMoeRunnerCore`` for fp4ext (standard dispatch, a2a ``none``)."""

    @property
    def runner_backend(self):
        return resolve_moe_runner_backend(BACKEND_NAME)

    def process_weights_after_loading(self, quant_method, layer) -> None:
        """SGLang's delegation point (patches/0002): fp4ext's layout for ``layer``."""
        process_weights(quant_method, layer)

    def build_quant_info(self, layer) -> Fp4ExtQuantInfo:
        """SGLang's delegation point (patches/0002): what ``run_from_dispatch`` gets."""
        return quant_info_of(layer)

    def run_from_dispatch(self, dispatch_output, quant_info, runner_config, hooks=None):
        from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        if hooks is not None:
            raise NotImplementedError("fp4ext does not run MoE LoRA adapters")
        if not dispatch_output.format.is_standard():
            raise NotImplementedError(
                f"fp4ext consumes the standard dispatch output, got {dispatch_output.format!r}"
            )
        topk = dispatch_output.topk_output
        if TopKOutputChecker.format_is_bypassed(topk):
            topk = topk.to_standard(layer_id=runner_config.layer_id)
        elif not TopKOutputChecker.format_is_standard(topk):
            raise NotImplementedError(f"fp4ext needs standard top-k output, got {type(topk)}")
        # The routed scaling factor is already folded into topk_weights for NVFP4 (SGLang's
        # _fuses_routed_scaling_factor_in_topk): never apply runner_config.routed_scaling_factor.
        # (The torch-native top-k fallback gives int64 ids; run_experts converts.)
        out = run_experts(
            quant_info.path,
            quant_info.weights,
            dispatch_output.hidden_states,
            topk.topk_ids,
            topk.topk_weights,
        )
        if not getattr(self, "_served", False):
            # One line per MoE layer (one core per layer), the first time it runs: the end-to-end
            # check (testing/e2e.py served_moe_layers) reads these to prove fp4ext served every
            # MoE layer of the model.
            self._served = True
            logger.info(
                "fp4ext served MoE layer %s: %s path, %d local experts",
                runner_config.layer_id,
                quant_info.path,
                quant_info.weights.num_experts,
            )
        return StandardCombineInput(hidden_states=out)


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
        if patches.upstream_has(f"{METHOD_CLASS}.__init__"):  # SGLang asks cores (patches/0001)
            register_moe_runner_core(
                BACKEND_NAME, make_runner_core, supports_platform=supports_platform
            )
            done.append(f"runner core {BACKEND_NAME!r} (supports_platform)")
        else:
            register_moe_runner_core(BACKEND_NAME, make_runner_core)
            done.append(f"runner core {BACKEND_NAME!r}")
    elif factory is not make_runner_core:
        raise RuntimeError(
            f"another package already registered an MoE runner core named {BACKEND_NAME!r} "
            f"({factory!r}); sglang_fp4ext cannot share the name"
        )

    for spec in HOOKS:
        if patches.upstream_has(spec.target):  # SGLang's own extension point replaces the hook
            continue
        registered = HookRegistry._hooks.get(spec.target, ())
        if not any(hook is spec.hook for _, hook, _ in registered):
            HookRegistry.register(spec.target, spec.hook, HookType.AROUND)
            done.append(f"hook {spec.target.rsplit('.', 2)[-2]}.{spec.target.rsplit('.', 1)[-1]}")

    from sglang_fp4ext import capture_hooks

    done += capture_hooks.install()
    return done
