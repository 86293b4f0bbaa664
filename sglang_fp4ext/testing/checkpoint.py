"""Tiny NVFP4 MoE checkpoints in ModelOpt's layout, made by ModelOpt itself (on the CPU).

``make_tiny_checkpoint(out_dir, arch)`` builds a tiny random model of a real architecture with
``transformers`` (``glm_moe_dsa`` = GLM-5 ``GlmMoeDsaForCausalLM``, ``glm4_moe`` = GLM-4.5
``Glm4MoeForCausalLM``, ``deepseek_v3`` = ``DeepseekV3ForCausalLM``), calibrates and quantizes it
with ``modelopt.torch.quantization`` (``NVFP4_DEFAULT_CFG``, max calibration on random tokens) and
writes it with ``modelopt.torch.export.export_hf_checkpoint`` -- the exact producer of the NVFP4
checkpoints users load (measured: import ~6 s, quantize + export < 1 s for the default dims on
a 2-core CPU). The directory then holds:

* ``config.json`` with ``quantization_config`` (``quant_method: modelopt``, ``quant_algo: NVFP4``,
  ``ignore`` list), ``hf_quant_config.json`` (``quantization.quant_algo: NVFP4``,
  ``group_size: 16``, ``exclude_modules``), ``generation_config.json``;
* ``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json``.

What is NVFP4 and what stays bf16 (the choice, documented here):

* Routed experts, NVFP4, one set of tensors per expert and projection (``nvfp4/format.py``)::

      model.layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight          uint8 [N, K/2]
      model.layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight_scale    e4m3  [N, K/16]
      model.layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight_scale_2  fp32  []
      model.layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.input_scale     fp32  []

  ModelOpt quantizes transformers' fused ``gate_up_proj`` per expert, so an expert's gate and up
  share one ``weight_scale_2`` (the amax of both), and all experts of a layer share their
  ``input_scale`` (one activation quantizer per fused-experts module).
* The shared expert (``mlp.shared_experts.*``) is NVFP4 too by default, with the same four
  tensors, so SGLang can fuse it as expert ``E`` (top-k + 1). ``quantize_shared_experts=False``
  keeps it bf16, as nvidia/GLM-5.2-NVFP4 does (which makes SGLang refuse shared-expert fusion).
* bf16: embeddings, attention (MLA, and the DSA indexer of ``glm_moe_dsa``), the dense MLPs of the
  first ``first_k_dense_replace`` layers, the router ``mlp.gate.weight`` (its
  ``e_score_correction_bias`` is fp32, as in DeepSeek/GLM checkpoints), norms, ``lm_head``.
* ``mtp=True``: the MTP (NextN) layer, ``model.layers.{num_hidden_layers}``, all bf16 and named in
  the exclusion lists (``model.layers.{n}*``), as NVIDIA ships it. transformers builds no MTP
  layer, so it is written after the export from its own seeded generator: ``enorm``, ``hnorm``,
  ``eh_proj`` ``[H, 2H]``, ``shared_head.norm`` and a decoder layer with the tensors of the last
  MoE layer, every expert projection a bf16 ``[N, K]`` weight. ``embed_tokens`` and
  ``shared_head.head`` are left out: SGLang's NextN loaders take the target's. It goes into one
  more shard; the others are renamed ``-of-{n+1}``.

``make_tiny_checkpoint(out, arch, **NVIDIA_LAYOUT)`` is NVIDIA's GLM-5.x-NVFP4 layout: only the
routed experts NVFP4; the shared expert, attention, dense layers and the MTP layer unquantized.

Weights are drawn from a seeded generator with realistic magnitudes (every matrix N(0, 1/fan_in),
embeddings N(0, 1)), so hidden states stay O(1) through the layers; calibration uses random token
ids from the same seed. Same arguments, same bytes.

``load_moe_weights(dir)`` reads a checkpoint back into one ``MoEWeights`` per MoE layer.
``nvidia-modelopt``, ``transformers`` and ``safetensors`` are needed (the ``test`` extra).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from ..moe.weights import MoEWeights

__all__ = [
    "ARCHITECTURES",
    "NVIDIA_LAYOUT",
    "tiny_config",
    "build_tiny_model",
    "make_tiny_checkpoint",
    "read_checkpoint",
    "load_moe_weights",
]

#: model_type -> HF architecture class name.
ARCHITECTURES = {
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}

# Tiny dims shared by all three (GLM-5 real values in the comments).
_COMMON = dict(
    vocab_size=512,  # 154880
    hidden_size=256,  # 6144
    intermediate_size=512,  # 12288 (dense MLP)
    moe_intermediate_size=128,  # 2048
    num_hidden_layers=4,  # 78
    first_k_dense_replace=1,  # 3
    n_routed_experts=16,  # 256
    num_experts_per_tok=4,  # 8
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    # Read by SGLang's DeepSeek/GLM loaders; GLM-5 carries one MTP layer (written with mtp=True).
    num_nextn_predict_layers=1,
)
_MLA = dict(
    num_attention_heads=4,  # 64
    num_key_value_heads=4,
    q_lora_rank=128,  # 2048
    kv_lora_rank=64,  # 512
    qk_nope_head_dim=64,  # 192
    qk_rope_head_dim=32,  # 64
    v_head_dim=64,  # 256
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    moe_layer_freq=1,
)
_DEFAULTS = {
    "glm_moe_dsa": {
        **_COMMON,
        **_MLA,
        "index_topk": 64,  # 2048
        "index_head_dim": 128,
        "index_n_heads": 4,  # 32
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
    "deepseek_v3": {
        **_COMMON,
        **_MLA,
        # Grouped routing as in DeepSeek-V3 (8 groups, best 4): 4 groups of 4 experts, best 2.
        "n_group": 4,
        "topk_group": 2,
        # SGLang's CPU rope path asserts a rope scaling; real DeepSeek-V3 configs carry this yarn.
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "max_position_embeddings": 163840,
    },
    "glm4_moe": {
        **_COMMON,
        "num_attention_heads": 4,  # GLM-4.5: 96
        "num_key_value_heads": 2,  # 8
        "head_dim": 64,  # 128
        "attention_bias": True,
        "use_qk_norm": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "partial_rotary_factor": 0.5,
        },
    },
}

#: NVIDIA's GLM-5.x-NVFP4 layout as ``make_tiny_checkpoint`` keywords (module docstring).
NVIDIA_LAYOUT = {"quantize_shared_experts": False, "mtp": True}

_MAX_SHARD_SIZE = "500KB"  # a few shards for the default dims, so the index is exercised


def tiny_config(arch: str = "glm_moe_dsa", **overrides):
    """The ``transformers`` config of a tiny ``arch`` model (defaults above, ``overrides`` win)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    from transformers import AutoConfig

    kw = {**_DEFAULTS[arch], **overrides}
    cfg = AutoConfig.for_model(arch, architectures=[ARCHITECTURES[arch]], **kw)
    cfg.dtype = torch.bfloat16
    return cfg


