"""CUDA-graph capture policy for ``--moe-runner-backend fp4ext``: which sizes SGLang captures.

SGLang 0.5.23 replays one full CUDA graph per decode batch size and a breakable graph (BCG: graph
segments split at eager breaks such as attention) per prefill token bucket, padding each batch up
to the next captured size. :func:`compute_policy` decides, from a frozen :class:`PolicyInputs`, a
frozen :class:`CapturePolicy` (hashable, ``eval(repr(p)) == p``):

* **Decode batch sizes** (requests per step): every size ``1..DECODE_DENSE_MAX``, then SGLang's
  own steps (``DECODE_STEPS``), plus every token-count bucket boundary where the fp4ext decode
  kernels change config (read from :func:`sglang_fp4ext.moe.shape.token_bucket`, so a padded
  batch always runs the config of its real bucket), up to the decode maximum SGLang resolved
  (its memory default, already clamped to ``--max-running-requests``).
* **Prefill token buckets** (BCG): powers of two from ``PREFILL_MIN_TOKENS`` below one tile, then
  multiples of ``PREFILL_TILE_TOKENS`` with steps that keep padding under ``PREFILL_MAX_WASTE``,
  topped by the prefill maximum itself (full chunks land there exactly). Consecutive buckets are
  at most 2x apart, so SGLang's refusal of >2x padding never sends a prefill to eager mode. The
  list must fit ``prefill_budget_mb`` at ``PREFILL_GRAPH_MB_PER_BUCKET`` (SGLang's own per-bucket
  estimate); by default that is what SGLang's default list would cost, so the policy never needs
  more graph memory than SGLang's ``mem_fraction_static`` heuristic reserved.
* **MoE placement**: the fp4ext MoE runs inside graph segments. With ``--moe-a2a-backend none``
  (the only a2a fp4ext serves) the StandardDispatcher MoE has no ``eager_on_graph`` site, and
  fp4ext has no host sync, so nothing splits a segment at the MoE.
* **Padded rows never read expert weights**: their ``topk_ids`` are ``-1``, which the fp4ext
  kernels skip. SGLang already does this under EP > 1; ``capture_hooks`` does it for TP.

The size grids are ``capture_sizes.py``. The SGLang hooks that apply the policy to a server
(resolution step, padded-row masking in TP mode, and why user settings win) are
``capture_hooks.py``; the inputs (:class:`MoEModel`, :class:`PolicyInputs`) are
``capture_inputs.py``. This module imports neither SGLang nor the hooks: :func:`describe_policy`
(``fp4ext info``) shows the policy for a model and parallel layout without a server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sglang_fp4ext.capture_inputs import MODELS, MoEModel, PolicyInputs
from sglang_fp4ext.capture_sizes import (
    PREFILL_GRAPH_MB_PER_BUCKET,
    PREFILL_TILE_TOKENS,
    captured_token_buckets,
    compact_sizes,
    decode_batch_sizes,
    kernel_bucket_boundaries,
    prefill_token_buckets,
)
from sglang_fp4ext.model_shapes import PRESETS

__all__ = ["CapturePolicy", "compute_policy", "describe_policy", "policy_for"]


# ---- the policy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapturePolicy:
    """The decisions for one server. ``eval(repr(p)) == p``; all fields hashable.

    ``decode_bs``: decode batch sizes to capture (requests). ``prefill_tokens``: BCG prefill token
    buckets. ``kernel_buckets``: the fp4ext decode-kernel token buckets the decode sizes are
    aligned to. ``moe_placement``: ``"in_graph"`` (inside graph segments, never an eager break).
    ``masking``: who turns padded rows into ``-1`` ids: ``"sglang"`` (EP > 1: SGLang already
    does), ``"fp4ext"`` (TP: our hook on ``enable_num_token_non_padded``) or ``"none"`` (DP
    attention, where ``mask_padded_rows`` is False).
    """

    inputs: PolicyInputs
    decode_bs: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    kernel_buckets: tuple[int, ...]
    moe_placement: str = "in_graph"
    mask_padded_rows: bool = True
    masking: str = "fp4ext"
    notes: tuple[str, ...] = field(default=())

    def token_buckets(self) -> tuple[int, ...]:
        """The kernel token buckets the captured graphs run (:func:`captured_token_buckets`)."""
        return captured_token_buckets(
            self.decode_bs, self.prefill_tokens, tokens_per_req=self.inputs.tokens_per_req
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["per_rank_shape"] = asdict(self.inputs.per_rank_shape())
        d["shared_fusion_reason"] = self.inputs.shared_fusion_reason  # None: fused
        return d

    def masking_text(self) -> str:
        return {
            "sglang": "padded rows -> -1 ids (SGLang's EP masking)",
            "fp4ext": "padded rows -> -1 ids (fp4ext hook on enable_num_token_non_padded, TP)",
            "none": "padded rows not masked (DP attention)",
        }[self.masking]

    def summary(self) -> str:
        """One line: the policy's decisions (sizes, placement, masking)."""
        return (
            f"decode bs {compact_sizes(self.decode_bs)} ({len(self.decode_bs)} graphs); "
            f"prefill tokens {compact_sizes(self.prefill_tokens)} "
            f"({len(self.prefill_tokens)} buckets, tile {PREFILL_TILE_TOKENS}); "
            f"MoE {'inside graph segments' if self.moe_placement == 'in_graph' else 'eager'}; "
            f"{self.masking_text()}"
        )


