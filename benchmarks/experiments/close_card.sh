#!/bin/bash
# The closing measurements of the decode and prefill families on the card at hand, H200 or H100
# (whichever is lent), against that card's shipped table, in as many device calls as the PARTS
# need (each call's LIMIT, default 585 s; 2026-12-06's H200 run took four):
#   tune      `fp4ext tune` re-times GLM-5 TP8, TP8 + fused shared and EP8, buckets 1-256, every
#             candidate, the shipped table's entries as incumbents; the result replaces the
#             shipped table on the device for the parts after it (and comes back as table.json)
#   dtier     the decode GPU tier (tests/test_decode_gpu.py, 4 pytest-xdist workers; DTIER_K: a
#             pytest -k filter) and the self-check tier (every shipped config checked on this card)
#   dpeers    SGLang 0.5.23's Marlin NVFP4 MoE and OpenAI's triton_kernels next to fp4ext,
#             GLM-5 TP8 and EP8, T = 1..256 (.peers carried)
#   dab       v1 (tl.dot, benchmarks/results/NVIDIA_H200_v1_table.json) vs v2 (this card's
#             shipped table), GLM-5 TP8 and EP8, T = 1..256, same process
#   baseline  the pytest-benchmark regression baseline (GLM-5 TP8 + EP8, decode + prefill paths,
#             the torch bf16 peer), then the gate against it
#   ptier     the prefill GPU tier of the wgmma family as shipped (fp32 twin at T = 512-8192,
#             TP8 / EP8 / fused shared expert, graph replay, determinism, adversarial routings,
#             the shapes without a table)
#   pab       prefill v1 (tl.dot), v2 as shipped and torch bf16 in one process, T = 512-8192
#   ptk       triton_kernels next to fp4ext's prefill, same Ts (.peers carried)
#   caps      GEMM1 under its register caps (maxnreg1), T = 64-256
#   block     GLM-5's MoE block as SGLang runs it (router, routed experts, bf16 shared expert on
#             the alternate stream): fp4ext vs SGLang's Marlin, TP8 and EP8 (.peers carried)
#   coop      the one-launch family: its GPU tier (tests/test_coop_gpu.py), then its candidates
#             against the shipped config, GLM-5 TP8 and EP8, T = 1..16 (COOP_T)
#   phases    where the one-launch decode's time goes (coop_phases.py: per-program timestamps)
#   start     first start on this card with its shipped table hidden: tuning at start within
#             START_BUDGET (default 300 s, the `on` budget), its table against the shipped one
# AS_TABLE=path: that table (e.g. the H200's on an H100) serves as this card's, for the GPU tiers
# of a table whose card is not lent (timings then belong to this card, not the table's).
# Results: $OUT/run.log (summary) and $OUT/$PACK.tar.gz (every log and JSON).
# Usage (device, repository root): PARTS="dtier dab" bash benchmarks/experiments/close_card.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
PACK=${PACK:-close}
source benchmarks/experiments/device_steps.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >> $OUT/run.log
TABLE=$(python -c "import torch; from sglang_fp4ext.moe.tables import table_path
print(table_path(torch.cuda.get_device_name()))")
if [ -n "${AS_TABLE:-}" ]; then  # another card's table as this card's (a user table): its tiers
  python benchmarks/experiments/table_as_card.py /tmp/as_cfg --src $AS_TABLE >> $OUT/run.log 2>&1
  export SGLANG_FP4EXT_CONFIG_DIR=/tmp/as_cfg; TABLE=/tmp/as_cfg/$(basename $TABLE)
fi
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) CARD=h200 ;; *H100*) CARD=h100 ;; *) CARD=other ;;
esac
echo "card $CARD, table $TABLE" >> $OUT/run.log
PTS=${PTS:-512,1024,2048,4096,8192}

part_tune() {
step tune
python benchmarks/experiments/table_as_card.py /tmp/cfg --src $TABLE >> $OUT/run.log 2>&1
SGLANG_FP4EXT_CONFIG_DIR=/tmp/cfg timeout $(cap 330) python -m sglang_fp4ext tune \
  --preset glm5-tp8,glm5-tp8-fused-shared,glm5-ep8 --buckets 1,2,4,8,16,32,64,128,256 \
  --decode-max 256 --prefill-min 128 --budget-s ${BUDGET:-280} --out /tmp/cfg \
  --log $R/tune_log.json > $R/tune.log 2>&1
echo rc=$? >> $R/tune.log; grep "tune \|rc=" $R/tune.log | sed 's/check rms_rel.*ok; //' | cut -c1-200 >> $OUT/run.log
cp /tmp/cfg/$(basename $TABLE) $R/table.json && cp $R/table.json $TABLE; pack
}

