#!/bin/bash
# #15: where GLM-5 decode time goes at T = 16..256 (Marlin was 5% faster at TP8 T = 128 / 256 on
# the H100), on the card's own table, one call (~5 min):
#   1. per-kernel device times (torch.profiler) of the served config, TP8 and EP8, T = 16..256
#      (gluon_decode_ab.py --sweep none --split);
#   2. Nsight Compute (full set, SASS source counters) of TP8 T = 128 and 256 (decode_ncu.sh);
#   3. the GPU test written in step 9 and not yet run (GEMM1's split_t beside the token GEMM2).
# Usage (device, repository root): bash benchmarks/experiments/decode_large_t_diag.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $OUT/diag.log
echo "== split $(date +%T)" >> $OUT/diag.log
timeout 120 python benchmarks/experiments/gluon_decode_ab.py --sweep none --v1-table shipped \
  --split --tokens 16,32,64,128,256 --shapes glm5_tp8,glm5_ep8 --deadline-s 100 --out $OUT \
  >> $OUT/diag.log 2>&1
python - >> $OUT/diag.log 2>&1 <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/decode_split.json"))
for r in d["rows"]:
    c = r["configs"][0]
    k = {n: round(v, 1) for n, v in c.get("kernels_us", {}).items()}
    print(r["shape"], r["T"], f"{c.get('us', 0):.1f} us, floor {r['floor_us']:.1f}", k)
PY
echo "== ncu $(date +%T)" >> $OUT/diag.log
CASES="128:tp8 256:tp8" timeout 220 bash benchmarks/experiments/decode_ncu.sh > /dev/null 2>&1
echo "== split_t_beside $(date +%T)" >> $OUT/diag.log
timeout 120 python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py \
  -k split_t_beside > $OUT/split_t_beside.log 2>&1; echo rc=$? >> $OUT/split_t_beside.log
tail -2 $OUT/split_t_beside.log >> $OUT/diag.log
cat $OUT/diag.log $OUT/run.log