@torch.no_grad()
def build_tiny_model(arch: str = "glm_moe_dsa", seed: int = 0, **overrides):
    """The tiny model with seeded, realistic random weights (deterministic on the CPU).

    Parameters are bf16 values held in fp32 (``e_score_correction_bias`` is plain fp32): CPU
    forwards in bf16 are several times slower (``index_add_``), and export casts to bf16 exactly.
    """
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, **overrides)
    with torch.random.fork_rng(devices=[]):  # transformers' own init must not move the global RNG
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            std = 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=g) * std)
        elif name.endswith(".bias") and "norm" not in name:
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)  # qkv biases of glm4_moe
        else:
            p.fill_(0.0 if name.endswith(".bias") else 1.0)  # norm weights / LayerNorm bias
        p.copy_(p.to(torch.bfloat16).float())
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            # Small, so the router still follows the gate logits.
            b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return model.eval()


def _quant_cfg(config, quantize_shared_experts: bool) -> dict:
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    off = ["*self_attn*", "*mlp.gate.*", "*lm_head*"]
    off += [f"*layers.{i}.mlp.*" for i in range(config.first_k_dense_replace)]
    if not quantize_shared_experts:
        off.append("*shared_experts*")
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + [
        {"quantizer_name": p, "enable": False} for p in off
    ]
    return cfg


