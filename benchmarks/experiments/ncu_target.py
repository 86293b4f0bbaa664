"""Nsight Compute target: three eager MoE calls with the H200 table's config, T = argv[1]; GLM-5
TP8, or EP8 with ``ep8``; the decode path, or the prefill path with ``prefill``. Used as

``ncu --clock-control none -k regex:_moe_gemm --launch-skip 2 --launch-count 2 --section SpeedOfLight
--section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats
--section MemoryWorkloadAnalysis python benchmarks/experiments/ncu_target.py 16`` (decode,
``decode_diagnosis_h200.json``) and, with ``-k regex:_prefill_gemm --launch-skip 4`` plus
``--section InstructionStats --section ComputeWorkloadAnalysis`` and ``4096 prefill``,
``benchmarks/results/ncu_prefill_tp8_4096_before_h200.txt`` (prefill kernels of commit adfc0cf).
``NCU_KNOBS`` (a Python literal dict) replaces fields of the prefill call's config (the H200
table's or the heuristic's), e.g. ``NCU_KNOBS="{'static_ring1': 1}"``.
"""
import ast
import dataclasses
import os
import sys

import torch

from sglang_fp4ext.bench import GLM5_EP8, GLM5_TP8, random_packed_weights, uniform_routing
from sglang_fp4ext.moe.decode import fused_moe_nvfp4
from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prepared import PreparedMoEWeights

T = int(sys.argv[1])
bs = GLM5_EP8 if "ep8" in sys.argv[2:] else GLM5_TP8
call = fused_moe_nvfp4_prefill if "prefill" in sys.argv[2:] else fused_moe_nvfp4
gen = torch.Generator(device="cuda").manual_seed(1)
prep = PreparedMoEWeights.from_moe_weights(
    random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen), bs.ep
)
ids, tw, _ = uniform_routing(T, bs, device="cuda", generator=gen)
x = torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16)
kw = {}
if os.environ.get("NCU_KNOBS") and call is fused_moe_nvfp4_prefill:
    from sglang_fp4ext.moe.config import prefill_config_for
    from sglang_fp4ext.moe.shape import current_target

    base = prefill_config_for(T, prep.shape(ids.shape[1]), current_target())
    kw["config"] = dataclasses.replace(base, **ast.literal_eval(os.environ["NCU_KNOBS"]))
    print("ncu_target config:", kw["config"], flush=True)
for _ in range(3):
    call(x, prep, ids, tw, **kw)
torch.cuda.synchronize()
