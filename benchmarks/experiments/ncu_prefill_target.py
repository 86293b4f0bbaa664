"""Nsight Compute target: three eager prefill calls (the H200 table's config), GLM-5 TP8 or EP8,
T = argv[1]. ``benchmarks/results/ncu_prefill_tp8_4096_before_h200.txt`` came from (kernels of commit
adfc0cf)::

    ncu --clock-control none -k regex:_prefill_gemm --launch-skip 4 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \\
        --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis python benchmarks/experiments/ncu_prefill_target.py 4096 [ep8]
"""
import sys

import torch

from sglang_fp4ext.bench import GLM5_EP8, GLM5_TP8, random_packed_weights, uniform_routing
from sglang_fp4ext.moe.fused_moe import PreparedMoEWeights
from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill

T = int(sys.argv[1])
bs = GLM5_EP8 if sys.argv[2:] == ["ep8"] else GLM5_TP8
gen = torch.Generator(device="cuda").manual_seed(1)
prep = PreparedMoEWeights.from_moe_weights(
    random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen)
)
ids, tw, _ = uniform_routing(T, bs, device="cuda", generator=gen)
x = torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16)
for _ in range(3):
    fused_moe_nvfp4_prefill(x, prep, ids, tw)
torch.cuda.synchronize()
