"""SGLang's shared-expert fusion for a checkpoint, as ``fp4ext info --model-path`` states it
(CPU tier): NVIDIA's GLM-5 NVFP4 layout (shared experts, attention, dense layers and the MTP layer
excluded) is served unfused at E = 256, top_k = 8 per rank at TP8; the same checkpoint with its
shared expert quantized is fused, E = 257, top_k = 9. The mirror of SGLang's rule
(``shared_fusion.fusion_disable_reason``) is checked against SGLang's own
``resolve_shared_experts_config`` on the same files, so it cannot drift silently.

The checkpoints hold only their config files (GLM-5's real dimensions and key names, ModelOpt's
export layout: ``config.json``'s ``quantization_config.ignore`` and ``hf_quant_config.json``'s
``exclude_modules``); nothing here reads weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_fp4ext import capture_policy as cp
from sglang_fp4ext.model_shapes import MoEModel
from sglang_fp4ext.shared_fusion import (
    checkpoint_quant,
    fusion_disable_reason,
    shared_expert_excluded,
)
from tests.sglang_cpu import run_children, start_python

#: zai-org/GLM-5-FP8 config.json, the keys SGLang's argument resolution and model config read.
GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_topk": 2048,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def nvidia_exclusions(cfg: dict, *, quantize_shared: bool) -> list[str]:
    """ModelOpt's exclusion globs for NVIDIA's GLM-5 NVFP4 layout: only ``mlp.experts.*`` of the
    MoE layers NVFP4; the dense layers, every ``self_attn*``, router and shared expert, the MTP
    layer (index ``num_hidden_layers``), embeddings and ``lm_head`` kept unquantized."""
    n, dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    out = ["lm_head", "model.embed_tokens"] + [f"model.layers.{i}*" for i in range(dense)]
    for i in range(dense, n):
        out += [f"model.layers.{i}.self_attn*", f"model.layers.{i}.mlp.gate"]
        if not quantize_shared:
            out.append(f"model.layers.{i}.mlp.shared_experts*")
    return out + [f"model.layers.{n + k}*" for k in range(cfg["num_nextn_predict_layers"])]


def write_checkpoint(d: Path, *, quantize_shared: bool, in_config: bool = True) -> Path:
    """``config.json`` and ``hf_quant_config.json`` as ModelOpt exports them (``in_config``:
    also ``config.json``'s ``quantization_config``; older exports have only the other file)."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(GLM5_CONFIG)
    exclude = nvidia_exclusions(cfg, quantize_shared=quantize_shared)
    if in_config:
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                      "group_size": 16, "ignore": exclude}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    hf_quant = {"producer": {"name": "modelopt", "version": "0.37.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                 "group_size": 16, "exclude_modules": exclude}}  # fmt: skip
    (d / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=1))
    return d


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("glm5-layouts")
    return {
        "nvidia": write_checkpoint(root / "nvidia", quantize_shared=False),
        "shared-quantized": write_checkpoint(root / "shared-quantized", quantize_shared=True),
        "nvidia-hf-quant-only": write_checkpoint(
            root / "nvidia-hf-quant-only", quantize_shared=False, in_config=False
        ),
        "shared-quantized-hf-quant-only": write_checkpoint(
            root / "shared-quantized-hf-quant-only", quantize_shared=True, in_config=False
        ),
    }


# ---- fp4ext info --model-path ------------------------------------------------------------------


def test_info_states_fusion_and_the_per_rank_shape(ckpts):
    """NVIDIA's layout: no fusion, E=256 top_k=8 at TP8; shared expert quantized: fused, E=257
    top_k=9. Each with the tables that hold the shape (both run as ``fp4ext info`` does)."""
    procs = {
        name: start_python(
            ["-m", "sglang_fp4ext.cli", "info", "--model-path", str(ckpts[name]), "--tp", "8"]
        )
        for name in ("nvidia", "shared-quantized")
    }
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out[name] = stdout
    nv, fused = out["nvidia"], out["shared-quantized"]
    assert "per rank E=256 H=6144 I=256 top_k=8" in nv
    assert "not fused by SGLang 0.5.23: shared experts excluded from quantization (BF16)" in nv
    assert "[config tables: MoE shape E=256,H=6144,I=256,top_k=8]" in nv
    assert "per rank E=257 H=6144 I=256 top_k=9" in fused
    assert "fused by SGLang 0.5.23: local expert 256, one more id per token" in fused
    assert "[config tables: MoE shape E=257,H=6144,I=256,top_k=9]" in fused
    for text in (nv, fused):
        assert "shipped tables: NVIDIA H100 80GB HBM3, NVIDIA H200" in text


@pytest.mark.parametrize(
    "name, ep, shape",
    [
        ("nvidia", 1, (256, 256, 8)),
        ("nvidia-hf-quant-only", 1, (256, 256, 8)),
        ("shared-quantized", 1, (257, 256, 9)),
        ("shared-quantized-hf-quant-only", 1, (257, 256, 9)),
        ("shared-quantized", 8, (32, 2048, 8)),  # CUDA EP: never fused
    ],
)
def test_policy_shape_from_the_checkpoint_files(ckpts, name, ep, shape):
    s = cp.policy_for(ckpts[name], 8, ep, prefill_budget_mb=100.0).inputs.per_rank_shape()
    assert (s.E, s.I, s.top_k) == shape


# ---- the mirror's parts ------------------------------------------------------------------------


def test_checkpoint_quant_reads_what_sglang_reads():
    cfg = dict(GLM5_CONFIG)
    flat = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}
    nested = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["x.shared_experts*"]}}
    # config.json's quantization_config wins over hf_quant_config.json, as in SGLang.
    assert checkpoint_quant({**cfg, "quantization_config": flat}, nested) == (
        "modelopt_fp4", ("lm_head",),
    )  # fmt: skip
    assert checkpoint_quant(cfg, nested) == ("modelopt_fp4", ("x.shared_experts*",))
    assert checkpoint_quant(cfg, None) == (None, ())
    fp8 = {"quant_method": "fp8", "modules_to_not_convert": ["lm_head"]}
    assert checkpoint_quant({**cfg, "quantization_config": fp8}) == ("fp8", ("lm_head",))


