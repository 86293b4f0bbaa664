"""fp4ext inside SGLang's own NVFP4 MoE layer on the CPU (CPU tier).

SGLang's ``FusedMoE`` with ``ModelOptFp4Config`` and ``--moe-runner-backend fp4ext``: expert
tensors in ModelOpt's per-expert checkpoint layout go through SGLang's own weight loaders
(``make_expert_params_mapping`` + ``weight_loader``), SGLang's post-load processing runs our hook,
and ``forward`` with the output of SGLang's ``TopK`` runs our runner core. The result is compared
with the reference MoE evaluated on the quantised weights *before* they went through SGLang, so
gate/up order, scale columns and id mapping are all checked.
"""

from __future__ import annotations

import pytest

from tests.sglang_cpu import free_port, prelude_cpu_layer, run_child, run_children, tiny_model_dir

pytestmark = pytest.mark.sglang

_LOAD_AND_RUN = """
from sglang_fp4ext.moe.weights import random_moe_weights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import error_stats
from sglang.srt.layers.moe.topk import TopK

E, H, I, K, T, SHARED = {E}, {H}, {I}, {K}, {T}, {SHARED}
g = torch.Generator().manual_seed({SEED})
w = random_moe_weights(E + SHARED, H, I, generator=g)
layer = FusedMoE(num_experts=E + SHARED, hidden_size=H, intermediate_size=I, layer_id=0,
                 top_k=K + SHARED, params_dtype=torch.bfloat16, quant_config=QUANT_CONFIG,
                 prefix="model.layers.3.mlp.experts", num_fused_shared_experts=SHARED)
params = dict(layer.named_parameters())
mapping = FusedMoE.make_expert_params_mapping(
    ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj",
    ckpt_up_proj_name="up_proj", num_experts=E + SHARED)
# ModelOpt's per-expert checkpoint tensors (hardware-and-model.md section 8.1).
ckpt = {{}}
for e in range(E + SHARED):
    for proj, rows in (("gate_proj", slice(0, I)), ("up_proj", slice(I, 2 * I))):
        col = 0 if proj == "gate_proj" else 1
        ckpt[f"experts.{{e}}.{{proj}}.weight"] = w.w13[e, rows]
        ckpt[f"experts.{{e}}.{{proj}}.weight_scale"] = w.w13_scale[e, rows]
        ckpt[f"experts.{{e}}.{{proj}}.weight_scale_2"] = w.w13_scale_2[e, col]
        ckpt[f"experts.{{e}}.{{proj}}.input_scale"] = w.w13_input_scale[e]
    ckpt[f"experts.{{e}}.down_proj.weight"] = w.w2[e]
    ckpt[f"experts.{{e}}.down_proj.weight_scale"] = w.w2_scale[e]
    ckpt[f"experts.{{e}}.down_proj.weight_scale_2"] = w.w2_scale_2[e]
    ckpt[f"experts.{{e}}.down_proj.input_scale"] = w.w2_input_scale[e]
loaded = 0
for name, tensor in ckpt.items():
    for param_name, weight_name, expert_id, shard_id in mapping:
        if weight_name not in name:
            continue
        pname = name.replace(weight_name, param_name).removeprefix("experts.")
        param = params[pname]
        param.weight_loader(param, tensor.clone(), pname, shard_id=shard_id, expert_id=expert_id)
        loaded += 1
        break
layer.quant_method.process_weights_after_loading(layer)

x = torch.randn(T, H, generator=g).to(torch.bfloat16)
router_logits = torch.randn(T, E, generator=g)
topk = TopK(top_k=K, layer_id=0, renormalize=True)
if hasattr(topk, "forward_native"):
    topk_output = topk.forward_native(x, router_logits)
else:
    topk_output = topk(x, router_logits)
ids, weights = topk_output.topk_ids, topk_output.topk_weights
if SHARED:
    # SGLang's fused shared expert occupies the last slot: local id E, weight 1.
    ids = torch.cat([ids, torch.full((T, 1), E, dtype=ids.dtype)], dim=1)
    weights = torch.cat([weights, torch.ones(T, 1, dtype=weights.dtype)], dim=1)
    topk_output = topk_output._replace(topk_ids=ids, topk_weights=weights)
import io, logging
served_log = io.StringIO()
fp4ext_logger = logging.getLogger("sglang_fp4ext")
served_handler = logging.StreamHandler(served_log)
fp4ext_logger.addHandler(served_handler)
fp4ext_logger.setLevel(logging.INFO)
out = layer.forward(x, topk_output)
layer.forward(x, topk_output)  # served before: logs nothing more
if {REDUCE}:
    # Per-rank partial sums (GLM-5's DeepseekV2MoE uses reduce_results=False): SGLang's
    # tensor-parallel all-reduce makes the layer output.
    from sglang.srt.distributed import tensor_model_parallel_all_reduce
    out = tensor_model_parallel_all_reduce(out.contiguous())
ref = fused_moe_nvfp4_torch(x, w, ids.to(torch.int32), weights)
st = error_stats(out.float(), ref)
RESULTS.append({{"loaded": loaded, "max_rel": st.max_rel, "rms_rel": st.rms_rel,
                "out_dtype": str(out.dtype), "shape": list(out.shape),
                "path": layer._fp4ext_quant_info.path,
                "input_scales": [float(layer._fp4ext_quant_info.weights.w13_input_scale.max()),
                                 float(layer._fp4ext_quant_info.weights.w2_input_scale.max())],
                "input_scales_want": [float(w.w13_input_scale.max()),
                                      float(w.w2_input_scale.max())],
                "swizzled_freed": layer.w13_blockscale_swizzled is None,
                "local_experts": int(layer.w13_weight.shape[0]),
                "ep_size": layer._fp4ext_quant_info.ep_size,
                "local_inter": int(layer.w2_weight.shape[2]) * 2,
                "ids": ids.tolist(), "served_log": served_log.getvalue()}})
fp4ext_logger.removeHandler(served_handler)
"""


