"""Config tables v2 (``moe/tables.py``) and ``fp4ext tune`` (``tune.py``,
``tune_space.py``, ``tune_cli.py``), CPU tier.

Table round trip, v1 migration, user-directory precedence, strict errors naming file / shape /
bucket / field; the tuner's search space (deterministic, valid, capped, heuristic first); the
whole tuning flow at a tiny shape with the kernels under the Triton interpreter (a wall-clock
timer instead of graph replay; winners checked against the fp32 twin, table merged and
re-read by the dispatcher); the CLI's no-GPU exit.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import time
from pathlib import Path

import pytest
import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext import tune as TU
from sglang_fp4ext import tune_record as TR
from sglang_fp4ext.cli import main as cli_main
from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe import tune_space as TS
from sglang_fp4ext.moe.decode.config import DecodeConfig, DotDecodeConfig, GluonDecodeConfig
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.prefill.config import DotPrefillConfig, PrefillConfig
from sglang_fp4ext.moe.shape import MoEShape, Target
from sglang_fp4ext.moe.tables import TableEntry

H200 = Target("sm_90", "NVIDIA H200", 132)
PRO6000 = Target("sm_120", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 188)
A100 = Target("sm_80", "NVIDIA A100-SXM4-80GB", 108)
TP8 = MoEShape(256, 6144, 256, 8)
TP8_FUSED = MoEShape(257, 6144, 256, 9)
EP8 = MoEShape(32, 6144, 2048, 8)
SMALL = MoEShape(10, 272, 80, 9)
#: Decode at bucket 1 only, prefill from 2: one path per bucket in the CPU runs.
_D1_P2 = {"decode": (1, 1), "prefill": (2, 1 << 30)}


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path))
    C.clear_table_cache()
    yield tmp_path
    C.clear_table_cache()


def _doc():
    return C.table_document(
        "Test GPU",
        {
            EP8.key(): {
                1: TableEntry("decode", DotDecodeConfig(split_k1=4, gemm2="tokens", block_n2=32)),
                2048: TableEntry("prefill", DotPrefillConfig(block_m=64, stages1=2)),
            }
        },
        {"note": "test"},
    )


# ---- table format ----


def test_round_trip_and_lookup(user_dir):
    doc = _doc()
    path = user_dir / "Test_GPU.json"
    path.write_text(json.dumps(doc))
    dev, entries = C.read_table_file(path)
    assert dev == "Test GPU" and C.table_document(dev, entries, doc["meta"]) == doc
    tgt = Target("sm_90", "Test GPU", 132)
    assert C.select(1, EP8, tgt) == entries[EP8.key()][1]
    assert C.select(3000, EP8, tgt) == entries[EP8.key()][2048]  # beyond: largest (prefill)
    assert C.select(2, EP8, tgt).config == heuristic_config(2, EP8, tgt)  # gap: heuristic
    assert C.load_table("Test GPU") == {EP8.key(): {1: entries[EP8.key()][1].config}}


def test_v1_table_migrates_to_decode(user_dir):
    cfg = DotDecodeConfig(grid="experts", block_n1=128, split_k1=2)
    (user_dir / "Test_GPU.json").write_text(
        json.dumps({"device_name": "Test GPU", "shapes": {TP8.key(): {"16": cfg.to_dict()}}})
    )
    assert C.load_entries("Test GPU") == {TP8.key(): {16: TableEntry("decode", cfg)}}


def test_user_table_replaces_shipped_shape(user_dir):
    shipped = C.read_table_file(C.table_path("NVIDIA H200"))[1]  # the shipped file alone
    assert TP8.key() in shipped and EP8.key() in shipped
    mine = TableEntry("prefill", DotPrefillConfig(block_m=32))
    (user_dir / "NVIDIA_H200.json").write_text(
        json.dumps(C.table_document("NVIDIA H200", {TP8.key(): {64: mine}}))
    )
    C.clear_table_cache()
    got = C.load_entries("NVIDIA H200")
    assert got[TP8.key()] == {64: mine}  # whole shape replaced
    assert got[EP8.key()] == shipped[EP8.key()]  # other shapes still shipped
    assert C.select(64, TP8, H200) == mine


def test_default_user_dir(monkeypatch):
    monkeypatch.delenv(C.CONFIG_DIR_ENV, raising=False)
    assert C.user_config_dir() == Path("~/.cache/sglang_fp4ext/configs").expanduser()
    monkeypatch.setenv(C.CONFIG_DIR_ENV, "/x/y")
    assert C.user_table_path("NVIDIA H200").as_posix() == "/x/y/NVIDIA_H200.json"


def _mutate(doc, f):
    d = copy.deepcopy(doc)
    f(d)
    return d


def _bucket(d, b="1"):
    return d["shapes"][EP8.key()][b]


@pytest.mark.parametrize(
    "mutate,want",
    [
        (lambda d: d.update(version=3), "unknown table version 3"),
        (lambda d: d.update(version="2"), "unknown table version '2'"),
        (lambda d: d.update(extra=1), r"unknown top-level keys \['extra'\]"),
        (lambda d: d.pop("device_name"), "'device_name' must be a non-empty string"),
        (lambda d: d.update(shapes=[]), "'shapes' must be an object"),
        (lambda d: d["shapes"].update({"E=32,H=6144,I=2048": {}}), "shape key must look like"),
        (lambda d: d["shapes"].update({"E=32,H=6144,I=2048,top_k=8,x=1": {}}), "shape key"),
        (lambda d: d["shapes"][EP8.key()].update({"3": _bucket(d)}), r"bucket '3': bucket keys"),
        (lambda d: d["shapes"][EP8.key()].update({"01": _bucket(d)}), r"bucket '01'"),
        (lambda d: _bucket(d).update(path="fast"), r"bucket '1', field 'path': must be one of"),
        (lambda d: _bucket(d).pop("config"), r"bucket '1': a v2 bucket is"),
        (lambda d: _bucket(d)["config"].update(blockn1=64), r"bucket '1', field 'blockn1'"),
        (lambda d: _bucket(d)["config"].update(split_k1=4.0), r"field 'split_k1': must be int"),
        (lambda d: _bucket(d)["config"].update(stages1=True), r"field 'stages1': must be int"),
        (lambda d: _bucket(d)["config"].update(grid=1), r"field 'grid': must be str"),
        (
            lambda d: _bucket(d)["config"].update(split_k1=3),
            r"bucket '1': DotDecodeConfig.split_k1",
        ),
        (lambda d: _bucket(d, "2048").update(path="decode"), r"bucket '2048', field 'block_m'"),
        (lambda d: _bucket(d, "2048")["config"].update(combine="sum"), r"2048'.*combine"),
    ],
)
def test_malformed_tables_name_what_is_wrong(tmp_path, mutate, want):
    path = tmp_path / "Test_GPU.json"
    path.write_text(json.dumps(_mutate(_doc(), mutate)))
    with pytest.raises(C.ConfigTableError, match=want) as ei:
        C.read_table_file(path)
    assert str(path) in str(ei.value)


def test_malformed_table_fails_loudly_at_lookup(user_dir):
    (user_dir / "Test_GPU.json").write_text("{not json")
    with pytest.raises(C.ConfigTableError, match="Test_GPU.json: not valid JSON"):
        C.select(1, EP8, Target("sm_90", "Test GPU", 132))
    (user_dir / "Test_GPU.json").write_text(json.dumps(dict(_doc(), device_name="Other GPU")))
    C.clear_table_cache()
    with pytest.raises(C.ConfigTableError, match="does not match"):
        C.load_entries("Test GPU")


def test_shipped_tables_are_v2_and_complete():
    for path in sorted(C.SHIPPED_CONFIG_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        assert raw.get("version") == C.TABLE_VERSION, f"{path.name} is not a v2 table"
        dev, entries = C.read_table_file(path)
        assert C.table_path(dev) == path
        for key, buckets in entries.items():
            assert min(buckets) == 1 and set(buckets) == {1 << i for i in range(len(buckets))}


# ---- search space ----


@pytest.mark.parametrize("shape", [TP8, TP8_FUSED, EP8, SMALL], ids=["tp8", "fused", "ep8", "sm"])
@pytest.mark.parametrize("target", [H200, PRO6000, A100], ids=["h200", "pro6000", "a100"])
def test_search_space_is_deterministic_valid_and_small(shape, target):
    from sglang_fp4ext.moe.prefill.heuristic import prefill_heuristic_config

    for b in TU.DEFAULT_BUCKETS:
        space = TU.search_space(b, shape, target)
        assert space == TU.search_space(b, shape, target)
        assert bool(space["decode"]) == (b <= TS.DECODE_MAX_BUCKET)
        assert bool(space["prefill"]) == (b >= TS.PREFILL_MIN_BUCKET)
        for path, cls, heur in (
            ("decode", DecodeConfig, heuristic_config),
            ("prefill", PrefillConfig, prefill_heuristic_config),
        ):
            cands = space[path]
            assert len(cands) <= TS.MAX_CANDIDATES and len(set(cands)) == len(cands)
            for c in cands:
                assert isinstance(c, cls) and cls.from_dict(c.to_dict()) == c  # checks pass
            if cands:
                assert cands[0] == heur(b, shape, target)
                assert len(cands) >= 3, f"{path} b={b}: search space collapsed to {cands}"
                quick = TU.search_space(b, shape, target, limit=TS.QUICK_CANDIDATES)[path]
                assert quick == cands[: TS.QUICK_CANDIDATES]
            if path == "prefill":
                assert all(c.combine == "ordered" for c in cands)
            else:  # split-K never beyond the K chunks
                assert all(c.split_k1 <= -(-shape.H // 256) for c in cands)
                assert all(c.split_k2 <= -(-shape.I // 256) for c in cands)
    with pytest.raises(ValueError, match="in no kernel path's tuning range"):
        TU.search_space(64, TP8, H200, ranges={"decode": (1, 16), "prefill": (128, 1 << 30)})


def test_decode_search_space_tries_the_slot_parallel_token_gemm2_at_one_or_two_tokens(monkeypatch):
    """Where the heuristic runs the Gluon token GEMM2 (GLM-5 TP8 on the H200, outside the
    interpreter), buckets 1 and 2 time it with the slots side by side (``slots2``: the
    heuristic's form there) and one after the other; larger buckets only
    the walk."""
    from sglang_fp4ext import target_info

    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)
    for b in (1, 2, 4):
        cands = TU.search_space(b, TP8, H200)["decode"]
        got = [c for c in cands if getattr(c, "slots2", 0)]
        assert (len(got) >= 1) == (b <= 2), (b, got)
        for c in got:
            assert c.gemm2 == "tokens" and c.warps2 == 1 and c.kernels == "gluon"
        if b <= 2:
            assert cands[0].slots2 == 1
            walk = dataclasses.replace(cands[0], slots2=0, warps2=2, block_n2=32)
            assert walk in cands, (b, walk)


def test_decode_search_space_tries_gemm1_with_its_k_splits_stacked_at_up_to_four_tokens(
    monkeypatch,
):
    """Where the heuristic runs the Gluon two-launch decode, buckets 1-4 time GEMM1 with its K
    splits on one program's warps (``kstack1``) and across programs. The stacked form (the
    heuristic's on these shapes) as the H100 sweeps found best: 8 / 4 / 2
    splits at 1 / 2 / 4 tokens (32 rows on a warp; 64 on two at 4), fewer where the K chunks do
    not divide (DeepSeek-R1 TP8: 28 chunks -> 4 at 1 token); larger buckets neither."""
    from sglang_fp4ext import target_info

    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)
    want = {
        TP8: {1: (8, 1, 32), 2: (4, 1, 32), 4: (2, 2, 64)},
        MoEShape(256, 7168, 256, 8): {1: (4, 1, 32), 2: (4, 1, 32), 4: (2, 2, 64)},
    }
    for shape, by_b in want.items():
        for b in (1, 2, 4, 8):
            cands = TU.search_space(b, shape, H200)["decode"]
            got = [c for c in cands if getattr(c, "kstack1", 0)]
            assert bool(got) == (b <= 4), (b, got)
            if got:
                assert got[0] == cands[0]  # the heuristic's own form
                assert (got[0].split_k1, got[0].warps1, got[0].block_n1) == by_b[b], (shape, b)
                assert all(c.kernels == "gluon" for c in got)
                plain = heuristic_config(b, shape, H200, forms=False)
                across = dataclasses.replace(
                    got[0],
                    kstack1=0,
                    split_k1=plain.split_k1,
                    warps1=plain.warps1,
                    block_n1=plain.block_n1,
                )
                assert across in cands and plain in cands, (shape, b)


def test_gemm1_reg_cap_adds_a_program_per_sm_without_spilling():
    """The caps the static SASS chose on sm_90 (GLM-5): 2-warp GEMM1 programs 168 registers
    at 8 pairs a tile, 184 at 16; 4-warp 168; none for what the cap does not apply to."""
    base = GluonDecodeConfig(block_t=8, warps1=2, block_n1=64)
    assert TS.gemm1_reg_cap(base) == 168
    assert TS.gemm1_reg_cap(dataclasses.replace(base, block_t=16)) == 184
    assert TS.gemm1_reg_cap(dataclasses.replace(base, block_t=16, warps1=4, block_n1=128)) == 168
    for other in (dict(kernels="dot"), dict(kstack1=1, split_k1=2), dict(warps1=1, block_n1=32)):
        assert TS.gemm1_reg_cap(base.reform(**other)) is None, other


@pytest.mark.parametrize("target", [H200, PRO6000], ids=["h200", "pro6000"])
def test_decode_search_space_times_gluon_gemm1s_register_cap_not_its_missing_stages(
    monkeypatch, target
):
    """The Gluon decode kernels have no pipeline stages (their K loops prefetch in registers), so
    their config has none and no candidate is another timed twice. From 32 tokens
    that slot times GEMM1 under its register cap instead (``gemm1_reg_cap``), and the 4-warp
    GEMM1 is timed capped too (the H200's fastest at 64-128 tokens in the closing run), within the
    first four candidates, where a start's short budget reaches it."""
    from sglang_fp4ext import target_info

    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)
    seen_cap, seen_wide = set(), set()
    for shape in (TP8, TP8_FUSED, EP8):
        for b in TU.DEFAULT_BUCKETS:
            cands = TS.decode_candidates(b, shape, target)
            assert len(set(cands)) == len(cands), (shape, b)  # none is another's twin
            assert all(not hasattr(c, "stages1") for c in cands if c.kernels == "gluon")
            capped = [c for c in cands if getattr(c, "maxnreg1", 0)]
            if b < 32:
                assert not capped, (shape, b, capped)
            elif cands[0].kernels == "gluon":  # the tables' frequent winner right after the
                wide = [
                    getattr(c, "maxnreg1", 0)
                    for c in cands[:4]
                    if c.warps1 == 4 and c.block_n1 == 128
                ]
                assert 168 in wide, (shape, b, cands[:4])  # heuristic
            for c in capped:
                plain = dataclasses.replace(c, maxnreg1=0)
                assert plain in cands and c.maxnreg1 == TS.gemm1_reg_cap(plain), (shape, b)
                seen_cap.add((shape.E, b))
                if c.warps1 == 4 and c.block_n1 == 128:
                    seen_wide.add((shape.E, b))
    # GLM-5 TP8 / EP8 from 64 tokens: the cap is within the 12 candidates, on 4 warps at 64-128.
    assert {(256, 64), (256, 128), (256, 256), (32, 64), (32, 128), (32, 256)} <= seen_cap
    assert {(256, 64), (256, 128), (32, 64), (32, 128)} <= seen_wide, seen_wide


def test_prefill_search_space_times_both_families_on_sm90(monkeypatch):
    """Outside the interpreter the H200's prefill heuristic is the wgmma family: the tuner times
    it, the tl.dot family's heuristic and the wgmma knobs (all valid configs)."""
    from sglang_fp4ext import target_info
    from sglang_fp4ext.moe.prefill.heuristic import prefill_heuristic_config

    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)
    for shape in (TP8, TP8_FUSED, EP8):
        for b in (512, 4096):
            cands = TS.prefill_candidates(b, shape, H200)
            assert cands[0] == prefill_heuristic_config(b, shape, H200)
            assert cands[0].kernels == "wgmma"
            assert cands[1] == prefill_heuristic_config(b, shape, H200, "dot")
            assert {c.kernels for c in cands} == {"wgmma", "dot"} and len(cands) >= 6
            assert len({c.block_m for c in cands if c.kernels == "wgmma"}) >= 3
            if shape.I == 256 and b == 512:  # GEMM2 on two warpgroups with one accumulator
                # stays timed where the candidate cap reaches it: a config that keeps hoist2=1
                # with accs2=1 is invalid and would be dropped silently.
                assert any(c.kernels == "wgmma" and c.accs2 == 1 for c in cands), (shape, b)
            if shape.I == 256:  # GEMM2's sub-tiles (msub2) flipped: both forms are timed
                assert {
                    (c.msub2, c.group_n2) for c in cands if c.kernels == "wgmma" and c.accs2 == 2
                } >= {(1, 8), (2, 4)}, (shape, b)
    assert {c.kernels for c in TS.prefill_candidates(4096, TP8, PRO6000)} == {"w4a4", "dot"}


