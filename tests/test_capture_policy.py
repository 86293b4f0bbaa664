"""CUDA-graph capture policy, CPU tier.

* The pure policy (``compute_policy`` and its parts): properties over random inputs (hypothesis):
  padding never moves a decode batch into another kernel-config bucket, prefill buckets are tile
  multiples at most 2x apart (SGLang refuses more padding), the memory budget is honoured; frozen,
  hashable, ``eval(repr)`` round trip; clear errors; ``describe_policy`` for ``fp4ext info``.
* SGLang's real argument resolution (``prepare_server_args`` + ``resolve_once`` in fresh
  interpreters, ``--device cuda``): fp4ext gets the policy's buckets; explicit user flags stay as
  given; another backend, and the same flags without the plugin, give SGLang's own result.
  This machine has no GPU, so two hardware facts are simulated in both children alike: the GPU
  memory SGLang reads from nvidia-smi (96 GiB, the RTX PRO 6000 class) and the prefill backend
  default that ``is_cuda()`` selects on a CUDA host (breakable). Everything else is SGLang's code.
* Padded-row masking in TP mode (TP=2, EP=1, two gloo processes): SGLang's own chain
  ``enable_num_token_non_padded`` -> ``ForwardBatch`` count -> forward context -> ``TopK``
  (GLM-style sigmoid grouped top-k with correction bias) -> dispatcher -> fp4ext runner core turns
  padded rows into ``-1`` ids, so the runner reads exactly the experts of the real rows; and no
  ``eager_on_graph`` break fires inside the fp4ext MoE layer.

Not covered here (GPU tier / measurement): capturing and replaying real graphs at these sizes,
SGLang's CUDA-only masking kernels (``mask_topk_ids``; the CPU branch of
``_mask_topk_ids_padded_region`` runs here), and the time/memory saved.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_fp4ext import capture_inputs as ci
from sglang_fp4ext import capture_policy as cp
from sglang_fp4ext import capture_sizes as cs
from sglang_fp4ext.moe.shape import token_bucket
from tests.sglang_cpu import free_port, prelude_cpu_layer, run_child, run_children, tiny_model_dir

# ---- pure policy -------------------------------------------------------------------------------


def _next_captured(sizes, n):
    return min(s for s in sizes if s >= n)


def _grid_step(b):
    if b <= cs.DECODE_DENSE_MAX:
        return 1
    return next(step for last, step in cs.DECODE_STEPS if last is None or b <= last)


def _inputs(**kw):
    base = dict(model=ci.GLM5, tp=8, ep=1, decode_max_bs=512, prefill_max_tokens=8192)
    base.update(kw)
    return ci.PolicyInputs(**base)


def test_glm5_tp8_policy_decisions():
    p = cp.compute_policy(_inputs(prefill_budget_mb=58 * cs.PREFILL_GRAPH_MB_PER_BUCKET))
    assert p.decode_bs[: cs.DECODE_DENSE_MAX] == tuple(range(1, cs.DECODE_DENSE_MAX + 1))
    assert p.decode_bs[-1] == 512 and list(p.decode_bs) == sorted(set(p.decode_bs))
    assert set(p.kernel_buckets) <= set(p.decode_bs)
    assert p.kernel_buckets == tuple(sorted({token_bucket(t) for t in range(1, 513)}))
    tile = cs.PREFILL_TILE_TOKENS
    assert all(b % tile == 0 for b in p.prefill_tokens if b >= tile)
    assert p.prefill_tokens[0] == cs.PREFILL_MIN_TOKENS and p.prefill_tokens[-1] == 8192
    assert (p.moe_placement, p.mask_padded_rows, p.masking) == ("in_graph", True, "fp4ext")
    # NVIDIA's NVFP4 GLM-5 keeps the shared expert BF16: SGLang does not fuse it.
    shape = p.inputs.per_rank_shape()
    assert (shape.E, shape.H, shape.I, shape.top_k) == (256, 6144, 256, 8)
    assert "excluded from quantization" in p.inputs.shared_fusion_reason
    # A checkpoint that quantizes it too (or the fused preset): the shared expert is expert 256.
    fused = _inputs(model=dataclasses.replace(ci.GLM5, shared_expert_excluded=False))
    assert (fused.per_rank_shape().E, fused.per_rank_shape().top_k) == (257, 9)
    assert _inputs(fuse_shared=True).per_rank_shape() == fused.per_rank_shape()
    with pytest.raises(ValueError, match="fused shared expert needs a shared expert and ep=1"):
        _inputs(fuse_shared=True, ep=8)
    # EP8: SGLang masks padded rows itself; 32 local experts with the full intermediate size.
    ep = cp.compute_policy(_inputs(ep=8))
    assert ep.masking == "sglang" and ep.mask_padded_rows
    s = ep.inputs.per_rank_shape()
    assert (s.E, s.I, s.top_k) == (32, 2048, 8)
    # DP attention gathers padded slots SGLang cannot mask: the policy says so instead of lying.
    dp = cp.compute_policy(_inputs(dp_attention=True))
    assert (dp.masking, dp.mask_padded_rows) == ("none", False)
    assert "not masked" in dp.summary() and any("DP attention" in n for n in dp.notes)


@settings(max_examples=150, deadline=None)
@given(max_bs=st.integers(1, 1100), tpr=st.integers(1, 8))
def test_decode_padding_stays_in_the_kernel_bucket(max_bs, tpr):
    sizes = cs.decode_batch_sizes(max_bs, tokens_per_req=tpr)
    assert sizes[-1] == max_bs and all(1 <= s <= max_bs for s in sizes)
    assert list(sizes) == sorted(set(sizes))
    assert set(range(1, min(cs.DECODE_DENSE_MAX, max_bs) + 1)) <= set(sizes)
    for b in range(1, max_bs + 1):
        padded = _next_captured(sizes, b)
        # The graph for `padded` runs the kernel config of the real batch's bucket.
        assert token_bucket(padded * tpr) == token_bucket(b * tpr), (b, padded)
        # Exact in the dense range, then at most one step of the grid (SGLang's own steps).
        assert padded - b < _grid_step(b), (b, padded)


@settings(max_examples=150, deadline=None)
@given(max_tokens=st.integers(1, 40000), budget_buckets=st.none() | st.integers(1, 80))
def test_prefill_buckets_tile_aligned_within_2x_and_budget(max_tokens, budget_buckets):
    budget = None if budget_buckets is None else budget_buckets * cs.PREFILL_GRAPH_MB_PER_BUCKET
    buckets, notes = cs.prefill_token_buckets(max_tokens, budget_mb=budget)
    tile = cs.PREFILL_TILE_TOKENS
    assert list(buckets) == sorted(set(buckets)) and buckets[-1] <= max_tokens
    assert all(b % tile == 0 for b in buckets[:-1] if b >= tile)  # the top one may be max itself
    if budget is not None:
        assert len(buckets) * cs.PREFILL_GRAPH_MB_PER_BUCKET <= budget
    truncated = any("dropped" in n for n in notes)
    if not truncated:
        assert buckets[-1] == max_tokens
    # SGLang replays a bucket only when it pads by <= 2x (prefill_cuda_graph_runner.py): the worst
    # prefill in each gap is one token above the lower bucket.
    assert buckets[0] <= 2 * min(cs.PREFILL_MIN_TOKENS, max_tokens)
    for lo, hi in itertools.pairwise(buckets):
        assert hi <= 2 * (lo + 1), (lo, hi, buckets)


def test_budget_widens_then_truncates():
    full, notes = cs.prefill_token_buckets(8192)
    assert notes == ()
    wide, wnotes = cs.prefill_token_buckets(8192, budget_mb=20 * cs.PREFILL_GRAPH_MB_PER_BUCKET)
    assert len(wide) <= 20 < len(full) and wide[-1] == 8192 and "widened" in wnotes[0]
    tiny, tnotes = cs.prefill_token_buckets(8192, budget_mb=3 * cs.PREFILL_GRAPH_MB_PER_BUCKET)
    assert len(tiny) == 3 and tiny == full[:3] and any("dropped" in n for n in tnotes)


def test_policy_is_frozen_hashable_and_round_trips():
    a = cp.policy_for("glm-5", 8, 1, 256, prefill_budget_mb=400.0)
    b = cp.policy_for("glm-5", 8, 1, 256, prefill_budget_mb=400.0)
    assert a == b and hash(a) == hash(b)  # deterministic
    assert eval(repr(a), vars(cp)) == a
    assert eval(repr(a.inputs), vars(cp)) == a.inputs
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.decode_bs = (1,)
    assert {a: 1}[b] == 1
    assert json.loads(json.dumps(a.to_dict()))["per_rank_shape"]["E"] == 256
    f = cp.policy_for("glm5-tp8-fused-shared", 8, 1, 256, prefill_budget_mb=400.0)
    assert eval(repr(f), vars(cp)) == f and f.inputs.fuse_shared and f != a
    assert f.to_dict()["per_rank_shape"]["E"] == 257


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"tp": 0}, "tp must be a positive int"),
        ({"ep": 3}, "ep=3 must divide tp=8"),
        ({"decode_max_bs": 0}, "decode_max_bs must be a positive int"),
        ({"prefill_max_tokens": -5}, "prefill_max_tokens must be a positive int"),
        ({"tokens_per_req": True}, "tokens_per_req must be a positive int"),
        ({"prefill_budget_mb": 0.0}, "prefill_budget_mb must be > 0"),
    ],
)
def test_bad_inputs_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        _inputs(**kw)


def test_bad_model_is_named():
    with pytest.raises(ValueError, match="top_k=9 exceeds n_routed_experts=8"):
        ci.MoEModel("x", 8, 9, 0, 64, 64, False)
    with pytest.raises(ValueError, match="unknown model 'glm-9'"):
        cp.policy_for("glm-9")
    with pytest.raises(ValueError, match="not an MoE config"):
        cp.policy_for({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})


def test_describe_policy_for_cli(tmp_path):
    text = cp.describe_policy("glm-5", 8, 1, 64, prefill_budget_mb=464.0)
    p = cp.policy_for("glm-5", 8, 1, 64, prefill_budget_mb=464.0)
    assert p.decode_bs[-1] == 64  # clamped to max running requests
    assert cs.compact_sizes(p.decode_bs) in text and cs.compact_sizes(p.prefill_tokens) in text
    assert "per rank E=256 H=6144 I=256 top_k=8" in text and "2.65 MB per expert" in text
    assert "not fused by SGLang 0.5.23: shared experts excluded from quantization (BF16)" in text
    fused = cp.describe_policy("glm5-tp8-fused-shared", 8, 1, 64, prefill_budget_mb=464.0)
    assert "per rank E=257 H=6144 I=256 top_k=9" in fused
    assert "fused by SGLang 0.5.23: local expert 256, one more id per token" in fused
    assert "enable_num_token_non_padded" in text
    cfg = dict(_TINY_GLM_LIKE, n_routed_experts=64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    text_ep = cp.describe_policy(tmp_path, 4, 4, prefill_budget_mb=100.0)
    assert "TP4 EP4; per rank E=16 " in text_ep and "SGLang's EP masking" in text_ep


def test_compact_sizes():
    assert cs.compact_sizes([1, 2, 3, 4, 8, 16, 24, 32, 33]) == "1-4, 8-32/8, 33"
    assert cs.compact_sizes([]) == "none"


# ---- SGLang argument resolution ----------------------------------------------------------------

#: A DSA-free GLM-5-like MoE model (GLM-5's DSA needs a GPU in SGLang's resolution): DeepSeek-V3
#: architecture (MLA) with GLM-5's routing: 256 routed experts, top-8, 1 shared, sigmoid noaux_tc,
#: one group, routed scaling 2.5; small dims; yarn rope_scaling as real DeepSeek configs carry.
_TINY_GLM_LIKE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "rope_theta": 1000000.0,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "tie_word_embeddings": False,
    "attention_bias": False,
}

#: name -> extra CLI flags. Each runs with --moe-runner-backend fp4ext (plugin child) and triton
#: (plugin child for "default"; every scenario in the child without the plugin).
_SCENARIOS = {
    "default": [],
    "user_bs": [
        "--cuda-graph-bs-decode",
        "1",
        "3",
        "5",
        "7",
        "--cuda-graph-bs-prefill",
        "16",
        "256",
        "4096",
    ],
    "user_json": [
        "--cuda-graph-config",
        '{"decode": {"bs": [2, 4, 6]}, "prefill": {"max_bs": 2048}}',
    ],
    "user_max": ["--cuda-graph-max-bs-decode", "48", "--cuda-graph-max-bs-prefill", "1024"],
    "max_running": ["--max-running-requests", "24"],
    "no_padding": ["--disable-cuda-graph-padding"],
    "prefill_off": ["--disable-prefill-cuda-graph"],
    "cpu": ["--device", "cpu"],
}

_RESOLVE = """
import json, logging, warnings
warnings.simplefilter("ignore")
# Simulated hardware facts (see the module docstring); the same in both children.
import sglang.srt.arg_groups.memory_hook as memory_hook
memory_hook.get_device_memory_capacity = lambda device=None: 96.0 * 1024
import sglang.srt.model_executor.cuda_graph_config as cuda_graph_config
cuda_graph_config.default_prefill_backend = lambda: "breakable"
from sglang.srt.plugins import load_plugins
load_plugins()
out = {{}}
if {PLUGIN}:
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang_fp4ext import capture_hooks as ch
    out["install"] = [ch.install(), ch.install()]   # the second call must do nothing
    HookRegistry.apply_hooks()
    out["hook_status"] = ch.hook_status()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolved_view
