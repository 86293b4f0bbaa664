"""``fp4ext bench --project``'s small-T decode section (CPU tier): the occupancy arithmetic against
hand-computed cases, the projection and the b12x bytes against hand computations, the CLI with
``--measured`` on the committed H100 file (one compile: GLM-5 TP8 at T = 1 for sm_120), and the
errors for a bad GPU key or measured file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_fp4ext import hardware, target_info
from sglang_fp4ext.bench import decode_projection as D
from sglang_fp4ext.bench.bench_cli import main
from sglang_fp4ext.bench.target_resources import COOP_CONFIG, occupancy

ROOT = Path(__file__).resolve().parents[1]
COOP_AB = ROOT / "benchmarks" / "results" / "decode_coop_h100" / "coop_ab.json"
SM120 = target_info.sm_limits((12, 0))
PRO = hardware.spec_by_key("rtx-pro-6000-ws")


def test_sm120_limits_are_the_guides():
    assert (SM120.max_warps, SM120.max_threads, SM120.max_blocks) == (48, 1536, 32)
    assert (SM120.regs, SM120.smem_per_sm) == (65536, 100 * 1024)
    assert SM120.smem_per_block_optin == target_info.SM120_SMEM_PER_BLOCK == 101_376
    with pytest.raises(ValueError, match="7.5"):
        target_info.sm_limits((7, 5))


def test_occupancy_registers_limited():
    # 171 regs -> 5472 a warp -> 5632 (unit 256); 16384 a sub-partition holds 2 warps -> 8 warps
    # an SM: one 8-warp CTA.
    o = occupancy(SM120, 256, 171, 2048)
    assert o["ctas_per_sm_by_registers"] == 1 and o["ctas_per_sm"] == 1
    assert o["limited_by"] == ["registers"] and o["resident_warps_per_sm"] == 8
    assert o["occupancy"] == pytest.approx(8 / 48)
    # 128 regs on 16 warps: 4096 a warp, 4 a sub-partition, exactly the SM.
    assert occupancy(SM120, 512, 128, 4112)["ctas_per_sm"] == 1
    assert occupancy(SM120, 512, 129, 4112)["ctas_per_sm"] == 0  # does not fit at all


def test_occupancy_smem_limited():
    # 40,000 B + nothing else -> 40,064 (unit 128): 102400 // 40064 = 2 CTAs of 2 warps.
    o = occupancy(SM120, 64, 32, 40_000)
    assert o["ctas_per_sm_by_smem"] == 2 and o["ctas_per_sm"] == 2
    assert o["limited_by"] == ["shared memory"]
    # Over the 99 KB a CTA may opt into: no CTA at all.
    o = occupancy(SM120, 64, 32, 101_377)
    assert not o["smem_fits_per_block"] and o["ctas_per_sm"] == 0


def test_occupancy_threads_limited():
    # 32 regs, 1 KB: registers allow 64 warps; 48 warps an SM allow 1 CTA of 1024 threads.
    o = occupancy(SM120, 1024, 32, 1024)
    assert o["ctas_per_sm_by_warps"] == 1 and o["ctas_per_sm"] == 1
    assert o["limited_by"] == ["warps"] and o["resident_warps_per_sm"] == 32
    # Tiny CTAs: the 32-block cap.
    o = occupancy(SM120, 32, 16, 0)
    assert o["ctas_per_sm"] == 32 and o["limited_by"] == ["blocks"]


def _synthetic(tmp_path) -> Path:
    coop = {"block_n1": 32, "block_n2": 32, "block_p": 128, "block_t": 8, "gemm2": "tokens",
            "grid": "slots", "prefetch2": 0, "split_k1": 8, "split_k2": 1, "tiles2": 1,
            "warps1": 2, "warps2": 2}  # fmt: skip
    rows = [
        {"shape": "glm5_tp8", "T": 1, "floor_us": 5.0,
         "v1": {"config": {"grid": "slots"}, "us": 20.0, "pct_bw": 0.25},
         "configs": [{"config": coop, "us": 40.0, "pct_bw": 0.125},
                     {"config": dict(coop, prefetch2=1), "us": 50.0, "pct_bw": 0.1}]},
    ]  # fmt: skip
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"gpu": "Test GPU", "copy_bw_TBps": 2.0, "rows": rows}))
    return p


def test_projection_hand_computed(tmp_path):
    m = D.load_measured(_synthetic(tmp_path))
    # Bytes = fraction x copy bw x time = 0.25 x 2e12 x 20e-6 = 10 MB (= floor_us x copy bw).
    assert m["points"][0]["bytes"] == pytest.approx(10e6)
    d = D.project_decode(m, "glm5-tp8", [1, 2], PRO, COOP_CONFIG)
    served, coop = d["rows"]
    # 10e6 B / (1.792e12 B/s x 0.25) = 22.32 us; = 20 us x 2.0 / 1.792.
    assert served["projected_us"] == pytest.approx(10e6 / (1.792e12 * 0.25) * 1e6)
    assert served["projected_us"] == pytest.approx(20.0 * 2.0 / 1.792)
    assert served["target_floor_us"] == pytest.approx(10e6 / 1.792e12 * 1e6)
    # The coop row is the COOP_CONFIG point (prefetch2=0), not the prefetch2=1 one.
    assert coop["family"] == "coop" and coop["projected_us"] == pytest.approx(40.0 * 2.0 / 1.792)
    assert d["missing"] == ["served T=2", "coop T=2"]
    assert served["label"].startswith("PROJECTION (not measured)")
    assert "measured on Test GPU" in served["label"] and "not modelled" in served["label"]


def test_b12x_bytes():
    pts = {b.name: b for b in D.B12X_POINTS}
    qwen = next(b for n, b in pts.items() if n.startswith("Qwen"))
    # 8 experts x (3 x 2048 x 512 x 9/16 + 12) + bf16 in and out (2 x 2048 x 2) = 14.16 MB.
    assert qwen.nbytes() == 8 * (3 * 2048 * 512 * 9 // 16 + 12) + 2 * 2048 * 2
    assert qwen.nbytes() / 1.792e12 * 1e6 == pytest.approx(7.9, abs=0.05)  # the cited floor
    one, two = (b for n, b in pts.items() if n.startswith("DeepSeek"))
    assert one.nbytes() == 6 * (3 * 4096 * 1024 * 9 // 16 + 12) + 2 * 4096 * 2
    assert two.nbytes() == 6 * (3 * 4096 * 512 * 9 // 16 + 12) + 2 * 4096 * 2
    rows = D.b12x_comparison(None, PRO, COOP_CONFIG)
    assert all(r["fp4ext"] == {} for r in rows)
    assert rows[0]["b12x_fraction_of_spec_bw"] > 1 and rows[0]["note"]  # I=1024 cannot be right
    assert rows[2]["b12x_fraction_of_spec_bw"] == pytest.approx(qwen.nbytes() / 27.7e-6 / 1.792e12)


@pytest.mark.skipif(target_info.has_cuda_gpu(), reason="CPU path: this machine has a GPU")
def test_cli_measured_writes_the_section(tmp_path, capsys):
    rc = main(["--project", "rtx-pro-6000-ws", "--tokens", "1", "--no-interpreter", "--seed", "1",
               "--measured", str(COOP_AB), "--out", str(tmp_path), "--name", "p"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    sec = json.loads((tmp_path / "p.json").read_text())["projection"]["target_decode"]
    kernels = [(r["family"], r["kernel"]) for r in sec["resources"]["rows"]]
    assert ("coop", "_coop") in kernels and any(f == "served" for f, _ in kernels)
    for r in sec["resources"]["rows"]:
        assert r["error"] is None and r["registers"] > 0 and r["shared_bytes"] <= 101_376, r
    [coop] = [r for r in sec["resources"]["rows"] if r["family"] == "coop"]
    assert coop["grid"] == [188] and coop["cooperative"] and coop["co_resident"]
    fams = {r["family"]: r for r in sec["decode"]["rows"]}
    assert set(fams) == {"served", "coop"} and all(r["T"] == 1 for r in fams.values())
    # H100 TP8 T = 1, shipped decode, 19.17 us: the same fraction of a copy bandwidth that is the
    # same share of each GPU's spec, so x H100 spec / RTX PRO 6000 spec.
    doc = json.loads(COOP_AB.read_text())
    h100 = hardware.spec_for_device_name(doc["gpu"])
    expect = doc["rows"][0]["v1"]["us"] * h100.mem_bandwidth_Bps / PRO.mem_bandwidth_Bps
    assert fams["served"]["projected_us"] == pytest.approx(expect)
    assert "PROJECTION (not measured)" in out and "Static resources on" in out
    assert len(sec["b12x"]) == 3 and all(b["fp4ext"] for b in sec["b12x"])


def test_cli_bad_project_or_measured(tmp_path, capsys):
    assert main(["--project", "rtx-9999", "--out", str(tmp_path)]) == 2
    assert "no GPU 'rtx-9999' in the hardware table" in capsys.readouterr().err
    assert main(["--measured", str(COOP_AB), "--out", str(tmp_path)]) == 2
    assert "--measured needs --project" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    for text, what in (("{", "not a JSON document"), ('{"gpu": "x", "rows": []}', "copy_bw_TBps"),
                       ('{"gpu": "x", "copy_bw_TBps": 2, "rows": [{"shape": "a", "T": 1}]}',
                        "rows[0]: missing 'v1'")):  # fmt: skip
        bad.write_text(text)
        argv = ["--project", "rtx-pro-6000-ws", "--measured", str(bad), "--out", str(tmp_path)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert what in err and str(bad) in err, err
    assert main(["--project", "rtx-pro-6000-ws", "--measured", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png"))