def test_switch_point():
    assert TR.switch_point({1: "decode", 2: "prefill", 4: "decode", 8: "prefill"}) == 8
    assert TR.switch_point({1: "decode", 2: "prefill", 4: "prefill"}) == 2
    assert TR.switch_point({1: "decode", 2: "decode"}) is None


# ---- the tuning flow (interpreter, tiny shape) ----


def _wall_timer(step, n):
    t = time.perf_counter()
    for i in range(n):
        step(i)
    return (time.perf_counter() - t) * 1e6 / n


def test_tune_flow_writes_a_checked_merged_table(user_dir, seed):
    tiny = model_shapes.ModelShape("tiny", 8, 2, 256, 128, 1)
    other = TableEntry("decode", DotDecodeConfig(split_k1=2))
    tgt = Target("sm_90", "Test GPU", 132)
    # An existing table with another shape: the tuner merges, never clobbers it.
    TR.write_table(user_dir / "Test_GPU.json", "Test GPU", {SMALL.key(): {1: other}})
    out = io.StringIO()
    log = TU.tune(
        [tiny], [1, 2, 4], budget_s=0.01, quick=True, copies=1, seed=seed, device="cpu",
        timer=_wall_timer, target=tgt, ranges={"decode": (1, 2), "prefill": (2, 1 << 30)},
        stream=out, log_path=user_dir / "log.json",
    )  # fmt: skip
    text = out.getvalue()
    assert log["ok"], text
    assert "[tune 1/3] tiny T=1" in text and "[tune 3/3] tiny T=4" in text
    key = "E=8,H=256,I=128,top_k=2"
    slog = log["shapes"][key]
    assert [slog["buckets"][b]["winner"] for b in ("1", "4")] == ["decode", "prefill"]
    for b, blog in slog["buckets"].items():
        assert blog["check"]["ok"] and blog["check"]["rms_rel"] > 0  # a real comparison
        assert all(t["us"] > 0 for t in blog["timings"])
    # Budget spent: only the heuristics ran (one per path; bucket 2 has both paths), so each
    # heuristic is its path's best.
    assert [len(slog["buckets"][b]["timings"]) for b in ("1", "2", "4")] == [1, 2, 1]
    assert [slog["buckets"][b]["heuristic_over_best"] for b in ("1", "2", "4")] == [
        {"decode": 1.0},
        {"decode": 1.0, "prefill": 1.0},
        {"prefill": 1.0},
    ]
    assert slog["heuristic_worst"]["decode"]["ratio"] == 1.0
    assert "heuristic vs the best timed, tiny: decode at most 1.00x" in text
    assert json.loads((user_dir / "log.json").read_text())["shapes"][key]["buckets"]
    entries = C.load_entries("Test GPU")
    assert entries[SMALL.key()] == {1: other}
    assert sorted(entries[key]) == [1, 2, 4]
    assert entries[key][4].path == "prefill" and entries[key][1].path == "decode"
    assert slog["switch_point"] == (2 if entries[key][2].path == "prefill" else 4)
    meta = json.loads((user_dir / "Test_GPU.json").read_text())["meta"]
    assert meta["shapes"][key]["switch_point"] == slog["switch_point"]
    assert C.select(3, MoEShape(8, 256, 128, 2), tgt) == entries[key][4]
    # A decode-only re-run of bucket 1 keeps the table's prefill buckets, so its log and output
    # give the same switch point as the table.
    out2 = io.StringIO()
    log2 = TU.tune(
        [tiny], [1], budget_s=0.01, quick=True, copies=1, seed=seed, device="cpu",
        timer=_wall_timer, target=tgt, ranges=_D1_P2, stream=out2,
    )  # fmt: skip
    assert log2["shapes"][key]["switch_point"] == slog["switch_point"] is not None
    assert f"tiny {slog['switch_point']}" in out2.getvalue()