def make_tiny_checkpoint(
    out_dir,
    arch: str = "glm_moe_dsa",
    seed: int = 0,
    *,
    quantize_shared_experts: bool = True,
    mtp: bool = False,
    calib_batches: int = 2,
    calib_seq_len: int = 32,
    **dim_overrides,
) -> Path:
    """Write a tiny ModelOpt-NVFP4 checkpoint of ``arch`` into ``out_dir`` (created) and return it.

    ``dim_overrides`` replace config fields (e.g. ``hidden_size=512, n_routed_experts=8``);
    expert ``hidden_size`` and ``moe_intermediate_size`` must be multiples of 16. ``mtp`` adds
    the MTP layer, bf16 and excluded from quantization (module docstring).
    """
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    cfg = tiny_config(arch, **dim_overrides)
    for name in ("hidden_size", "moe_intermediate_size"):
        if getattr(cfg, name) % 16:
            raise ValueError(f"{name}={getattr(cfg, name)} must be a multiple of 16 (NVFP4 blocks)")
    if mtp and cfg.num_nextn_predict_layers != 1:
        raise ValueError(
            f"mtp=True needs num_nextn_predict_layers=1 (SGLang 0.5.23 loads one MTP layer), got "
            f"{cfg.num_nextn_predict_layers}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(arch, seed, **dim_overrides)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [
        torch.randint(0, cfg.vocab_size, (2, calib_seq_len), generator=g)
        for _ in range(calib_batches)
    ]

    def forward_loop(m):
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids)

    threads = torch.get_num_threads()
    # One thread: on these tiny tensors thread hand-offs cost more than they save, and on a busy
    # 2-core CI box they dominate (measured: 21 s with 2 threads, 6 s with 1, imports included).
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            mtq.quantize(model, _quant_cfg(cfg, quantize_shared_experts), forward_loop=forward_loop)
        # Calibrated in fp32 (fast on CPU); parameters hold bf16 values, so this cast is exact.
        # Buffers (quantizer amax, e_score_correction_bias) stay fp32.
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        export_hf_checkpoint(model, export_dir=out, max_shard_size=_MAX_SHARD_SIZE)
    finally:
        torch.set_num_threads(threads)
    if mtp:
        from sglang_fp4ext.testing.mtp_layer import append_mtp_layer

        append_mtp_layer(out, cfg, seed)
    return out


# ---- reading checkpoints back ----


def read_checkpoint(ckpt_dir) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint (sharded with an index, or one file), on the CPU."""
    from safetensors.torch import load_file

    d = Path(ckpt_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (d / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors(.index.json) in {d}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(d / f)))
    return tensors


def _stack_mlp(t: dict[str, torch.Tensor], prefixes: list[str]) -> MoEWeights:
    for p in prefixes:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            key = f"{p}.{proj}.weight"
            if key not in t or t[key].dtype != torch.uint8 or f"{p}.{proj}.weight_scale" not in t:
                raise KeyError(f"{key} is missing or not NVFP4 (uint8 + weight_scale)")

    def stack(proj, leaf):
        return torch.stack([t[f"{p}.{proj}.{leaf}"] for p in prefixes])

    return MoEWeights(
        w13=torch.cat([stack("gate_proj", "weight"), stack("up_proj", "weight")], dim=1),
        w13_scale=torch.cat(
            [stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale")], dim=1
        ),
        w13_scale_2=torch.stack(
            [stack("gate_proj", "weight_scale_2"), stack("up_proj", "weight_scale_2")], dim=1
        ).float(),
        w2=stack("down_proj", "weight"),
        w2_scale=stack("down_proj", "weight_scale"),
        w2_scale_2=stack("down_proj", "weight_scale_2").float(),
        # SGLang keeps one GEMM1 input scale per expert: the max of gate's and up's.
        w13_input_scale=torch.maximum(
            stack("gate_proj", "input_scale"), stack("up_proj", "input_scale")
        ).float(),
        w2_input_scale=stack("down_proj", "input_scale").float(),
    )


def load_moe_weights(ckpt_dir, *, include_shared: bool = False) -> dict[int, MoEWeights]:
    """``{layer index: MoEWeights}`` for every MoE layer of an NVFP4 checkpoint.

    Experts are stacked in index order; ``include_shared=True`` appends the shared expert as the
    last expert (SGLang's shared-expert fusion), which needs it NVFP4 with the routed experts'
    intermediate size.
    """
    d = Path(ckpt_dir)
    cfg = json.loads((d / "config.json").read_text())
    t = read_checkpoint(d)
    n_exp = cfg["n_routed_experts"]
    out: dict[int, MoEWeights] = {}
    for layer in range(cfg["num_hidden_layers"]):
        base = f"model.layers.{layer}.mlp"
        if f"{base}.experts.0.gate_proj.weight" not in t:
            continue
        prefixes = [f"{base}.experts.{e}" for e in range(n_exp)]
        if include_shared:
            prefixes.append(f"{base}.shared_experts")
        w = _stack_mlp(t, prefixes)
        if w.w13.shape[1] != 2 * cfg["moe_intermediate_size"]:
            raise ValueError(f"layer {layer}: shared expert width differs from the routed experts")
        out[layer] = w
    if not out:
        raise ValueError(f"{d} has no NVFP4 routed experts")
    return out