def compute_policy(inputs: PolicyInputs) -> CapturePolicy:
    """The capture policy for ``inputs``; a pure, deterministic function."""
    prefill, notes = prefill_token_buckets(
        inputs.prefill_max_tokens, budget_mb=inputs.prefill_budget_mb
    )
    if inputs.dp_attention:
        masking = "none"
        notes += (
            (
                "DP attention: padded slots are not masked (SGLang's "
                "SGLANG_OPT_MASK_DP_PAD_MOE=1 drops DP pad rows under EP > 1)"
            ),
        )
    else:
        masking = "sglang" if inputs.ep > 1 else "fp4ext"
    return CapturePolicy(
        inputs=inputs,
        decode_bs=decode_batch_sizes(inputs.decode_max_bs, tokens_per_req=inputs.tokens_per_req),
        prefill_tokens=prefill,
        kernel_buckets=kernel_bucket_boundaries(inputs.decode_max_bs * inputs.tokens_per_req),
        moe_placement="in_graph",
        mask_padded_rows=masking != "none",
        masking=masking,
        notes=notes,
    )


# ---- a model and layout, without a server (fp4ext info) ---------------------------------------


def _resolve_model(model: str | MoEModel | Mapping[str, Any] | Path) -> MoEModel:
    if isinstance(model, MoEModel):
        return model
    if isinstance(model, Mapping):
        return MoEModel.from_hf_config(model)
    key = str(model).lower()
    if key in MODELS:
        return MODELS[key]
    if key in PRESETS:  # a layout preset names its model too (the same names as tune and bench)
        return MODELS[PRESETS[key].model]
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        # ModelOpt checkpoints may keep their quantization (which decides shared-expert fusion)
        # only in this file beside config.json.
        quant = path.with_name("hf_quant_config.json")
        return MoEModel.from_hf_config(
            json.loads(path.read_text()),
            name=str(model),
            hf_quant_config=json.loads(quant.read_text()) if quant.is_file() else None,
        )
    raise ValueError(
        f"unknown model {model!r}: give a model ({', '.join(MODELS)}), a layout preset "
        f"({', '.join(PRESETS)}), a config.json path or "
        "its directory, or a config dict"
    )


def _sglang_default_prefill_count(max_tokens: int) -> int | None:
    """How many prefill buckets SGLang's default list has for ``max_tokens`` (None without
    SGLang)."""
    try:
        from sglang.srt.arg_groups.cuda_graph_hook import generate_prefill_cuda_graph_batch_sizes
    except Exception:  # SGLang missing or broken: no default budget
        return None
    return len(generate_prefill_cuda_graph_batch_sizes(max_tokens))