def test_retune_times_the_tables_entry_and_keeps_it_when_it_is_fastest(user_dir, seed):
    """The incumbent (the entry the tables give a bucket) always runs, budget or not, and wins
    when it is the fastest: a re-tune never writes a slower config than the one it replaces."""
    tiny = model_shapes.ModelShape("tiny", 8, 2, 256, 128, 1)
    tgt = Target("sm_90", "Test GPU", 132)
    shape = MoEShape(8, 256, 128, 2)
    space = TU.search_space(1, shape, tgt, limit=TS.QUICK_CANDIDATES, ranges=_D1_P2)
    mine = space["decode"][1]  # not the heuristic: the budget alone would never reach it
    assert mine != space["decode"][0]
    TR.write_table(
        user_dir / "Test_GPU.json", "Test GPU", {shape.key(): {1: TableEntry("decode", mine)}}
    )
    times = iter([30.0, 20.0])  # heuristic, then the incumbent: the incumbent is faster

    def timer(step, n):
        step(0)  # the kernels run (interpreter); the times are scripted
        return next(times)

    out = io.StringIO()
    log = TU.tune(
        [tiny],
        [1],
        budget_s=0.0,
        quick=True,
        copies=1,
        seed=seed,
        device="cpu",
        timer=timer,
        target=tgt,
        ranges=_D1_P2,
        stream=out,
    )
    blog = log["shapes"][shape.key()]["buckets"]["1"]
    assert [(t.get("heuristic"), t.get("incumbent")) for t in blog["timings"]] == [
        (True, None),
        (False, True),
    ]
    assert blog["timings"][1]["config"] == mine.to_dict() and blog["incumbent_us"] == 20.0
    assert blog["winner"] == "decode" and blog["config"] == mine.to_dict()
    assert "the table's entry 20.0 us" in out.getvalue()
    assert C.load_entries("Test GPU")[shape.key()][1] == TableEntry("decode", mine)
    # A candidate less than 1% faster than the incumbent does not replace it (noise, no churn);
    # one 2% faster does.
    for heur_us, want in ((19.9, mine), (19.6, space["decode"][0])):
        times = iter([heur_us, 20.0])
        log = TU.tune(
            [tiny],
            [1],
            budget_s=0.0,
            quick=True,
            copies=1,
            seed=seed,
            device="cpu",
            timer=timer,
            target=tgt,
            ranges=_D1_P2,
            stream=io.StringIO(),
        )
        assert log["shapes"][shape.key()]["buckets"]["1"]["incumbent_us"] == 20.0
        assert C.load_entries("Test GPU")[shape.key()][1] == TableEntry("decode", want), heur_us


