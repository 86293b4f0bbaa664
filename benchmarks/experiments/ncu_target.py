"""Nsight Compute target: three eager decode calls, GLM-5 TP8, T = argv[1]. Used as
``ncu --clock-control none -k regex:_moe_gemm --launch-skip 2 --launch-count 2 --section SpeedOfLight
--section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats
--section MemoryWorkloadAnalysis python benchmarks/experiments/ncu_target.py 16``."""
import torch, sys
from sglang_fp4ext.bench import GLM5_TP8, random_packed_weights, uniform_routing
from sglang_fp4ext.moe.fused_moe import PreparedMoEWeights, fused_moe_nvfp4
T = int(sys.argv[1])
gen = torch.Generator(device="cuda").manual_seed(1)
bs = GLM5_TP8
prep = PreparedMoEWeights.from_moe_weights(random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen))
ids, tw, _ = uniform_routing(T, bs, device="cuda", generator=gen)
x = torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16)
for _ in range(3):
    fused_moe_nvfp4(x, prep, ids, tw)
torch.cuda.synchronize()
