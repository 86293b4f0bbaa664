#!/bin/bash
# #15 decode step 8: SGLang 0.5.23's Marlin NVFP4 MoE next to fp4ext at GLM-5 TP8 (T = TS, default
# 1,2,4) in the Marlin harness's own process, with the shipped table (.peers carried).
# Usage (device, repository root): bash benchmarks/experiments/decode_kstack_peers.sh  (~1.5 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
timeout 150 bash .peers/marlin/device_run.sh --out $R/marlin_${TAG:-after} --shapes glm5_tp8 \
  --ts ${TS:-1,2,4} --profile-ts '' > $R/marlin_${TAG:-after}.log 2>&1
echo rc=$? >> $R/marlin_${TAG:-after}.log
tar czf $OUT/results.tar.gz -C $R .
python - $R/marlin_${TAG:-after}/marlin_peer.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["shape"], r["T"], "fp4ext", round(r["fp4ext_us"], 1), "(%.0f%% BW)" % r["fp4ext_pct_bw"],
          "marlin", round(r["marlin_us"], 1), "marlin/fp4ext", round(r["marlin_over_fp4ext"], 2),
          "rms", "%.2e" % r["fp4ext_rms_rel"], "ok", r["fp4ext_ok"])
for e in d.get("errors", []):
    print("error", str(e)[:300])
PY