part_dtier() {
step decode_tier
timeout $(cap 300) python -m pytest -p no:cacheprovider -q -m gpu -n ${WORKERS:-4} \
  tests/test_decode_gpu.py ${DTIER_K:+-k "$DTIER_K"} > $R/gpu_tier_decode.log 2>&1
echo rc=$? >> $R/gpu_tier_decode.log; grep "passed\|failed\|FAILED\|rc=" $R/gpu_tier_decode.log | tail -8 >> $OUT/run.log
timeout $(cap 150) python -m pytest -p no:cacheprovider -q -m gpu tests/test_selfcheck.py -s \
  > $R/gpu_tier_selfcheck.log 2>&1
echo rc=$? >> $R/gpu_tier_selfcheck.log
grep "passed\|failed\|self-check \|rc=" $R/gpu_tier_selfcheck.log | tail -5 >> $OUT/run.log
pack
}

part_dpeers() {
step marlin
timeout $(cap 120) bash .peers/marlin/device_run.sh --out $R/marlin --profile-ts '' > $R/marlin.log 2>&1
echo rc=$? >> $R/marlin.log; pack
grep "self-check FAILED" $R/marlin.log | cut -c1-200 >> $OUT/run.log
python benchmarks/experiments/marlin_rows.py $R/marlin/marlin_peer.json >> $OUT/run.log 2>&1
step tk
timeout $(cap 200) bash .peers/tk/device_run.sh --out $R/tk --timeout 95 --Ts 1,2,4,8,16,32,64,128,256 \
  > $R/tk.log 2>&1
echo rc=$? >> $R/tk.log; pack
grep -h "self-check FAILED" $R/tk/tk_glm5_*.log | cut -c1-200 >> $OUT/run.log
grep -h TIME $R/tk/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log
}

part_dab() {
step ab_v1_v2
timeout $(cap 170) python benchmarks/experiments/gluon_decode_ab.py --sweep table \
  --v1-table benchmarks/results/NVIDIA_H200_v1_table.json --v2-table $TABLE \
  --shapes glm5_tp8,glm5_ep8 --deadline-s 140 --out $R > $R/ab.log 2>&1
echo rc=$? >> $R/ab.log; grep "T=\|rc=" $R/ab.log >> $OUT/run.log; pack
}

part_baseline() {
step baseline
B="python -m pytest benchmarks -p no:cacheprovider -rs --fp4ext-rounds 10 \
  --benchmark-storage=file://$R/pb --benchmark-columns=min,median,max,rounds"
timeout $(cap 170) $B --fp4ext-presets glm5-tp8,glm5-ep8 --fp4ext-paths decode,prefill \
  --benchmark-save=$CARD-glm5 > $R/baseline.log 2>&1
echo rc=$? >> $R/baseline.log; tail -3 $R/baseline.log >> $OUT/run.log; pack
step gate
timeout $(cap 50) $B --fp4ext-presets glm5-tp8,glm5-ep8 --fp4ext-tokens 1,8,64,512,4096 \
  -k fp4ext-decode --benchmark-compare=0001 --benchmark-compare-fail=min:5% \
  --benchmark-json=$R/gate_normal.json > $R/gate.log 2>&1
echo rc=$? >> $R/gate.log; tail -2 $R/gate.log >> $OUT/run.log; pack
}

part_ptier() {
step prefill_tier
timeout $(cap 150) python -m pytest -p no:cacheprovider -q -m gpu tests/test_prefill_kernels.py \
  -k "wgmma and (glm5_vs_reference or graph_replay or deterministic or adversarial or other_shapes)" \
  > $R/gpu_tier_prefill.log 2>&1
echo rc=$? >> $R/gpu_tier_prefill.log; grep "passed\|failed\|FAILED\|rc=" $R/gpu_tier_prefill.log | tail -4 >> $OUT/run.log
pack
}

part_pab() {
step prefill_ab_v1_v2_bf16
OUT=$R AB_SHIPPED=1 AB_T=$PTS AB_PRESETS=glm5-tp8,glm5-ep8 AB_NAME=prefill_close_ab \
  timeout $(cap 220) python benchmarks/experiments/prefill_wgmma_ab.py > $R/prefill_ab.log 2>&1
echo rc=$? >> $R/prefill_ab.log; sed -n '/bf16 matmul/,$p' $R/prefill_ab.log >> $OUT/run.log; pack
}

part_ptk() {
step prefill_tk
timeout $(cap 240) bash .peers/tk/device_run.sh --out $R/ptk --timeout 110 --Ts $PTS > $R/ptk.log 2>&1
echo rc=$? >> $R/ptk.log; grep -h TIME $R/ptk/tk_glm5_*.log | cut -c1-150 >> $OUT/run.log; pack
}

