"""Tiny ModelOpt-NVFP4 checkpoints: files, exact tensor names/dtypes/shapes, config, and the
expert bytes reproduced bit for bit by our codec from the original weights."""

import json
import os
import random

import pytest
import torch

pytest.importorskip("modelopt.torch.export", reason="nvidia-modelopt is not importable")
pytest.importorskip("safetensors", reason="safetensors is not installed")

from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch  # noqa: E402
from sglang_fp4ext.nvfp4.format import quantize_nvfp4, weight_global_scale  # noqa: E402
from sglang_fp4ext.testing import checkpoint as ck  # noqa: E402
from sglang_fp4ext.testing.compare import assert_close  # noqa: E402

PROJ = ("gate_proj", "up_proj", "down_proj")
LEAVES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


@pytest.fixture(scope="session")
def ckpt_seed():
    env = os.environ.get("FP4EXT_TEST_SEED")
    s = int(env) if env else random.SystemRandom().randrange(2**31)
    print(f"[seed] tiny checkpoints: FP4EXT_TEST_SEED={s}")
    return s


@pytest.fixture(scope="session")
def glm5_ckpt(tmp_path_factory, ckpt_seed):
    return ck.make_tiny_checkpoint(tmp_path_factory.mktemp("glm5"), "glm_moe_dsa", ckpt_seed)


