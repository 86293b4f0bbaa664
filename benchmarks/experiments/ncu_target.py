"""Nsight Compute target: three eager MoE calls with the card's table config, T = argv[1]; GLM-5
TP8, or EP8 with ``ep8``; the decode path, or the prefill path with ``prefill``. Decode:
``decode_ncu.sh`` (``benchmarks/results/decode_ncu/ncu_decode_*_h200.txt``). Prefill, as
``benchmarks/results/prefill_msub2/ncu_gemm1_tp8_4096_h200.txt`` was made:

``ncu --clock-control none -k regex:_wgmma_gemm1 --launch-skip 2 --launch-count 2 --set full
--import-source yes -o /tmp/g1 python benchmarks/experiments/ncu_target.py 4096 prefill``
(``_wgmma_gemm2 --launch-skip 1 --launch-count 1`` for GEMM2; append ``ep8`` for EP8).
``NCU_KNOBS`` (a Python literal dict) replaces fields of the prefill call's config (the table's
or the heuristic's); ``NCU_DECODE`` (a ``DecodeConfig`` family's repr, e.g.
``CoopDecodeConfig(block_n1=32)``) is the decode call's config.
"""

import ast
import dataclasses
import os
import sys

import torch

from sglang_fp4ext.bench import random_packed_weights
from sglang_fp4ext.bench.layer import make_routing
from sglang_fp4ext.model_shapes import preset
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.prefill.launch import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prepared import PreparedMoEWeights

T = int(sys.argv[1])
bs = preset("glm5-ep8" if "ep8" in sys.argv[2:] else "glm5-tp8")
call = fused_moe_nvfp4_prefill if "prefill" in sys.argv[2:] else fused_moe_nvfp4
gen = torch.Generator(device="cuda").manual_seed(1)
prep = PreparedMoEWeights.from_moe_weights(
    random_packed_weights(bs.E_local, bs.hidden, bs.I_local, device="cuda", generator=gen), bs.ep
)
ids, tw, _ = make_routing(bs, T, device="cuda", generator=gen)
x = torch.randn(T, bs.hidden, device="cuda", generator=gen).to(torch.bfloat16)
kw = {}
if os.environ.get("NCU_KNOBS") and call is fused_moe_nvfp4_prefill:
    from sglang_fp4ext.moe.shape import current_target
    from sglang_fp4ext.moe.tables import prefill_config_for

    base = prefill_config_for(T, prep.shape(ids.shape[1]), current_target())
    kw["config"] = dataclasses.replace(base, **ast.literal_eval(os.environ["NCU_KNOBS"]))
    print("ncu_target config:", kw["config"], flush=True)
if os.environ.get("NCU_DECODE") and call is fused_moe_nvfp4:
    from sglang_fp4ext.moe.decode import config as decode_config

    kw["config"] = eval(os.environ["NCU_DECODE"], vars(decode_config))
    print("ncu_target config:", kw["config"], flush=True)
for _ in range(3):
    call(x, prep, ids, tw, **kw)
torch.cuda.synchronize()