BASE = ["--model-path", {MODEL!r}, "--device", "cuda", "--skip-tokenizer-init", "--tp-size", "8"]

def resolve(backend, flags):
    sa = prepare_server_args(BASE + ["--moe-runner-backend", backend] + flags)
    sa.resolve_once()
    v = resolved_view(sa)
    c = v.cuda_graph_config
    phase = lambda p: {{"backend": p.backend, "max_bs": p.max_bs, "bs": p.bs}}
    return {{"decode": phase(c.decode), "prefill": phase(c.prefill),
             "mem_fraction_static": v.mem_fraction_static,
             "chunked_prefill_size": v.chunked_prefill_size,
             "locked": sorted("%s.%s" % k for k in sa._cuda_graph_config_locked)}}

for backend, names in {RUNS!r}:
    for name in names:
        out[backend + ":" + name] = resolve(backend, {SCENARIOS!r}[name])

if {PLUGIN}:
    # The masking predicate per parallel layout, after SGLang publishes each server's config.
    from sglang.srt import runtime_context
    from sglang.srt.runtime_context import SpawnRanks
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.model_executor import forward_batch_info as fbi
    logging.getLogger("sglang_fp4ext").setLevel(logging.WARNING)  # log lines: scenarios only
    out["predicate"] = {{}}
    for name, kw in [("triton TP8", dict(moe_runner_backend="triton")),
                     ("fp4ext TP8", dict(moe_runner_backend="fp4ext")),
                     ("fp4ext TP8 EP8", dict(moe_runner_backend="fp4ext", ep_size=8)),
                     ("fp4ext DP-attention", dict(moe_runner_backend="fp4ext",
                                                  enable_dp_attention=True, dp_size=8))]:
        sa = ServerArgs(model_path={MODEL!r}, device="cuda", skip_tokenizer_init=True,
                        tp_size=8, **kw)
        sa.resolve_once()
        runtime_context.publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0))
        out["predicate"][name] = [fbi.enable_num_token_non_padded(),
                                  fbi.enable_num_token_non_padded.__wrapped__(),
                                  getattr(ch.policy_from_server_args(sa)[0], "masking", None)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """Both children at once: with the plugin (+ capture_hooks.install()) and without it."""
    model = tmp_path_factory.mktemp("glm-like")
    (model / "config.json").write_text(json.dumps(_TINY_GLM_LIKE))
    names = list(_SCENARIOS)
    with_plugin = _RESOLVE.format(
        PLUGIN=True,
        MODEL=str(model),
        SCENARIOS=_SCENARIOS,
        RUNS=[("fp4ext", names), ("triton", ["default"])],
    )
    without = _RESOLVE.format(
        PLUGIN=False, MODEL=str(model), SCENARIOS=_SCENARIOS, RUNS=[("triton", names)]
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(run_child, with_plugin)
        b = pool.submit(run_child, without, env={"SGLANG_PLUGINS": "some_other_plugin"})
        return {"plugin": a.result(), "plain": b.result(), "model": model}


def _expected(r, name, **overrides) -> cp.CapturePolicy:
    """The policy computed here from what SGLang resolved without the plugin."""
    sgl = r["plain"][f"triton:{name}"]
    model = ci.MoEModel.from_hf_config(_TINY_GLM_LIKE)
    kw = dict(
        model=model,
        tp=8,
        ep=1,
        decode_max_bs=sgl["decode"]["max_bs"],
        prefill_max_tokens=sgl["prefill"]["max_bs"],
        prefill_budget_mb=len(sgl["prefill"]["bs"]) * cs.PREFILL_GRAPH_MB_PER_BUCKET,
    )
    kw.update(overrides)
    return cp.compute_policy(ci.PolicyInputs(**kw))


@pytest.mark.sglang
def test_install_is_idempotent_and_hooks_are_live(resolved):
    # The plugin's register() (run by SGLang's loader) already installed the policy: further
    # direct calls add nothing, and both hooks are live.
    first, second = resolved["plugin"]["install"]
    assert first == [] and second == []
    assert all(resolved["plugin"]["hook_status"].values()), resolved["plugin"]["hook_status"]


@pytest.mark.sglang
def test_other_backend_keeps_sglang_defaults(resolved):
    plugin, plain = resolved["plugin"]["triton:default"], resolved["plain"]["triton:default"]
    assert plugin == plain
    # Sanity: these are SGLang's 96 GiB / TP8 defaults (memory_hook.py), not an empty config.
    assert plain["decode"]["max_bs"] == 512 and plain["prefill"]["max_bs"] == 8192
    assert plain["prefill"]["backend"] == "breakable"


@pytest.mark.sglang
def test_fp4ext_gets_the_policy_buckets(resolved):
    got, sgl = resolved["plugin"]["fp4ext:default"], resolved["plain"]["triton:default"]
    want = _expected(resolved, "default")
    assert got["decode"]["bs"] == list(want.decode_bs)
    assert got["prefill"]["bs"] == list(want.prefill_tokens)
    assert got["decode"]["bs"] != sgl["decode"]["bs"]  # the policy really changed something
    assert got["prefill"]["bs"] != sgl["prefill"]["bs"]
    # Maxima, backends and SGLang's memory reservation are SGLang's.
    for phase in ("decode", "prefill"):
        for key in ("backend", "max_bs"):
            assert got[phase][key] == sgl[phase][key]
    assert got["mem_fraction_static"] == sgl["mem_fraction_static"]
    assert got["chunked_prefill_size"] == sgl["chunked_prefill_size"]
    # One INFO line per fp4ext server on CUDA (every scenario except --device cpu).
    lines = [
        ln
        for ln in resolved["plugin"]["_stderr"].splitlines()
        if "fp4ext capture policy (TP8 EP1" in ln
    ]
    assert len(lines) == len(_SCENARIOS) - 1, lines
    assert any(cs.compact_sizes(want.decode_bs) in ln for ln in lines)
    assert "MoE inside graph segments" in lines[0]
    assert "padded rows -> -1 ids (fp4ext hook on enable_num_token_non_padded, TP)" in lines[0]


@pytest.mark.sglang
def test_explicit_user_settings_are_untouched(resolved):
    got = {n: resolved["plugin"][f"fp4ext:{n}"] for n in _SCENARIOS}
    sgl = {n: resolved["plain"][f"triton:{n}"] for n in _SCENARIOS}
    # Explicit lists (--cuda-graph-bs-*): exactly what the user gave, as without the plugin.
    assert got["user_bs"]["decode"] == sgl["user_bs"]["decode"]
    assert got["user_bs"]["decode"]["bs"] == [1, 3, 5, 7]
    assert got["user_bs"]["prefill"] == sgl["user_bs"]["prefill"]
    assert got["user_bs"]["prefill"]["bs"] == [16, 256, 4096]
    # --cuda-graph-config JSON: decode list kept; prefill max kept, its unlocked list is ours.
    assert got["user_json"]["decode"] == sgl["user_json"]["decode"]
    assert got["user_json"]["decode"]["bs"] == [2, 4, 6]
    assert got["user_json"]["prefill"]["max_bs"] == sgl["user_json"]["prefill"]["max_bs"] == 2048
    assert got["user_json"]["prefill"]["bs"] == list(
        _expected(resolved, "user_json").prefill_tokens
    )
    # --cuda-graph-max-bs-*: maxima kept, the policy's sizes stop there.
    for phase in ("decode", "prefill"):
        assert got["user_max"][phase]["max_bs"] == sgl["user_max"][phase]["max_bs"]
    want = _expected(resolved, "user_max")
    assert got["user_max"]["decode"]["bs"] == list(want.decode_bs) and want.decode_bs[-1] == 48
    assert got["user_max"]["prefill"]["bs"] == list(want.prefill_tokens)
    # --max-running-requests: SGLang clamps its default maximum, the policy covers up to it.
    assert got["max_running"]["decode"]["max_bs"] == sgl["max_running"]["decode"]["max_bs"] == 24
    assert got["max_running"]["decode"]["bs"] == list(range(1, 25))
    # --disable-cuda-graph-padding: SGLang's exact-size decode list stays.
    assert got["no_padding"]["decode"] == sgl["no_padding"]["decode"]
    # --disable-prefill-cuda-graph: prefill untouched, decode still ours.
    assert got["prefill_off"]["prefill"] == sgl["prefill_off"]["prefill"]
    assert got["prefill_off"]["prefill"]["backend"] == "disabled"
    assert got["prefill_off"]["decode"]["bs"] == list(_expected(resolved, "prefill_off").decode_bs)
    # --device cpu (no CUDA graphs; SGLang reuses the decode list for its CPU graph): untouched.
    assert got["cpu"]["decode"] == sgl["cpu"]["decode"]
    assert got["cpu"]["prefill"] == sgl["cpu"]["prefill"]
    for n in _SCENARIOS:
        assert got[n]["locked"] == sgl[n]["locked"], n


@pytest.mark.sglang
def test_masking_predicate_per_layout(resolved):
    """[hooked predicate, SGLang's original, policy.masking] of enable_num_token_non_padded after
    SGLang publishes each server's config: the hook and the policy's statement agree."""
    pred = resolved["plugin"]["predicate"]
    assert pred["fp4ext TP8"] == [True, False, "fp4ext"]  # the policy turns masking on for TP
    assert pred["triton TP8"] == [False, False, None]  # other backends: SGLang unchanged
    assert pred["fp4ext TP8 EP8"] == [True, True, "sglang"]  # EP: SGLang masks already
    # DP attention gathers padded slots (moe_num_token_non_padded() returns None there): left off,
    # and the policy says so.
    assert pred["fp4ext DP-attention"] == [False, False, "none"]


# ---- padded rows in TP mode, through SGLang's forward path --------------------------------------

_MASKED_FORWARD = """
import warnings
warnings.simplefilter("ignore")
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_fp4ext import capture_hooks as ch
ch.install()
HookRegistry.apply_hooks()
from sglang.srt.runtime_context import get_parallel
from sglang.srt.model_executor import forward_batch_info as fbi
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    breakable_cuda_graph as bcg)
from sglang.srt.layers.moe.topk import TopK
from sglang_fp4ext.moe import reference
from sglang_fp4ext.moe.weights import random_moe_weights

E, H, I, K, T_REAL, T_PAD = 64, 256, 128, 4, {T_REAL}, {T_PAD}
g = torch.Generator().manual_seed({SEED})  # same on every rank: same tokens, same routing
layer = make_layer(num_experts=E, hidden=H, inter=I, top_k=K)
# This rank's shard (TP splits the intermediate size); padded and unpadded runs below share it.
w = random_moe_weights(E, H, layer.w2_weight.shape[2] * 2, generator=g)
for name, t in (("w13_weight", w.w13), ("w13_weight_scale", w.w13_scale),
                ("w13_weight_scale_2", w.w13_scale_2), ("w2_weight", w.w2),
                ("w2_weight_scale", w.w2_scale), ("w2_weight_scale_2", w.w2_scale_2)):
    p = getattr(layer, name)
    p.data.copy_(t.reshape(p.shape).to(p.dtype))
layer.quant_method.process_weights_after_loading(layer)

seen = []
_ref = reference.fused_moe_nvfp4_torch
def spy(x, weights, ids, tw):  # what the fp4ext runner core hands to its expert math
    seen.append(ids.clone())
    return _ref(x, weights, ids, tw)
reference.fused_moe_nvfp4_torch = spy

# GLM-5's router: sigmoid scores, correction bias, one group, renormalised, scaled by 2.5. The bias
# stays small next to the sigmoid scores (as in trained routers): a unit-variance bias would pick
# the same experts for every row and make the control below vacuous.
topk = TopK(top_k=K, layer_id=0, use_grouped_topk=True, topk_group=1, num_expert_group=1,
            renormalize=True, scoring_func="sigmoid",
            correction_bias=0.05 * torch.randn(E, generator=g),
            routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True)
# A replayed graph: T_PAD rows in the static buffers, the first T_REAL real; padded rows hold
# stale data (here: random), as they do in SGLang's buffers.
x = torch.randn(T_PAD, H, generator=g).to(torch.bfloat16)
logits = torch.randn(T_PAD, E, generator=g)

# SGLang's ForwardBatch for the T_REAL real tokens carries the count when the predicate says so.
fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=T_REAL,
                  input_ids=torch.zeros(T_REAL, dtype=torch.int64),
                  req_pool_indices=torch.arange(T_REAL),
                  seq_lens=torch.ones(T_REAL, dtype=torch.int64),
                  out_cache_loc=torch.zeros(T_REAL, dtype=torch.int64), seq_lens_sum=T_REAL)
fb._init_num_token_non_padded(device="cpu", is_draft_worker=False)
if fb.global_num_token_non_padded is not None:  # as ModelRunner.forward does
    fb.set_local_num_token_non_padded(sharded=False)
bound = fb.moe_num_token_non_padded()

class BreakRecorder:  # stands in for a BCG capture: every eager_on_graph site calls this first
    def __init__(self):
        self.breaks = 0
    def _end_current_segment(self):
        self.breaks += 1
        raise RuntimeError("eager break inside the MoE layer")

def probe(v):
    return v + 1
probe = bcg.eager_on_graph(True)(probe)
rec = BreakRecorder()
token = bcg._current_capture_var.set(rec)
try:
    with forward_context(ForwardContext(attn_backend=None), forward_batch=fb):
        out_padded = layer.forward(x, topk(x, logits))
    moe_breaks = rec.breaks
    try:
        probe(1)  # control: a real eager_on_graph site is detected by the recorder
    except RuntimeError:
        pass
    probe_breaks = rec.breaks - moe_breaks
finally:
    bcg._current_capture_var.reset(token)
ids_padded = seen[-1]
out_real = layer.forward(x[:T_REAL], topk(x[:T_REAL], logits[:T_REAL]))  # unpadded, eager
ids_real = seen[-1]
layer.forward(x, topk(x, logits))  # control: SGLang without a count routes padded rows
ids_unmasked = seen[-1]
print(json.dumps({{
    "enabled": fbi.enable_num_token_non_padded(),
    "sglang_alone": fbi.enable_num_token_non_padded.__wrapped__(),
    "moe_ep_size": get_parallel().moe_ep_size, "tp": get_parallel().tp_size,
    "bound": None if bound is None else int(bound),
    "ids_padded": ids_padded.tolist(), "ids_real": ids_real.tolist(),
    "ids_unmasked": ids_unmasked.tolist(),
    "real_rows_max_abs_diff": float((out_padded[:T_REAL].float() - out_real.float()).abs().max()),
    "real_rows_scale": float(out_real.float().abs().max()),
    "padded_rows_max_abs": float(out_padded[T_REAL:].float().abs().max()),
    "moe_breaks": moe_breaks, "probe_breaks": probe_breaks,
}}))
"""


@pytest.mark.sglang
def test_tp_padded_rows_read_no_expert_weights(tmp_path, seed):
    tp, t_real, t_pad = 2, 3, 8
    port, model = free_port(), tiny_model_dir(tmp_path)
    body = _MASKED_FORWARD.format(T_REAL=t_real, T_PAD=t_pad, SEED=seed)
    codes = [prelude_cpu_layer(model, "fp4ext", port, tp=tp, rank=r) + body for r in range(tp)]
    # As in test_sglang_layer: CPU engine flag for device answers, no NCCL so groups run on gloo.
    env = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": str(tmp_path / "no-libnccl.so")}
    for r in run_children(codes, env=env):
        assert (r["tp"], r["moe_ep_size"]) == (tp, 1)  # TP mode
        assert r["enabled"] is True and r["sglang_alone"] is False
        assert r["bound"] == t_real
        padded, real, unmasked = r["ids_padded"], r["ids_real"], r["ids_unmasked"]
        assert padded[:t_real] == real
        assert all(i == -1 for row in padded[t_real:] for i in row)

        # The runner reads exactly the real rows' experts ...
        def experts(rows):
            return {i for row in rows for i in row if i >= 0}

        assert experts(padded) == experts(real)
        # ... whereas SGLang without the count sends the padded rows to more experts (64 experts,
        # 20 random picks: the chance they all land in the real rows' <= 12 is below 1e-10).
        assert experts(unmasked) > experts(real)
        # Real rows are unchanged by padding: the same fp32 per-token expert math on the same
        # rows, rounded once to bf16 (at most 1 bf16 ulp, 2^-8 relative, of the largest output).
        assert r["real_rows_max_abs_diff"] <= r["real_rows_scale"] * 2**-8, r
        assert r["padded_rows_max_abs"] == 0.0  # no expert contributes to a padded row
        # No eager break on the fp4ext MoE path; the recorder does see a real one.
        assert r["moe_breaks"] == 0 and r["probe_breaks"] == 1


def test_module_imports_without_sglang():
    """The policy and describe_policy must work where SGLang is absent (``fp4ext info``)."""
    code = """
import sys, json
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from sglang_fp4ext import capture_policy as cp
text = cp.describe_policy("glm-5", 8, 1, 128)
print(json.dumps({"ok": "decode graphs" in text, "budget": "unbounded" in text}))
"""
    r = run_child(code)
    assert r == {"ok": True, "budget": True, "_stderr": r["_stderr"]}