def test_only_a_shared_expert_body_blocks_fusion():
    # ModelOptFp4Config.can_fuse_shared_expert: the separate shared_expert_gate does not count.
    assert shared_expert_excluded("modelopt_fp4", ["model.layers.3.mlp.shared_experts*"])
    assert not shared_expert_excluded("modelopt_fp4", ["model.layers.3.mlp.shared_expert_gate"])
    assert not shared_expert_excluded("fp8", ["model.layers.3.mlp.shared_experts*"])


def test_unknown_architectures_are_named_not_guessed():
    m = MoEModel("x", 256, 8, 1, 64, 64, False, "SomeNewMoeForCausalLM")
    assert "does not mirror" in fusion_disable_reason(m, 1)
    assert fusion_disable_reason(MoEModel("y", 256, 8, 0, 64, 64, False), 1) == "no shared expert"


# ---- the mirror against SGLang's own decision -------------------------------------------------

#: SGLang's classes whose rule the mirror copies, each asked about its own architecture.
_CLASSES = {
    "GlmMoeDsaForCausalLM": "sglang.srt.models.glm4_moe",
    "DeepseekV3ForCausalLM": "sglang.srt.models.deepseek_v2",
    "Glm4MoeForCausalLM": "sglang.srt.models.glm4_moe",
}
_ROUTED = (256, 160)


def _sglang_decisions(ckpts: dict[str, Path], ep: int) -> str:
    """A child that resolves a GLM-5 server (TP8, ``ep``) on the CPU, builds each checkpoint's
    quantization config through SGLang's loader and asks ``resolve_shared_experts_config`` for
    every architecture and routed-expert count. The gate's GPU facts are a CUDA sm_100 machine
    (SGLang's DSA resolution asks the capability too); nothing else is patched."""
    return f"""
import copy, importlib, json, torch
torch.cuda.get_device_capability = lambda *a, **k: (10, 0)
from sglang.srt import runtime_context
from sglang.srt.runtime_context import SpawnRanks
from sglang.srt.server_args import ServerArgs
ckpts = {json.dumps({k: str(v) for k, v in ckpts.items()})}
first = ServerArgs(model_path=ckpts["nvidia"], device="cpu", attention_backend="torch_native",
                   skip_tokenizer_init=True, tp_size=8, ep_size={ep})
first.resolve_once()
runtime_context.publish(first, role="scheduler", ranks=SpawnRanks(world_rank=0))
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.moe.utils import resolve_shared_experts_config
from sglang.srt.model_loader import loader
from sglang.srt.models import deepseek_v2, glm4_moe
deepseek_v2._is_cuda = glm4_moe._is_cuda = True
out = {{}}
for name, path in ckpts.items():
    mc = ModelConfig.from_server_args(first, model_path=path)
    qc = loader._get_quantization_config(mc, LoadConfig())
    for arch, module in {_CLASSES!r}.items():
        cls = getattr(importlib.import_module(module), arch)
        for routed in {_ROUTED!r}:
            hf = copy.deepcopy(mc.hf_config)
            hf.architectures, hf.n_routed_experts = [arch], routed
            r = resolve_shared_experts_config(cls, hf, qc)
            out[f"{{name}}|{{arch}}|{{routed}}"] = r.num_fused_shared_experts
print(json.dumps(out))
"""


def test_mirror_matches_sglangs_own_decision(ckpts):
    ep_sizes = (1, 8)
    results = run_children([_sglang_decisions(ckpts, ep) for ep in ep_sizes], timeout=600)
    checked = 0
    for ep, got in zip(ep_sizes, results):
        got.pop("_stderr")
        for key, fused in got.items():
            name, arch, routed = key.split("|")
            cfg = json.loads((ckpts[name] / "config.json").read_text())
            cfg.update(architectures=[arch], n_routed_experts=int(routed))
            hq = json.loads((ckpts[name] / "hf_quant_config.json").read_text())
            model = MoEModel.from_hf_config(cfg, hf_quant_config=hq)
            reason = fusion_disable_reason(model, ep)
            assert (reason is None) == (fused == 1), (key, ep, reason, fused)
            checked += 1
    assert checked == len(ep_sizes) * len(ckpts) * len(_CLASSES) * len(_ROUTED)
    # The cases that matter, spelled out: NVIDIA's GLM-5 layout unfused, a quantized shared
    # expert fused at EP1 only.
    assert results[0]["nvidia|GlmMoeDsaForCausalLM|256"] == 0
    assert results[0]["shared-quantized|GlmMoeDsaForCausalLM|256"] == 1
    assert results[1]["shared-quantized|GlmMoeDsaForCausalLM|256"] == 0