part_caps() {
step gemm1_caps
timeout $(cap 200) python benchmarks/experiments/gluon_decode_ab.py --sweep maxnreg \
  --v1-table shipped --tokens 64,128,256 --shapes glm5_tp8,glm5_ep8 --repeat 3 \
  --deadline-s $(( $(cap 200) - 30 )) --out $R > $R/maxnreg.log 2>&1
echo rc=$? >> $R/maxnreg.log; pack
python - "$R/maxnreg_ab.json" >> $OUT/run.log 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    base = r["configs"][0].get("us")
    print(r["shape"], r["T"], f"shipped {base:.1f} us;", " ".join(
        f"{c['config']['maxnreg1']}r/{c['config']['block_n1']}x{c['config']['warps1']}w "
        f"{c['us']:.1f}" if "us" in c else f"{c['config']['maxnreg1']}r err"
        for c in r["configs"][1:]))
PY
}

part_coop() {
step coop_tier
timeout $(cap 240) python -m pytest -p no:cacheprovider -q -m gpu -n 4 tests/test_coop_gpu.py \
  ${COOP_K:+-k "$COOP_K"} > $R/gpu_tier_coop.log 2>&1
echo rc=$? >> $R/gpu_tier_coop.log; grep "passed\|failed\|FAILED\|Error\|rc=" $R/gpu_tier_coop.log | tail -8 >> $OUT/run.log
pack
step coop_ab
timeout $(cap 200) python benchmarks/experiments/gluon_decode_ab.py --sweep coop \
  --v1-table shipped --tokens ${COOP_T:-1,2,4,8,16} --shapes glm5_tp8,glm5_ep8 --repeat 3 \
  --deadline-s $(( $(cap 200) - 40 )) --out $R > $R/coop.log 2>&1
echo rc=$? >> $R/coop.log; pack
python - "$R/coop_ab.json" >> $OUT/run.log 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["gpu"], "copy", round(d["copy_bw_TBps"], 2), "TB/s")
for r in d["rows"]:
    c0 = r["configs"][0]
    print(r["shape"], r["T"], f"floor {r['floor_us']:.1f} shipped {c0.get('us', -1):.1f};", " | ".join(
        f"{c['config'].get('split_k1')}x{c['config'].get('warps1')}/{c['config'].get('block_n2')}"
        f"p{c['config'].get('prefetch2', '-')}{'' if 'prefetch2' in c['config'] else '(2L)'} "
        + (f"{c['us']:.1f} {c['rms_rel']:.1e}" if "us" in c else c.get("error", "err")[:90])
        for c in r["configs"][1:]))
PY
}

part_block() {
step block
M=.peers/marlin; SITE=/tmp/marlin_peer_site
python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE \
  $M/whl/*.whl > $R/block.log 2>&1
PYTHONPATH=$M/sgl_min:$SITE:. SGLANG_JIT_CACHE_DIR=/tmp/marlin_peer_jit timeout $(cap 420) \
  python benchmarks/experiments/block_marlin.py --out $R ${BLOCK_T:+--tokens $BLOCK_T} >> $R/block.log 2>&1
echo rc=$? >> $R/block.log; grep " T=\|rc=\|Error" $R/block.log | cut -c1-230 >> $OUT/run.log; pack
timeout $(cap 90) python -m sglang_fp4ext bench --block --preset glm5-ep8 --tokens 1,8 --replays 10 \
  --out $R > $R/bench_block_cli.log 2>&1
echo rc=$? >> $R/bench_block_cli.log; tail -6 $R/bench_block_cli.log | cut -c1-200 >> $OUT/run.log; pack
}

part_phases() {
step coop_phases
timeout $(cap 200) python benchmarks/experiments/coop_phases.py --out $R > $R/coop_phases.log 2>&1
echo rc=$? >> $R/coop_phases.log; pack
python - "$R/coop_phases.json" >> $OUT/run.log 2>&1 <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(f"{r['case']:<40} 1L {r['events_one_launch_us']:.1f} 2L {r['events_two_launches_us']:.1f}"
          f" span {r['span_us']:.1f} g1 {r['gemm1_max_us']:.1f} g2 {r['gemm2_max_us']:.1f}"
          f" g2first {r['gemm2_first_item_median_us']:.1f} diff {r['max_abs_vs_two_launches']:.1e}")
PY
}

part_start() {
step first_start
FP4EXT_RESULTS_DIR=$R/first_start FP4EXT_START_BUDGET_S=${START_BUDGET:-300} timeout $(cap 480) \
  python -m pytest -p no:cacheprovider -q -s -m gpu tests/test_start_tune.py \
  -k first_start_on_the_gpu > $R/first_start.log 2>&1
echo rc=$? >> $R/first_start.log; pack
grep "passed\|failed\|rc=\|Error" $R/first_start.log | tail -4 | cut -c1-300 >> $OUT/run.log
python - $R/first_start/*.json >> $OUT/run.log 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("budget", d["budget_s"], "wall", d["wall_s"], " ".join(
    f"{r['bucket']}:{r['start'] / r['shipped']:.3f}" for r in d["buckets"]))
PY
}

for p in ${PARTS:-dtier dpeers dab}; do
  if [ "$(left)" -lt 30 ]; then echo "skipped $p: $(left) s left" >> $OUT/run.log; continue; fi
  part_$p
done
step done
cat $OUT/run.log
