"""The SGLang side of the capture policy: the resolution hook and the padded-row masking hook.

:func:`install` registers :func:`resolve_capture_policy` on SGLang's ``handle_gpu_memory_settings``
step (it applies ``capture_policy.compute_policy`` to the server being resolved) and the masking
hook on ``enable_num_token_non_padded`` (or, where SGLang has it, registers the masking condition
with ``register_num_token_non_padded_condition``); :func:`hook_status` says which are in effect.
SGLang is imported inside the functions; the pure policy (``capture_policy``) never imports this.

**Masking padded rows in TP mode.** SGLang masks rows ``>= num_token_non_padded`` to ``-1`` in
``TopK`` post-processing (``topk.py:_post_process_topk_ids`` / ``_mask_topk_ids_padded_region``)
whenever a forward batch carries that count. Whether it carries one is decided by a single
predicate, ``forward_batch_info.enable_num_token_non_padded()`` (True for ``moe_ep_size > 1``,
DP gather or a custom a2a): it sizes the graph runners' ``num_token_non_padded`` buffer, which
each replay fills with the real token count, and ``ForwardBatch.moe_num_token_non_padded()``
hands it to ``TopK`` through the forward context. The least invasive mechanism is therefore one
AROUND hook on that predicate that also answers True for fp4ext with ``moe_a2a_backend none`` and
no DP attention (plain TP): the TP layout then runs exactly the code SGLang runs for EP8 with
TP8 attention. On CUDA, when the router writes the fused shared-expert column (GLM-5 TP8),
SGLang masks the routed columns only; a padded row's shared slot stays (expert 256), which costs
no extra weight bytes because every real row reads the shared expert anyway.
``SGLANG_OPT_MASK_DP_PAD_MOE`` is not the mechanism: it only masks DP-attention pad rows after the
EP local-id mapping.

**User settings win.** The resolution hook (``handle_gpu_memory_settings``, after SGLang's step)
leaves every ``(phase, key)`` in ``server_args._cuda_graph_config_locked`` (set from
``--cuda-graph-config``, ``--cuda-graph-bs-*``, ``--cuda-graph-max-bs-*``, ...) as the user set it,
leaves a phase alone when its graphs are disabled or the device is not CUDA, and keeps SGLang's
exact-size decode list under ``--disable-cuda-graph-padding``. A locked ``max_bs`` is kept and the
policy's sizes stop there. One INFO line states the decisions.
"""

from __future__ import annotations

import logging

from sglang_fp4ext.capture_inputs import MoEModel, PolicyInputs
from sglang_fp4ext.capture_policy import CapturePolicy, compute_policy
from sglang_fp4ext.capture_sizes import (
    PREFILL_GRAPH_MB_PER_BUCKET,
    PREFILL_TILE_TOKENS,
    compact_sizes,
)
from sglang_fp4ext.sglang_hooks import chain_has_hook, is_fp4ext

__all__ = [
    "MASK_TARGET",
    "RESOLUTION_STEP",
    "hook_enable_num_token_non_padded",
    "hook_status",
    "install",
    "policy_from_server_args",
    "resolve_capture_policy",
]

logger = logging.getLogger("sglang_fp4ext")

RESOLUTION_STEP = "handle_gpu_memory_settings"
MASK_TARGET = "sglang.srt.model_executor.forward_batch_info.enable_num_token_non_padded"


def _model_from_server_args(server_args) -> MoEModel | None:
    from sglang.srt.arg_groups.overrides import model_config_of

    hf = model_config_of(server_args).hf_config
    cfg = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    try:
        return MoEModel.from_hf_config(cfg)
    except (ValueError, TypeError):
        return None