def _assert_served_once(r, *, layer_id, path, local_experts):
    """The runner core's per-layer line (what the end-to-end check parses): once per layer."""
    from sglang_fp4ext.testing.e2e import served_moe_layers

    assert r["served_log"].count("fp4ext served MoE layer") == 1, r["served_log"]
    served = served_moe_layers(r["served_log"])
    assert served == {layer_id: {(path, local_experts)}}, r["served_log"]


def _cases(bodies: list[str]) -> str:
    """The bodies one after the other in one child (each builds its own layer, SGLang's state is
    initialised once); the child prints their results as one JSON object."""
    return "RESULTS = []\n" + "".join(bodies) + 'print(json.dumps({"cases": RESULTS}))\n'


def test_fused_moe_layer_matches_reference(tmp_path, seed):
    """Routed experts only, then with SGLang's fused shared expert: two layers, one process
    (each layer's runner core logs and serves on its own)."""
    E, H, I, K, T = 8, 256, 128, 2, 5
    bodies = [
        _LOAD_AND_RUN.format(E=E, H=H, I=I, K=K, T=T, SHARED=shared, SEED=seed, REDUCE=False)
        for shared in (0, 1)
    ]
    code = prelude_cpu_layer(tiny_model_dir(tmp_path), "fp4ext", free_port()) + _cases(bodies)
    cases = run_child(code)["cases"]
    assert len(cases) == 2
    for shared, r in enumerate(cases):
        what = ("routed-only", "fused-shared")[shared]
        assert r["loaded"] == (E + shared) * 12, what  # 3 projections x 4 tensors per expert
        assert r["path"] == "reference"  # no GPU here: the announced torch path
        assert r["swizzled_freed"] is True
        # The static input scales reach fp4ext (the W4A4 prefill path): the max over the experts.
        assert r["input_scales"] == r["input_scales_want"], (what, r)
        assert r["out_dtype"] == "torch.bfloat16" and r["shape"] == [T, H]
        if shared:
            assert all(row[-1] == E for row in r["ids"])
        _assert_served_once(r, layer_id=0, path="reference", local_experts=E + shared)
        # Same fp32 math on the same weights; the only difference is the final bf16 rounding of
        # the output (relative 2^-9 per element), so RMS stays well under 1e-2 of the output RMS.
        assert r["rms_rel"] < 5e-3, (what, r)
        assert r["max_rel"] < 1e-2, (what, r)


@pytest.mark.parametrize("tp,ep", [(2, 1), (2, 2)], ids=["TP2", "EP2"])
def test_two_process_tp_ep_matches_single_process_reference(tmp_path, seed, tp, ep):
    """2 gloo processes: TP=2 shards the intermediate size, EP=2 gives each rank 4 local experts
    (non-local ids become -1 in SGLang's dispatcher); after SGLang's all-reduce the output equals
    the reference on the full, unsharded weights."""
    E, H, I, K, T = 8, 256, 128, 2, 6
    port, model = free_port(), tiny_model_dir(tmp_path)
    body = _LOAD_AND_RUN.format(E=E, H=H, I=I, K=K, T=T, SHARED=0, SEED=seed, REDUCE=True)
    codes = [
        prelude_cpu_layer(model, "fp4ext", port, tp=tp, ep=ep, rank=r) + _cases([body])
        for r in range(tp)
    ]
    # No GPU: SGLang's CPU engine flag makes get_device() answer "cpu" (the EP dispatcher builds
    # its local-id map there), and pointing SGLang at no NCCL library makes PyNccl disable itself
    # so the groups run on gloo alone.
    env = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": str(tmp_path / "no-libnccl.so")}
    results = [r["cases"][0] for r in run_children(codes, env=env)]
    for r in results:
        if ep == 1:
            assert (r["local_experts"], r["local_inter"]) == (E, I // tp)
        else:
            assert (r["local_experts"], r["local_inter"]) == (E // ep, I)
        assert r["ep_size"] == ep, r  # the kernels' tile heuristics see SGLang's EP size
        _assert_served_once(r, layer_id=0, path="reference", local_experts=r["local_experts"])
        # As the single-process test, plus one fp32->bf16 rounding of each rank's partial sum.
        assert r["rms_rel"] < 5e-3, r
        assert r["max_rel"] < 1.5e-2, r