def _expected_glm5(cfg) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Every tensor of a GLM-5 (glm_moe_dsa) NVFP4 checkpoint, written out from the config."""
    bf, u8, f8, f32 = torch.bfloat16, torch.uint8, torch.float8_e4m3fn, torch.float32
    h, v, nh = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    ql, kl, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, vd = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    inter, i, n_exp = (
        cfg["intermediate_size"],
        cfg["moe_intermediate_size"],
        cfg["n_routed_experts"],
    )
    t = {"model.embed_tokens.weight": (bf, (v, h)), "model.norm.weight": (bf, (h,)),
         "lm_head.weight": (bf, (v, h))}  # fmt: skip
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        t |= {
            f"{p}.input_layernorm.weight": (bf, (h,)),
            f"{p}.post_attention_layernorm.weight": (bf, (h,)),
            f"{p}.self_attn.q_a_proj.weight": (bf, (ql, h)),
            f"{p}.self_attn.q_a_layernorm.weight": (bf, (ql,)),
            f"{p}.self_attn.q_b_proj.weight": (bf, (nh * (nope + rope), ql)),
            f"{p}.self_attn.kv_a_proj_with_mqa.weight": (bf, (kl + rope, h)),
            f"{p}.self_attn.kv_a_layernorm.weight": (bf, (kl,)),
            f"{p}.self_attn.kv_b_proj.weight": (bf, (nh * (nope + vd), kl)),
            f"{p}.self_attn.o_proj.weight": (bf, (h, nh * vd)),
            f"{p}.self_attn.indexer.wq_b.weight": (bf, (ih * idim, ql)),
            f"{p}.self_attn.indexer.wk.weight": (bf, (idim, h)),
            f"{p}.self_attn.indexer.k_norm.weight": (bf, (idim,)),
            f"{p}.self_attn.indexer.k_norm.bias": (bf, (idim,)),
            f"{p}.self_attn.indexer.weights_proj.weight": (bf, (ih, h)),
        }
        if layer < cfg["first_k_dense_replace"]:
            t |= {f"{p}.mlp.gate_proj.weight": (bf, (inter, h)),
                  f"{p}.mlp.up_proj.weight": (bf, (inter, h)),
                  f"{p}.mlp.down_proj.weight": (bf, (h, inter))}  # fmt: skip
            continue
        t |= {f"{p}.mlp.gate.weight": (bf, (n_exp, h)),
              f"{p}.mlp.gate.e_score_correction_bias": (f32, (n_exp,))}  # fmt: skip
        for e in [*(f"experts.{j}" for j in range(n_exp)), "shared_experts"]:
            for proj, (n, k) in zip(PROJ, [(i, h), (i, h), (h, i)], strict=True):
                q = f"{p}.mlp.{e}.{proj}"
                t |= {f"{q}.weight": (u8, (n, k // 2)), f"{q}.weight_scale": (f8, (n, k // 16)),
                      f"{q}.weight_scale_2": (f32, ()), f"{q}.input_scale": (f32, ())}  # fmt: skip
    return t


def test_files_and_index(glm5_ckpt):
    names = set(os.listdir(glm5_ckpt))
    assert {"config.json", "hf_quant_config.json", "model.safetensors.index.json"} <= names
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) >= 2
    wmap = json.loads((glm5_ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(set(wmap.values())) == shards
    from safetensors import safe_open

    for shard in shards:
        with safe_open(str(glm5_ckpt / shard), "pt") as f:
            assert {k for k, s in wmap.items() if s == shard} == set(f.keys())


def test_exact_names_dtypes_shapes(glm5_ckpt):
    cfg = json.loads((glm5_ckpt / "config.json").read_text())
    want = _expected_glm5(cfg)
    got = ck.read_checkpoint(glm5_ckpt)
    assert set(got) == set(want), (
        sorted(set(got) - set(want))[:5],
        sorted(set(want) - set(got))[:5],
    )
    for k, (dtype, shape) in want.items():
        assert (got[k].dtype, tuple(got[k].shape)) == (dtype, shape), k


def test_quant_configs(glm5_ckpt):
    hq = json.loads((glm5_ckpt / "hf_quant_config.json").read_text())
    assert hq["producer"]["name"] == "modelopt"
    q = hq["quantization"]
    assert (q["quant_algo"], q["group_size"]) == ("NVFP4", 16)
    cfg = json.loads((glm5_ckpt / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert (qc["quant_method"], qc["quant_algo"]) == ("modelopt", "NVFP4")
    assert sorted(qc["ignore"]) == sorted(q["exclude_modules"])
    excl = q["exclude_modules"]
    assert "lm_head" in excl and "model.layers.0*" in excl  # dense layer 0
    for layer in range(1, cfg["num_hidden_layers"]):
        assert (
            f"model.layers.{layer}.self_attn*" in excl and f"model.layers.{layer}.mlp.gate" in excl
        )
    assert not any("experts" in x for x in excl)


def test_transformers_reads_config(glm5_ckpt):
    from transformers import AutoConfig, GlmMoeDsaConfig

    cfg = AutoConfig.from_pretrained(glm5_ckpt)
    assert isinstance(cfg, GlmMoeDsaConfig) and cfg.model_type == "glm_moe_dsa"
    assert cfg.architectures == ["GlmMoeDsaForCausalLM"]
    assert (cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok) == (256, 16, 4)
    assert (cfg.moe_intermediate_size, cfg.num_hidden_layers, cfg.first_k_dense_replace) == (
        128,
        4,
        1,
    )
    assert cfg.n_shared_experts == 1 and cfg.topk_method == "noaux_tc"


def test_expert_bytes_match_our_codec(glm5_ckpt, ckpt_seed):
    # Rebuild the same bf16 model and quantize every expert with our codec: the bytes ModelOpt's
    # export wrote must come out exactly (ModelOpt shares one global scale for gate and up).
    model = ck.build_tiny_model("glm_moe_dsa", ckpt_seed)
    t = ck.read_checkpoint(glm5_ckpt)
    n_checked = 0
    for layer in (1, 2, 3):
        mlp = model.model.layers[layer].mlp
        gu, down = mlp.experts.gate_up_proj.detach(), mlp.experts.down_proj.detach()
        i = gu.shape[1] // 2
        sh = mlp.shared_experts
        experts = [(f"experts.{e}", gu[e, :i], gu[e, i:], down[e]) for e in range(gu.shape[0])]
        experts.append(("shared_experts", sh.gate_proj.weight, sh.up_proj.weight,
                        sh.down_proj.weight))  # fmt: skip
        in_scales = set()
        for name, gate, up, dn in experts:
            p = f"model.layers.{layer}.mlp.{name}"
            gs_gu = weight_global_scale(torch.cat([gate, up]).detach())
            for proj, w, gs in (("gate_proj", gate, gs_gu), ("up_proj", up, gs_gu),
                                ("down_proj", dn, weight_global_scale(dn.detach()))):  # fmt: skip
                ws2 = t[f"{p}.{proj}.weight_scale_2"]
                assert ws2 == gs, f"{p}.{proj}: weight_scale_2 {ws2} vs amax/2688 {gs}"
                packed, bs, _ = quantize_nvfp4(w.detach().to(torch.bfloat16), ws2)
                assert torch.equal(packed, t[f"{p}.{proj}.weight"]), f"{p}.{proj}.weight"
                assert torch.equal(
                    bs.view(torch.uint8), t[f"{p}.{proj}.weight_scale"].view(torch.uint8)
                )
                n_checked += 1
            if name != "shared_experts":
                in_scales.add((t[f"{p}.gate_proj.input_scale"].item(),
                               t[f"{p}.down_proj.input_scale"].item()))  # fmt: skip
        # One activation quantizer per fused-experts module: every routed expert shares it.
        assert len(in_scales) == 1 and all(s > 0 for s in in_scales.pop())
    assert n_checked == 3 * 17 * 3


def test_load_moe_weights_and_reference(glm5_ckpt, ckpt_seed):
    layers = ck.load_moe_weights(glm5_ckpt, include_shared=True)
    assert sorted(layers) == [1, 2, 3]
    w = layers[2]
    assert (w.num_experts, w.hidden_size, w.intermediate_size) == (17, 256, 128)
    assert w.w13_input_scale.shape == (17,) and w.w13_scale_2.shape == (17, 2)
    # The dequantized checkpoint is the original bf16 model to NVFP4 accuracy (~10% RMS).
    mlp = ck.build_tiny_model("glm_moe_dsa", ckpt_seed).model.layers[2].mlp
    w13, w2 = w.dequantize()
    assert_close(w13[:16], mlp.experts.gate_up_proj.detach(), max_rel=0.2, rms_rel=0.15, what="w13")
    assert_close(w2[16], mlp.shared_experts.down_proj.weight.detach(), max_rel=0.2, rms_rel=0.15,
                 what="shared w2")  # fmt: skip
    # The reference MoE runs on it (top-4 routed + fused shared expert = k 5).
    x = torch.randn(6, 256, dtype=torch.bfloat16)
    ids = torch.cat([torch.stack([torch.randperm(16)[:4] for _ in range(6)]),
                     torch.full((6, 1), 16)], dim=1).to(torch.int32)  # fmt: skip
    out = fused_moe_nvfp4_torch(x, w, ids, torch.rand(6, 5), quantize_activations=True)
    assert torch.isfinite(out).all() and out.abs().max() > 0
    assert set(ck.load_moe_weights(glm5_ckpt)[1].w13.shape) == {16, 256, 128}


def test_bf16_shared_expert_option(tmp_path, ckpt_seed):
    d = ck.make_tiny_checkpoint(tmp_path, "glm_moe_dsa", ckpt_seed, quantize_shared_experts=False,
                                n_routed_experts=8, num_hidden_layers=2)  # fmt: skip
    t = ck.read_checkpoint(d)
    assert t["model.layers.1.mlp.shared_experts.up_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.1.mlp.shared_experts.up_proj.weight_scale" not in t
    assert t["model.layers.1.mlp.experts.7.up_proj.weight"].dtype == torch.uint8
    assert any("shared_experts" in x for x in json.loads((d / "config.json").read_text())
               ["quantization_config"]["ignore"])  # fmt: skip
    with pytest.raises(KeyError, match="shared_experts"):
        ck.load_moe_weights(d, include_shared=True)
    assert ck.load_moe_weights(d)[1].num_experts == 8


@pytest.mark.parametrize("arch", ["glm4_moe", "deepseek_v3"])
def test_other_architectures(tmp_path, arch, ckpt_seed):
    from transformers import AutoConfig

    d = ck.make_tiny_checkpoint(tmp_path, arch, ckpt_seed)
    cfg = AutoConfig.from_pretrained(d)
    assert cfg.model_type == arch and cfg.architectures == [ck.ARCHITECTURES[arch]]
    if arch == "deepseek_v3":
        assert cfg.rope_parameters["rope_type"] == "yarn"  # SGLang's CPU rope path needs one
        assert (cfg.n_group, cfg.topk_group) == (4, 2)  # grouped routing, as DeepSeek-V3's 8/4
    t = ck.read_checkpoint(d)
    for e in (0, 15):
        for proj, (n, k) in zip(PROJ, [(128, 256), (128, 256), (256, 128)], strict=True):
            p = f"model.layers.3.mlp.experts.{e}.{proj}"
            assert (t[f"{p}.weight"].dtype, tuple(t[f"{p}.weight"].shape)) == (
                torch.uint8,
                (n, k // 2),
            )
            assert tuple(t[f"{p}.weight_scale"].shape) == (n, k // 16)
            assert t[f"{p}.weight_scale_2"].shape == () and t[f"{p}.input_scale"].shape == ()
    quantized = {k.rsplit(".", 1)[0] for k, v in t.items() if v.dtype == torch.uint8}
    assert all(".mlp.experts." in k or ".mlp.shared_experts." in k for k in quantized)
    assert len(ck.load_moe_weights(d)) == 3


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown arch"):
        ck.tiny_config("llama")
    with pytest.raises(ValueError, match="multiple of 16"):
        ck.make_tiny_checkpoint(tmp_path, "glm_moe_dsa", 0, moe_intermediate_size=120)
    with pytest.raises(FileNotFoundError):
        ck.read_checkpoint(tmp_path)


@pytest.mark.sglang
def test_sglang_parses_quant_config(glm5_ckpt):
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    cfg = json.loads((glm5_ckpt / "config.json").read_text())
    q = ModelOptFp4Config.from_config(cfg["quantization_config"])
    assert isinstance(q, ModelOptFp4Config) and q.group_size == 16
    assert q.can_fuse_shared_expert()  # the shared expert is NVFP4 here
    for prefix, excluded in [
        ("model.layers.1.self_attn.q_a_proj", True),
        ("model.layers.2.self_attn.indexer.wk", True),
        ("model.layers.0.mlp.gate_proj", True),
        ("model.layers.1.mlp.gate", True),
        ("lm_head", True),
        ("model.layers.1.mlp.experts", False),
        ("model.layers.3.mlp.shared_experts.down_proj", False),
    ]:
        assert q.is_layer_excluded(prefix) == excluded, prefix


@pytest.fixture(scope="module")
def nvidia_ckpt(tmp_path_factory, ckpt_seed):
    return ck.make_tiny_checkpoint(tmp_path_factory.mktemp("nvidia"), "glm_moe_dsa", ckpt_seed,
                                   n_routed_experts=8, num_hidden_layers=2,
                                   **ck.NVIDIA_LAYOUT)  # fmt: skip


def test_nvidia_layout_mtp_layer(nvidia_ckpt, tmp_path):
    """``NVIDIA_LAYOUT``: the MTP layer (index ``num_hidden_layers``) in bf16, shaped like the
    last MoE layer, in one more shard of the index, and excluded in both quantization configs,
    whose lists are then NVIDIA's (``tests/test_shared_fusion.nvidia_exclusions``)."""
    from tests.test_shared_fusion import nvidia_exclusions

    d = nvidia_ckpt
    cfg = json.loads((d / "config.json").read_text())
    want = nvidia_exclusions(cfg, quantize_shared=False)
    assert sorted(cfg["quantization_config"]["ignore"]) == sorted(want)
    hq = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    assert sorted(hq["exclude_modules"]) == sorted(want)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
    assert sorted(set(index["weight_map"].values())) == shards
    assert all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards), shards
    t = ck.read_checkpoint(d)
    assert set(index["weight_map"]) == set(t)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in t.values())
    layer = {i: {k.removeprefix(f"model.layers.{i}."): v for k, v in t.items()
                 if k.startswith(f"model.layers.{i}.")} for i in (1, 2)}  # fmt: skip
    mtp, last = layer[2], layer[1]
    # The decoder part: every tensor of the last layer, NVFP4 ones as bf16 [N, K], scales dropped.
    decoder = {k: v for k, v in last.items() if not k.endswith(("_scale", "_scale_2"))}
    assert set(mtp) == set(decoder) | {"enorm.weight", "hnorm.weight", "eh_proj.weight",
                                       "shared_head.norm.weight"}  # fmt: skip
    for k, v in decoder.items():
        shape = (v.shape[0], 2 * v.shape[1]) if v.dtype == torch.uint8 else tuple(v.shape)
        assert tuple(mtp[k].shape) == shape, k
        assert mtp[k].dtype == (torch.float32 if "correction_bias" in k else torch.bfloat16), k
    assert tuple(mtp["eh_proj.weight"].shape) == (256, 512)
    assert 0.5 < float(mtp["mlp.experts.7.down_proj.weight"].float().std() * 128**0.5) < 1.5
    # The target's tensors are still ModelOpt's: routed experts NVFP4, shared expert bf16.
    assert last["mlp.experts.7.up_proj.weight"].dtype == torch.uint8
    assert last["mlp.shared_experts.up_proj.weight"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="num_nextn_predict_layers=1"):
        ck.make_tiny_checkpoint(tmp_path, "glm4_moe", 0, mtp=True, num_nextn_predict_layers=2)


@pytest.mark.sglang
def test_sglang_keeps_the_mtp_layer_and_the_shared_expert_unquantized(nvidia_ckpt):
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    cfg = json.loads((nvidia_ckpt / "config.json").read_text())
    q = ModelOptFp4Config.from_config(cfg["quantization_config"])
    assert not q.can_fuse_shared_expert()  # the shared expert is bf16
    for prefix, excluded in [
        ("model.layers.2.mlp.experts", True),  # MTP layer
        ("model.layers.2.self_attn.fused_qkv_a_proj_with_mqa", True),
        ("model.layers.2.eh_proj", True),
        ("model.layers.1.mlp.shared_experts.gate_up_proj", True),
        ("model.layers.1.self_attn.indexer.wk", True),
        ("model.layers.1.mlp.experts", False),
    ]:
        assert q.is_layer_excluded(prefix) == excluded, prefix
