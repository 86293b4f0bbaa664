#!/bin/bash
# #15: GEMM1 under a register cap (KernelConfig.maxnreg1) at T = 64-256, where Nsight Compute on
# the H100 showed it at 4-5 two-warp CTAs an SM (176-235 registers) waiting on its loads
# (decode_v2_step10/run1_h100_diag). One call (~3 min): the GPU tests of the cap and of the
# step-10 launcher fix (ring1 / l2_prefetch), then the sweep (medians of 3 interleaved timings).
# Usage (device, repository root): bash benchmarks/experiments/decode_maxnreg.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/run.log
timeout 150 python -m pytest -p no:cacheprovider -q -m gpu -n 4 tests/test_decode_gpu.py \
  -k "ring1_changes_no_bit or l2_prefetch_changes_no_bit or maxnreg1" > $OUT/tier_fix.log 2>&1
echo rc=$? >> $OUT/tier_fix.log; tail -3 $OUT/tier_fix.log >> $OUT/run.log
timeout ${SWEEP_S:-200} python benchmarks/experiments/gluon_decode_ab.py --sweep maxnreg \
  --v1-table shipped --tokens ${TOKENS:-64,128,256} --shapes glm5_tp8,glm5_ep8 --repeat 3 \
  --deadline-s $(( ${SWEEP_S:-200} - 30 )) --out $OUT > $OUT/maxnreg.log 2>&1
echo rc=$? >> $OUT/maxnreg.log
python - >> $OUT/run.log 2>&1 <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/maxnreg_ab.json"))
for r in d["rows"]:
    base = r["configs"][0].get("us")
    print(r["shape"], r["T"], f"shipped {base:.1f} us;", " ".join(
        f"{c['config']['maxnreg1']}r/{c['config']['block_n1']}x{c['config']['warps1']}w "
        f"{c['us']:.1f}" if "us" in c else f"{c['config']['maxnreg1']}r err"
        for c in r["configs"][1:]))
PY
cat $OUT/run.log
