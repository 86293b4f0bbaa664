"""The SGLang side of tuning at first start (``start_tune.py``): which token buckets this server
runs, and the call that tunes a served shape for them.

``sglang_weights.process_weights`` calls :func:`tune_served_shape` right after it built a layer's
fp4ext weights for the Triton path: inside SGLang's model load, so before the KV cache takes the
free memory and before warm-up and capture; never in a forward. The buckets are those of the
graph sizes SGLang resolved (the capture policy's unless the user set them;
``capture_sizes.captured_token_buckets``), decode sizes counted in MoE rows (times the draft
tokens a request verifies under speculative decoding). A phase whose graphs are off runs the same
sizes eagerly (SGLang 0.5.23 resolves prefill graphs off by default), so its sizes count too. With
no sizes published, the tuner's default buckets stand in for them. Imports SGLang inside its
functions only.
"""

from __future__ import annotations

import logging

from sglang_fp4ext import envs
from sglang_fp4ext.capture_sizes import captured_token_buckets

__all__ = ["served_buckets", "tune_served_shape"]

logger = logging.getLogger("sglang_fp4ext")


def served_buckets() -> tuple[int, ...]:
    """The kernel token buckets of this server's resolved graph sizes (its published config);
    empty before SGLang published one."""
    from sglang.srt.runtime_context import get_exec, get_spec

    try:
        graphs = get_exec().graph.cuda_graph_config
        spec = get_spec()
    except ValueError:  # nothing published yet
        return ()
    if graphs is None:
        return ()
    rows = (spec.speculative_num_draft_tokens or 1) if spec.speculative_algorithm else 1
    return captured_token_buckets(
        graphs.decode.bs or (), graphs.prefill.bs or (), tokens_per_req=rows
    )


def tune_served_shape(shape, device) -> None:
    """With ``SGLANG_FP4EXT_TUNE_AT_START`` on, tune ``shape`` (a ``MoEShape`` the Triton path
    serves on ``device``) for the served buckets (``start_tune.tune_before_capture``: once per
    shape, only where no table covers it, never twice on one machine). A no-op when off."""
    if envs.tune_budget_s() is None:
        return
    from sglang_fp4ext.start_tune import tune_before_capture
    from sglang_fp4ext.tune import DEFAULT_BUCKETS

    buckets = served_buckets()
    if not buckets:
        logger.info("fp4ext: no CUDA-graph sizes published; tuning buckets 1-%d instead",
                    DEFAULT_BUCKETS[-1])  # fmt: skip
        buckets = DEFAULT_BUCKETS
    tune_before_capture(shape, buckets, device=device)