def policy_from_server_args(server_args) -> tuple[CapturePolicy | None, str]:
    """The policy for a server being resolved (after SGLang's memory step), or ``(None, why)``
    when it does not apply (another backend, no CUDA device, not an MoE model)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    if not is_fp4ext(cfg.moe_runner_backend):
        return None, "backend is not fp4ext"
    if cfg.device not in (None, "cuda"):
        return None, f"device {cfg.device!r} has no CUDA graphs"
    graphs = cfg.cuda_graph_config
    if graphs is None or graphs.decode.max_bs is None or graphs.prefill.max_bs is None:
        return None, "SGLang resolved no CUDA-graph maxima"
    model = _model_from_server_args(server_args)
    if model is None:
        return None, "not an MoE model"
    tokens_per_req = 1
    if cfg.speculative_algorithm is not None and cfg.speculative_num_draft_tokens:
        tokens_per_req = int(cfg.speculative_num_draft_tokens)
    # Budget: what SGLang's own prefill list for the same maximum costs (its step just generated
    # that list, unless the user gave one).
    default_prefill = graphs.prefill.bs or [graphs.prefill.max_bs]
    policy = compute_policy(
        PolicyInputs(
            model=model,
            tp=int(cfg.tp_size),
            ep=int(cfg.ep_size),
            decode_max_bs=int(graphs.decode.max_bs),
            prefill_max_tokens=int(graphs.prefill.max_bs),
            max_running_requests=cfg.max_running_requests,
            chunked_prefill_size=cfg.chunked_prefill_size,
            tokens_per_req=tokens_per_req,
            prefill_budget_mb=len(default_prefill) * PREFILL_GRAPH_MB_PER_BUCKET,
            # --dp-size N --enable-dp-attention resolves to attn_dp_size = N before this step.
            dp_attention=int(cfg.attn_dp_size or 1) > 1,
        )
    )
    return policy, ""


def resolve_capture_policy(server_args, previous) -> None:
    """Resolution hook on ``handle_gpu_memory_settings``: SGLang's step, then the policy."""
    previous(server_args)
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    policy, why = policy_from_server_args(server_args)
    if policy is None:
        logger.debug("fp4ext capture policy not applied: %s", why)
        return
    cfg = resolving_view(server_args)
    graphs = cfg.cuda_graph_config
    locked = set(getattr(server_args, "_cuda_graph_config_locked", ()) or ())
    kept, applied = [], []

    decode = None
    if graphs.decode.backend == Backend.DISABLED:
        kept.append("decode graphs disabled")
    elif (Phase.DECODE, "bs") in locked:
        kept.append("decode bs (user)")
    elif cfg.disable_cuda_graph_padding:
        kept.append("decode bs (--disable-cuda-graph-padding)")
    else:
        decode = list(policy.decode_bs)
        applied.append(f"decode bs {compact_sizes(decode)} ({len(decode)})")

    prefill = None
    if graphs.prefill.backend == Backend.DISABLED:
        kept.append("prefill graphs disabled")
    elif (Phase.PREFILL, "bs") in locked:
        kept.append("prefill bs (user)")
    else:
        prefill = list(policy.prefill_tokens)
        applied.append(
            f"prefill tokens {compact_sizes(prefill)} ({len(prefill)}, tile {PREFILL_TILE_TOKENS})"
        )

    new = graphs
    if decode is not None and decode != list(graphs.decode.bs or ()):
        new = with_phase(new, Phase.DECODE, bs=decode)
    if prefill is not None and prefill != list(graphs.prefill.bs or ()):
        new = with_phase(new, Phase.PREFILL, bs=prefill)
    if new is not graphs:
        declare_resolution(server_args, "sglang_fp4ext.capture_policy", cuda_graph_config=new)
    i = policy.inputs
    logger.info(
        "fp4ext capture policy (TP%d EP%d, %s): %s; MoE inside graph segments; %s%s%s",
        i.tp,
        i.ep,
        i.model.name,
        "; ".join(applied) if applied else "no sizes changed",
        policy.masking_text(),
        "; kept: " + ", ".join(kept) if kept else "",
        "; " + "; ".join(policy.notes) if policy.notes else "",
    )


def _fp4ext_tp_mode() -> bool:
    """fp4ext selected (published config), a2a none, no DP attention: plain TP MoE."""
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend
    from sglang.srt.runtime_context import get_exec, get_parallel

    try:
        # The published flag, not get_moe_runner_backend(): speculative decoding swaps that global
        # while the draft runs, and the buffers must not flip between target and draft.
        backend = get_exec().moe.moe_runner_backend
    except ValueError:  # nothing published yet (tests, early startup)
        return False
    if not is_fp4ext(backend):
        return False
    return get_parallel().attn_dp_size == 1 and get_moe_a2a_backend().is_none()


def hook_enable_num_token_non_padded(original, *args, **kwargs):
    """AROUND ``forward_batch_info.enable_num_token_non_padded``: also on for fp4ext in TP mode,
    so SGLang carries the real token count and masks padded rows to ``-1`` (see module doc)."""
    return original(*args, **kwargs) or _fp4ext_tp_mode()


def _mask_condition_registered() -> bool:
    """With SGLang's ``register_num_token_non_padded_condition`` (patches/0003): is ours in?"""
    from sglang.srt.model_executor import forward_batch_info

    return _fp4ext_tp_mode in getattr(forward_batch_info, "_NUM_TOKEN_NON_PADDED_CONDITIONS", ())


def hook_status() -> dict[str, bool]:
    """For each capture-policy hook: is it in effect in this process (our hook live, or our
    condition registered with SGLang's own extension point)?"""
    import pkgutil

    from sglang.srt.arg_groups.resolution_hooks import _HOOKS

    from sglang_fp4ext import patches

    if patches.upstream_has(MASK_TARGET):
        masked = _mask_condition_registered()
    else:
        try:
            live = pkgutil.resolve_name(MASK_TARGET)
            masked = chain_has_hook(live, hook_enable_num_token_non_padded)
        except Exception:  # target moved: reported as not installed
            masked = False
    return {
        f"resolution:{RESOLUTION_STEP}": resolve_capture_policy in _HOOKS.get(RESOLUTION_STEP, ()),
        MASK_TARGET: masked,
    }


def install() -> list[str]:
    """Register the policy's resolution hook and masking hook; idempotent. Returns what it did.

    Call in the main process before ``ServerArgs.resolve_once`` (the plugin's ``register()``) and
    in every worker (the masking hook acts in the scheduler). Where SGLang has
    ``register_num_token_non_padded_condition`` (patches/0003) the masking condition is
    registered there instead of hooking the predicate. ``HookRegistry.apply_hooks()`` is
    the caller's (SGLang's loader runs it after the plugins).
    """
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS, register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_fp4ext import patches

    done = []
    if resolve_capture_policy not in _HOOKS.get(RESOLUTION_STEP, ()):
        register_resolution_hook(RESOLUTION_STEP)(resolve_capture_policy)
        done.append(f"capture policy (resolution hook {RESOLUTION_STEP})")
    register_condition = patches.upstream_object(MASK_TARGET)
    if register_condition is not None:  # SGLang's own extension point replaces the hook
        if not _mask_condition_registered():
            register_condition(_fp4ext_tp_mode)
            done.append("padded-row masking (register_num_token_non_padded_condition)")
        return done
    registered = HookRegistry._hooks.get(MASK_TARGET, ())
    if not any(hook is hook_enable_num_token_non_padded for _, hook, _ in registered):
        HookRegistry.register(MASK_TARGET, hook_enable_num_token_non_padded, HookType.AROUND)
        done.append("padded-row masking (hook enable_num_token_non_padded)")
    return done