def policy_for(
    model: str | MoEModel | Mapping[str, Any] | Path = "glm-5",
    tp: int = 8,
    ep: int = 1,
    max_running_requests: int | None = None,
    *,
    chunked_prefill_size: int = 8192,
    decode_max_bs: int | None = None,
    prefill_max_tokens: int | None = None,
    tokens_per_req: int = 1,
    prefill_budget_mb: float | None = None,
    fuse_shared: bool | None = None,
) -> CapturePolicy:
    """The policy a server would get, from a model and a parallel layout (no server needed).

    Defaults follow SGLang 0.5.23's resolution on a 90-160 GiB GPU (memory_hook.py): decode up to
    512 (TP >= 4; 256 below), clamped to ``max_running_requests``; prefill up to
    ``chunked_prefill_size`` (at most 8192 for MLA models); budget = SGLang's default prefill list
    at ``PREFILL_GRAPH_MB_PER_BUCKET`` each. Pass the server's values where they differ.
    ``fuse_shared``: None lets SGLang's rule decide for the checkpoint, except that a layout
    preset's own choice holds.
    """
    m = _resolve_model(model)
    if fuse_shared is None and isinstance(model, str) and model.lower() in PRESETS:
        fuse_shared = PRESETS[model.lower()].fuse_shared
    if decode_max_bs is None:
        decode_max_bs = 512 if tp >= 4 else 256
        if max_running_requests is not None:
            decode_max_bs = min(decode_max_bs, max_running_requests)
    if prefill_max_tokens is None:
        prefill_max_tokens = min(8192, chunked_prefill_size) if m.use_mla else chunked_prefill_size
    if prefill_budget_mb is None:
        n = _sglang_default_prefill_count(prefill_max_tokens)
        prefill_budget_mb = None if n is None else max(n, 1) * PREFILL_GRAPH_MB_PER_BUCKET
    return compute_policy(
        PolicyInputs(
            model=m,
            tp=tp,
            ep=ep,
            decode_max_bs=decode_max_bs,
            prefill_max_tokens=prefill_max_tokens,
            max_running_requests=max_running_requests,
            chunked_prefill_size=chunked_prefill_size,
            tokens_per_req=tokens_per_req,
            prefill_budget_mb=prefill_budget_mb,
            fuse_shared=fuse_shared,
        )
    )


def describe_policy(
    model: str | MoEModel | Mapping[str, Any] | Path = "glm-5",
    tp: int = 8,
    ep: int = 1,
    max_running_requests: int | None = None,
    **kwargs,
) -> str:
    """A small text table of :func:`policy_for` (for ``fp4ext info``); same arguments."""
    p = policy_for(model, tp, ep, max_running_requests, **kwargs)
    i, shape = p.inputs, p.inputs.per_rank_shape()
    # NVFP4 expert weights: 0.5 B per weight + one e4m3 scale per 16 weights, 3 projections.
    mb_per_expert = 3 * shape.H * shape.I * (0.5 + 1 / 16) / 1e6
    budget = "unbounded" if i.prefill_budget_mb is None else f"{i.prefill_budget_mb:g} MB"
    m = i.model
    model_row = (
        f"{m.name}: {m.n_routed_experts} experts top-{m.top_k}, {m.n_shared_experts} shared, "
        f"H={m.hidden_size}, I={m.moe_intermediate_size}"
    )
    layout_row = (
        f"TP{i.tp} EP{i.ep}; per rank E={shape.E} H={shape.H} I={shape.I} top_k={shape.top_k} "
        f"({mb_per_expert:.2f} MB per expert)"
    )
    why = i.shared_fusion_reason
    if not m.n_shared_experts:
        shared_row = "none"
    elif why is None:
        shared_row = f"fused by SGLang 0.5.23: local expert {shape.E - 1}, one more id per token"
    else:
        shared_row = f"not fused by SGLang 0.5.23: {why}; a separate MLP beside the MoE"
    prefill_row = (
        f"{compact_sizes(p.prefill_tokens)} tokens ({len(p.prefill_tokens)}, "
        f"tile {PREFILL_TILE_TOKENS}, budget {budget})"
    )
    rows = [
        ("model", model_row),
        ("layout", layout_row),
        ("shared expert", shared_row),
        (
            "decode graphs",
            f"{compact_sizes(p.decode_bs)} ({len(p.decode_bs)}, max {i.decode_max_bs})",
        ),
        ("kernel buckets", compact_sizes(p.kernel_buckets) + " tokens (all captured)"),
        ("prefill buckets", prefill_row),
        ("MoE placement", "inside graph segments (no eager break)"),
        (
            "padded rows",
            p.masking_text() + (": no expert weights read" if p.mask_padded_rows else ""),
        ),
    ]
    rows += [("note", n) for n in p.notes]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
