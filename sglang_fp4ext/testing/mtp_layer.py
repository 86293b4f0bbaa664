"""The MTP (NextN) layer NVIDIA's GLM-5.x-NVFP4 checkpoints ship unquantized, appended to a tiny
exported checkpoint (``checkpoint.make_tiny_checkpoint(..., mtp=True)``): ModelOpt's export writes
none, because ``transformers`` builds no MTP layer. The layer is ``model.layers.{n}`` (``n`` =
``num_hidden_layers``), bf16, shaped like the last MoE layer, in a shard of its own, and named in
both exclusion lists.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["append_mtp_layer"]


def _mtp_tensors(template: dict[str, torch.Tensor], cfg, seed: int) -> dict[str, torch.Tensor]:
    """The bf16 MTP layer ``model.layers.{n}``: the MTP-only tensors and a decoder layer shaped
    like ``template`` (the last layer's tensors, names relative to the layer), its NVFP4 weights
    as bf16 ``[N, 2 * K/2]``; seeded like ``build_tiny_model`` (N(0, 1/fan_in), norms 1)."""
    n, h = cfg.num_hidden_layers, cfg.hidden_size
    g = torch.Generator().manual_seed(seed + 2)
    shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
        "enorm.weight": (torch.bfloat16, (h,)),
        "hnorm.weight": (torch.bfloat16, (h,)),
        "eh_proj.weight": (torch.bfloat16, (h, 2 * h)),
        "shared_head.norm.weight": (torch.bfloat16, (h,)),
    }
    for name, t in sorted(template.items()):
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        if t.dtype == torch.uint8:  # NVFP4: two values a byte
            shapes[name] = (torch.bfloat16, (t.shape[0], 2 * t.shape[1]))
        else:
            shapes[name] = (t.dtype, tuple(t.shape))
    out = {}
    for name, (dtype, shape) in shapes.items():
        if len(shape) >= 2:
            v = torch.randn(shape, generator=g) * shape[-1] ** -0.5
        elif name.endswith("e_score_correction_bias"):
            v = torch.randn(shape, generator=g) * 0.05
        elif name.endswith(".bias") and "norm" not in name:
            v = torch.randn(shape, generator=g) * 0.02
        else:
            v = torch.zeros(shape) if name.endswith(".bias") else torch.ones(shape)
        out[f"model.layers.{n}.{name}"] = v.to(dtype)
    return out


def append_mtp_layer(out: Path, cfg, seed: int) -> None:
    """Add the MTP layer to an exported checkpoint: one more shard, the index and both exclusion
    lists (``config.json`` ``quantization_config.ignore``, ``hf_quant_config.json``)."""
    from safetensors.torch import load_file, save_file

    n = cfg.num_hidden_layers
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    wmap: dict[str, str] = index["weight_map"]
    last = f"model.layers.{n - 1}."
    if f"{last}mlp.experts.0.gate_proj.weight" not in wmap:
        raise ValueError(f"layer {n - 1} is not an MoE layer: no template for the MTP layer")
    template: dict[str, torch.Tensor] = {}
    for shard in sorted({s for k, s in wmap.items() if k.startswith(last)}):
        for k, t in load_file(str(out / shard)).items():
            if k.startswith(last):
                template[k.removeprefix(last)] = t
    mtp = _mtp_tensors(template, cfg, seed)
    shards = sorted(set(wmap.values()))
    total = len(shards) + 1
    renamed = {s: f"model-{i + 1:05d}-of-{total:05d}.safetensors" for i, s in enumerate(shards)}
    for old, new in renamed.items():
        (out / old).rename(out / new)
    mtp_shard = f"model-{total:05d}-of-{total:05d}.safetensors"
    save_file(mtp, str(out / mtp_shard), metadata={"format": "pt"})
    index["weight_map"] = {k: renamed[s] for k, s in wmap.items()} | dict.fromkeys(mtp, mtp_shard)
    meta = index.setdefault("metadata", {})
    meta["total_size"] = meta.get("total_size", 0) + sum(
        t.numel() * t.element_size() for t in mtp.values()
    )
    if "total_parameters" in meta:
        meta["total_parameters"] += sum(t.numel() for t in mtp.values())
    index_path.write_text(json.dumps(index, indent=2))
    glob = f"model.layers.{n}*"
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["ignore"].append(glob)
    (out / "config.json").write_text(json.dumps(config, indent=4))
    hf_quant = json.loads((out / "hf_quant_config.json").read_text())
    hf_quant["quantization"]["exclude_modules"].append(glob)
    (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4))
