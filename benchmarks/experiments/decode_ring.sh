#!/bin/bash
# #15, GEMM1's weight chunks through a shared-memory cp.async ring (KernelConfig.ring1) against
# the register queue (H200): the GPU tests of the ring first (bit-equal to the register queue,
# the fp32 twin, the decode tier's family "gluonr"), then `gluon_decode_ab.py --sweep ring` at
# GLM-5 TP8 and EP8 T = 1, 2, 4, 8 (shipped table's config vs ring1 2 / 4 / most, split-K
# around it; 3 interleaved timings each, per-kernel times of the baseline). ~7 min.
# Usage (device, repository root): bash benchmarks/experiments/decode_ring.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/results.tar.gz -C $R . ; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
echo "== tier_ring $(date +%T)" >> $OUT/run.log
timeout 220 python -m pytest -p no:cacheprovider -q -m gpu tests/test_decode_gpu.py -k "ring1 or gluonr" \
  > $R/tier_ring.log 2>&1; echo rc=$? >> $R/tier_ring.log; tail -3 $R/tier_ring.log >> $OUT/run.log; pack
echo "== sweep_ring $(date +%T)" >> $OUT/run.log
OUT=$R timeout 330 python benchmarks/experiments/gluon_decode_ab.py --sweep ring --v1-table shipped \
  --shapes glm5_ep8,glm5_tp8 --tokens 1,2,4,8 --repeat 3 --split --deadline-s 280 > $R/sweep_ring.log 2>&1
echo rc=$? >> $R/sweep_ring.log; pack
python - >> $OUT/run.log 2>&1 <<'PY'
import json
d = json.load(open("/tmp/r/ring_ab.json"))
print(d["gpu"], d["versions"], "copy", round(d["copy_bw_TBps"], 2), "TB/s")
for r in d["rows"]:
    print(r["shape"], "T", r["T"], "floor", round(r["floor_us"], 1))
    for c in r["configs"]:
        k = c["config"]
        print("   ring1 %d split_k1 %2d bn1 %3d" % (k["ring1"], k["split_k1"], k["block_n1"]),
              "us %.1f" % c["us"] if "us" in c else c.get("error", "?")[:80],
              "reps", [round(x, 1) for x in c.get("us_reps", [])], c.get("kernels_us", ""))
PY
cat $OUT/run.log
