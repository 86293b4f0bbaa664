"""Whether SGLang 0.5.23 fuses a checkpoint's shared expert into the routed MoE.

SGLang decides once per model, before any layer is built: ``resolve_shared_experts_config``
(``layers/moe/utils.py``) asks the model class's ``shared_experts_fusion_disable_reason``. That
call needs SGLang's published runtime context and its model code (tens of seconds of imports),
so ``fp4ext info`` cannot make it. :func:`fusion_disable_reason` mirrors the part of the rule a
checkpoint and a layout decide, for a server fp4ext runs: ``--moe-runner-backend fp4ext`` on a
CUDA GPU of sm_80 or newer, ``--moe-a2a-backend none``, no TBO/SBO and no
``--disable-shared-experts-fusion`` (which always turns fusion off). ``tests/test_shared_fusion.py``
runs SGLang's own function on the same checkpoints, so the mirror cannot drift silently.

:func:`checkpoint_quant` reads the quantization the way SGLang does (``ModelConfig.
_parse_quant_hf_config``): ``config.json``'s ``quantization_config`` first, else
``hf_quant_config.json``. Imports nothing outside the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "DEEPSEEK_RULE",
    "GLM45_RULE",
    "checkpoint_quant",
    "fusion_disable_reason",
    "shared_expert_excluded",
]

#: Architectures whose SGLang class takes ``DeepseekV2ForCausalLM``'s rule, each its own
#: ``fused_shared_experts_architecture`` (``deepseek_v2.py``; GLM-5's ``glm4_moe.py``).
DEEPSEEK_RULE = ("DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")
#: ``Glm4MoeForCausalLM``'s own rule: no quantization or expert-count check.
GLM45_RULE = ("Glm4MoeForCausalLM",)
#: Routed-expert counts ``DeepseekV2ForCausalLM`` has validated fusion for (384: Quark only).
_FUSED_ROUTED = (256, 384)


class _Model(Protocol):  # model_shapes.MoEModel; not imported, it imports this module
    architecture: str
    quantization: str | None
    shared_expert_excluded: bool
    n_routed_experts: int
    n_shared_experts: int


def checkpoint_quant(
    cfg: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None = None
) -> tuple[str | None, tuple[str, ...]]:
    """``(SGLang's quantization name, modules left unquantized)`` of a checkpoint, from its
    ``config.json`` dict and its ``hf_quant_config.json`` dict (None: no such file).

    The name is ModelOpt's as SGLang derives it (``modelopt_fp4`` for an FP4 ``quant_algo``,
    ``modelopt_fp8`` for FP8) or the config's own ``quant_method``; None: not quantized. The list
    is what ``ModelOptFp4Config.from_config`` reads: ``ignore`` / ``modules_to_not_convert`` /
    ``exclude_modules`` of the flat form, ``quantization.exclude_modules`` of the nested one."""
    flat = cfg.get("quantization_config")
    if isinstance(flat, Mapping):
        method = str(flat.get("quant_method", "modelopt")).lower()
        if method == "modelopt":
            method = _modelopt_name(flat.get("quant_algo"))
        for key in ("ignore", "modules_to_not_convert", "exclude_modules"):
            if key in flat:
                return method, tuple(flat[key] or ())
        return method, ()
    if isinstance(hf_quant_config, Mapping):
        nested = hf_quant_config.get("quantization")
        if isinstance(nested, Mapping):
            method = _modelopt_name(nested.get("quant_algo"))
            return method, tuple(nested.get("exclude_modules") or ())
    return None, ()


def _modelopt_name(algo: Any) -> str | None:
    """SGLang's name for a ModelOpt ``quant_algo`` (``_parse_modelopt_quant_config``)."""
    algo = str(algo or "").upper()
    if "FP4" in algo:
        return "modelopt_fp4"
    return "modelopt_fp8" if algo == "FP8" else None


def shared_expert_excluded(quantization: str | None, exclude: Sequence[str]) -> bool:
    """Whether the quantization keeps the shared expert out of the routed experts' format:
    SGLang's ``quant_blocks_shared_experts_fusion``, which for ModelOpt FP4 is
    ``not ModelOptFp4Config.can_fuse_shared_expert()`` (an excluded module naming
    ``shared_expert``, its separate ``shared_expert_gate`` aside). No other quantization fp4ext
    serves defines ``can_fuse_shared_expert``."""
    if quantization != "modelopt_fp4":
        return False
    return any("shared_expert" in m and "shared_expert_gate" not in m for m in exclude)


def fusion_disable_reason(model: _Model, ep: int) -> str | None:
    """Why SGLang 0.5.23 will not fuse ``model``'s shared expert at expert-parallel size ``ep``
    on an fp4ext server, or None when it fuses it (as local expert ``E``, one more id a token).
    A mismatch with SGLang's own function fails ``tests/test_shared_fusion.py``.

    Mirrors ``DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason`` (``DEEPSEEK_RULE``)
    and ``Glm4MoeForCausalLM.shared_experts_fusion_disable_reason`` (``GLM45_RULE``), their
    checks in their order, for the server described in the module docstring."""
    arch = model.architecture
    if not model.n_shared_experts:
        return "no shared expert"
    if arch in DEEPSEEK_RULE:
        if model.shared_expert_excluded:
            return "shared experts excluded from quantization (BF16)"
        if (
            model.n_routed_experts not in _FUSED_ROUTED
            or model.n_shared_experts != 1
            or (model.n_routed_experts == 384 and model.quantization != "quark")
        ):
            return (
                f"{arch}: SGLang fuses only 1 shared expert beside 256 routed ones (384 with Quark)"
            )
    elif arch not in GLM45_RULE:
        return f"fp4ext does not mirror SGLang's fusion rule for {arch or 'this architecture'}"
    if ep > 1:
        return "under EP, SGLang fuses only on AMD MI300 and newer"
    return None