def test_a_candidate_starts_only_when_its_median_time_fits_the_buckets_share(
    user_dir, seed, monkeypatch
):
    """Each candidate (compile included) takes 2 s of a 5 s budget on a clock the test moves: the
    heuristic and one more run (2 + 2 <= 5); a third would end at 6 s, so it is not started and the
    tune ends within its budget (a deadline-only rule started it at 4 s and overran by 1 s)."""
    import types

    tiny = model_shapes.ModelShape("tiny", 8, 2, 256, 128, 1)
    tgt = Target("sm_90", "Test GPU", 132)
    clock = [0.0]
    monkeypatch.setattr(TU, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def timer(step, n):
        clock[0] += 2.0
        return 10.0 + clock[0]  # the heuristic is the fastest

    log = TU.tune(
        [tiny], [1], budget_s=5.0, quick=True, copies=1, seed=seed, device="cpu", timer=timer,
        target=tgt, ranges=_D1_P2, stream=io.StringIO(),
    )  # fmt: skip
    blog = log["shapes"]["E=8,H=256,I=128,top_k=2"]["buckets"]["1"]
    assert len(blog["timings"]) == 2 and blog["skipped_for_budget"] >= 1, blog
    assert clock[0] <= 5.0 and blog["winner"] == "decode"


def test_heuristic_over_best_compares_within_each_path():
    def rec(p, c, us, h=False):
        return {
            "path": p,
            "config": c.to_dict(),
            "heuristic": h,
            **({"us": us} if us else {"error": "x"}),
        }

    timings = [
        rec("decode", DotDecodeConfig(), 12.0, True),
        rec("prefill", DotPrefillConfig(), 30.0, True),
        rec("decode", DotDecodeConfig(split_k1=2), 10.0),
        rec("prefill", DotPrefillConfig(block_m=32), None),
    ]
    # decode: 12 / 10; prefill: its only timed candidate is the heuristic (the other failed)
    assert TR.heuristic_over_best(timings) == {"decode": 1.2, "prefill": 1.0}
    # a heuristic that failed to run has no ratio (not a 1.0 it did not earn)
    assert TR.heuristic_over_best(timings[2:]) == {}


def test_table_meta_switch_point_comes_from_the_merged_table(user_dir):
    """A later decode-only run (its own log: no prefill bucket, switch point None) keeps the
    table's prefill buckets, so the meta keeps their switch point."""
    path = user_dir / "Test_GPU.json"
    dec, pre = TableEntry("decode", DotDecodeConfig()), TableEntry("prefill", DotPrefillConfig())
    log = {"versions": {}, "date": "d", "shapes": {SMALL.key(): {"preset": "p", "switch_point": 4}}}
    TR.write_table(path, "Test GPU", {SMALL.key(): {1: dec, 4: pre, 8: pre}}, log)
    log["shapes"][SMALL.key()]["switch_point"] = None
    TR.write_table(path, "Test GPU", {SMALL.key(): {1: dec, 2: dec}}, log)
    meta = json.loads(path.read_text())["meta"]
    assert meta["shapes"][SMALL.key()]["switch_point"] == 4
    assert sorted(C.read_table_file(path)[1][SMALL.key()]) == [1, 2, 4, 8]


def test_a_shape_with_no_passing_bucket_yet_is_left_out_of_the_table(user_dir):
    """A run whose first bucket had no passing candidate writes the table without that shape
    (a table has no empty shapes) and goes on, instead of failing on its own file."""
    path = user_dir / "Test_GPU.json"
    log = {"versions": {}, "date": "d", "shapes": {SMALL.key(): {"preset": "p"}}}
    doc = TR.write_table(path, "Test GPU", {SMALL.key(): {}}, log)
    assert doc["shapes"] == {} and SMALL.key() not in doc["meta"]["shapes"]
    dec = TableEntry("decode", DotDecodeConfig())
    TR.write_table(path, "Test GPU", {SMALL.key(): {2: dec}}, log)
    TR.write_table(path, "Test GPU", {SMALL.key(): {}}, log)  # a later empty run keeps bucket 2
    assert C.read_table_file(path)[1] == {SMALL.key(): {2: dec}}


def test_tune_rejects_bad_buckets():
    with pytest.raises(ValueError, match="powers of two"):
        TU.tune([model_shapes.preset("glm5-tp8")], [3], device="cpu", timer=_wall_timer)


# ---- CLI ----


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_cli_without_gpu_exits_2(capsys, user_dir):
    assert cli_main(["tune", "--preset", "glm5-tp8,glm5-ep8", "--quick"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not list(user_dir.iterdir())  # nothing written


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--preset", "glm9"], "no model preset 'glm9'"),
        (["--E", "8", "--H", "256"], "needs all of --E, --H, --I and --top-k"),
        (["--preset", "glm5-tp8", "--E", "8"], "not both"),
        (["--decode-max", "16", "--prefill-min", "128"], "no bucket gap"),
    ],
)
def test_cli_bad_arguments_exit_2(capsys, argv, msg):
    assert cli_main(["tune", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_cli_bad_buckets_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ei:
        cli_main(["tune", "--buckets", "1,3"])
    assert ei.value.code == 2 and "powers of two" in capsys.readouterr().err
