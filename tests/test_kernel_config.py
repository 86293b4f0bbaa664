"""The decode configs (a type per kernel family): frozen/hashable/repr round trip, validation,
the heuristic, tables, overrides.

Table format v2 details, errors and the tuner: tests/test_tune.py; the dispatcher:
tests/test_dispatch.py."""

import dataclasses
import json

import pytest

from sglang_fp4ext.moe import table_files
from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe.decode.config import (
    CoopDecodeConfig,
    DecodeConfig,
    DotDecodeConfig,
    GluonDecodeConfig,
)
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.shape import MoEShape, Target, token_bucket
from sglang_fp4ext.moe.tables import config_for

H200 = Target("sm_90", "NVIDIA H200", 132)
PRO6000 = Target("sm_120", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 188)
TP8 = MoEShape(E=257, H=6144, I=256, top_k=9)
EP8 = MoEShape(E=32, H=6144, I=2048, top_k=8)
TOKENS = [0, 1, 2, 3, 4, 8, 16, 31, 64, 128, 256, 1000]


def test_frozen_hashable_repr_round_trip():
    names = {c.__name__: c for c in DecodeConfig.families().values()}
    for cfg in (
        DotDecodeConfig(grid="experts", block_n1=128, split_k2=4, stages1=4),
        GluonDecodeConfig(grid="experts", block_n1=128, split_k2=4, combine="kernel", pdl=1),
        CoopDecodeConfig(split_k1=4, warps1=2, warps2=1, block_n1=32, prefetch2=2),
    ):
        assert eval(repr(cfg), names) == cfg
        assert hash(cfg) == hash(dataclasses.replace(cfg))
        assert DecodeConfig.from_dict(cfg.to_dict()) == cfg
        assert cfg.to_dict()["kernels"] == cfg.kernels and isinstance(cfg, DecodeConfig)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.block_t = 32
    # Same tiles, other family: not equal.
    assert DotDecodeConfig() != GluonDecodeConfig() and DecodeConfig.families() == {
        "dot": DotDecodeConfig,
        "gluon": GluonDecodeConfig,
        "coop": CoopDecodeConfig,
    }


def test_each_family_takes_its_own_knobs_only():
    """The base holds the shared tiles and cannot be built; a knob of the other family is an
    error naming it, in Python and in a table's JSON."""
    with pytest.raises(TypeError, match="build one of DotDecodeConfig, GluonDecodeConfig"):
        DecodeConfig()
    with pytest.raises(TypeError, match="pdl"):
        DotDecodeConfig(pdl=1)
    with pytest.raises(TypeError, match="stages1"):
        GluonDecodeConfig(stages1=4)
    with pytest.raises(ValueError, match=r"unknown DotDecodeConfig fields \['split_t'\]"):
        DecodeConfig.from_dict({"kernels": "dot", "split_t": 2})
    with pytest.raises(ValueError, match="kernels must be one of"):
        DecodeConfig.from_dict({"kernels": "wgmma"})
    with pytest.raises(ValueError, match="combine: not a knob of DotDecodeConfig"):
        GluonDecodeConfig().reform(kernels="dot", combine="kernel")
    # No "kernels" (a v1 table): the first family.
    assert DecodeConfig.from_dict({"split_k1": 2}) == DotDecodeConfig(split_k1=2)


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"grid": "tokens"}, "grid"),
        ({"block_t": 24}, "power of two"),
        ({"block_t": 4}, "block_t"),
        ({"block_t": 128}, "block_t"),
        ({"block_n1": 16}, "block_n1 must be in"),
        ({"block_n2": 256}, "block_n2"),
        ({"block_n2": 32, "warps2": 4}, "fewer than 16 rows"),
        ({"tiles2": 3}, "tiles2"),
        ({"gemm2": "rows"}, "gemm2"),
        ({"gemm2": "tokens", "tiles2": 2}, "tiles2 must be 1"),
        ({"split_k1": 3}, "split_k1"),
        ({"stages2": 0}, "stages2"),
        ({"block_p": 8}, "block_p"),
        ({"combine": "atomic"}, "combine must be"),
        ({"pdl": 3}, "pdl must be 0, 1 or 2"),
        ({"slots2": 2, "gemm2": "tokens"}, "slots2 must be 0 or 1"),
        ({"slots2": 1}, "gemm2 must be 'tokens'"),
        ({"kstack1": 2, "split_k1": 8}, "kstack1 must be 0 or 1"),
        ({"kstack1": 1}, "split_k1 must be 2, 4 or 8, got 1"),
        ({"kstack1": 1, "split_k1": 16}, "split_k1 must be 2, 4 or 8, got 16"),
        ({"kstack1": 1, "split_k1": 8, "split_t": 2}, "split_t must be 1"),
        ({"kstack1": 1, "split_k1": 8, "warps1": 8, "block_n1": 128}, "64 warps per program"),
        ({"maxnreg1": 32}, "maxnreg1 must be 0"),
        ({"maxnreg1": 256}, "maxnreg1 must be 0"),
        ({"maxnreg1": 128, "kstack1": 1, "split_k1": 4}, "kstack1=1"),
    ],
)
def test_invalid_configs_rejected(kwargs, msg):
    """Each family's own checks; the shared tiles' checks on both families."""
    if "stages2" in kwargs:
        classes = (DotDecodeConfig,)
    elif set(kwargs) <= {f.name for f in dataclasses.fields(DecodeConfig)}:
        classes = (DotDecodeConfig, GluonDecodeConfig)
    else:
        classes = (GluonDecodeConfig,)
    for cls in classes:
        with pytest.raises(ValueError, match=msg):
            cls(**kwargs)
    with pytest.raises(ValueError, match="unknown"):
        DecodeConfig.from_dict({"blockn": 1})


@pytest.mark.parametrize("shape", [TP8, EP8, MoEShape(10, 272, 80, 9)], ids=["tp8", "ep8", "small"])
@pytest.mark.parametrize("target", [H200, PRO6000], ids=["h200", "pro6000"])
def test_heuristic_is_deterministic_and_fills_the_gpu(shape, target):
    for T in TOKENS:
        a, b = heuristic_config(T, shape, target), heuristic_config(T, shape, target)
        assert a == b and isinstance(a, DecodeConfig)
        # Same bucket -> same config.
        assert a == heuristic_config(token_bucket(T), shape, target)
        P = token_bucket(T) * shape.top_k
        assert a.grid == ("slots" if P <= shape.E else "experts")
    # GLM-5 TP8 at T = 1: 9 experts x row tiles x splits reach >= 2 programs per SM (Little's law).
    if shape is TP8:
        c = heuristic_config(1, shape, target)
        n_tiles = 9 * (512 // c.block_n1) * c.split_k1
        assert n_tiles >= 2 * target.num_sms
    # GLM-5 at large T: GEMM2 programs take several row tiles (fewer, longer programs), never
    # fewer than one program per SM.
    if shape in (TP8, EP8):
        big = heuristic_config(256, shape, target)
        n_tiles2 = -(-shape.H // 128) * 128 // big.block_n2
        assert big.tiles2 > 1
        assert n_tiles2 // big.tiles2 * shape.E >= target.num_sms


def test_heuristic_pdl_only_at_one_token_where_the_gpu_has_it(monkeypatch):
    """Programmatic dependent launch at T = 1 on sm_90+ (Gluon): 1 (next kernel at once) with
    the pairs GEMM2, 2 (GEMM2 released after GEMM1's K loops) with the token GEMM2, as each won
    on the H200; never from T = 2, on sm_80 or in the dot family."""
    from sglang_fp4ext import target_info

    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)
    qwen3 = MoEShape(128, 2048, 768, 8)
    a100 = Target("sm_80", None, 108)
    got = {
        (s.E, t.arch, T): heuristic_config(T, s, t)
        for s in (qwen3, EP8, TP8)
        for t in (H200, PRO6000, a100)
        for T in (1, 2, 16)
    }
    for (E, arch, T), c in got.items():
        on = T == 1 and arch != "sm_80" and c.kernels == "gluon"
        assert c.pdl == (0 if not on else 1 if c.gemm2 == "pairs" else 2), (E, arch, T, c)
    assert got[(128, "sm_90", 1)].pdl == 1  # Qwen3-30B-A3B: the pairs GEMM2 at one token
    assert got[(257, "sm_90", 1)].pdl == 2  # GLM-5 TP8 (fused shared): the token GEMM2


def test_token_bucket():
    assert [token_bucket(t) for t in (0, 1, 2, 3, 5, 16, 17, 256)] == [1, 1, 2, 4, 8, 16, 32, 256]


def test_override_and_reset():
    forced = DotDecodeConfig(grid="experts", block_n1=32)
    with C.override_config(forced):
        assert config_for(7, TP8, H200) is forced
    assert config_for(7, TP8, H200) != forced or heuristic_config(7, TP8, H200) == forced
    C.set_config_override(forced)
    try:
        assert config_for(1, EP8, PRO6000) is forced
    finally:
        C.reset_config_override()
    assert config_for(1, EP8, Target("sm_90", "no such GPU", 132)) == heuristic_config(
        1, EP8, Target("sm_90", "no such GPU", 132)
    )
    with pytest.raises(TypeError, match="config of no kernel path"):
        C.set_config_override({"grid": "slots"})


def _tables():
    return sorted(C.SHIPPED_CONFIG_DIR.glob("*.json"))


def test_tables_parse_and_are_used(tmp_path, monkeypatch):
    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path / "no-user-tables"))
    C.clear_table_cache()
    for path in _tables():
        raw = json.loads(path.read_text())
        assert C.table_path(raw["device_name"]) == path
        table = C.load_entries(raw["device_name"])
        assert table, f"{path.name} has no shapes"
        for key, buckets in table.items():
            E, H, I, k = (int(kv.split("=")[1]) for kv in key.split(","))
            shape = MoEShape(E, H, I, k)
            assert shape.key() == key
            tgt = Target("sm_90", raw["device_name"], 132)
            for b, entry in buckets.items():
                assert token_bucket(b) == b
                assert C.select(b, shape, tgt) == entry
                if entry.path == "decode":
                    assert config_for(b, shape, tgt) == entry.config
                else:
                    assert C.prefill_config_for(b, shape, tgt) == entry.config
            # Beyond the largest bucket: the largest bucket's entry when it is prefill.
            big = max(buckets)
            if buckets[big].path == "prefill":
                assert C.select(4 * big, shape, tgt) == buckets[big]
    # A table written to a temporary config dir is picked up by device name.
    monkeypatch.setattr(table_files, "SHIPPED_CONFIG_DIR", tmp_path)
    C.clear_table_cache()
    try:
        cfg = DotDecodeConfig(grid="experts", block_n1=128, split_k1=2)
        doc = {"device_name": "Test GPU", "shapes": {EP8.key(): {"16": cfg.to_dict()}}}
        (tmp_path / "Test_GPU.json").write_text(json.dumps(doc))
        tgt = Target("sm_90", "Test GPU", 132)
        assert config_for(9, EP8, tgt) == cfg  # bucket 16
        assert config_for(16, EP8, tgt) == cfg
        assert config_for(1, EP8, tgt) == heuristic_config(1, EP8, tgt)  # bucket 1 not tuned
    finally:
        C.clear_table_cache()


def test_fused_shared_expert_is_sglangs_rule():
    """``MoEShape.fused_shared``: SGLang fuses the one shared expert of a 256- or 384-routed
    model at EP 1 (one more local expert and id per token); nothing else counts."""
    assert MoEShape(257, 6144, 256, 9).fused_shared
    assert MoEShape(385, 7168, 256, 9).fused_shared
    assert not MoEShape(256, 6144, 256, 8).fused_shared
    assert not MoEShape(257, 6144, 256, 9, ep=8).fused_shared
    assert not MoEShape(33, 6144, 2048, 9).fused_shared
    assert not MoEShape(10, 272, 80, 9).fused_shared


def test_heuristic_takes_the_measured_forms_on_the_gluon_two_launch_path(monkeypatch):
    """The measured forms (``decode.heuristic._measured_forms``): GEMM1's K splits stacked on one
    program at 1-4 tokens (8 / 4 / 2 splits; 4 at one token with a 9th id; at 2 tokens only
    for EP8's 4096-row experts, and not at 2 tokens with a 9th id), a token's slots side by side
    at 1-2 tokens without expert parallelism and with top-k <= 8, 32-row token GEMM2 tiles for
    short chains, a fused shared expert's pair chunks over programs on the expert grid; never on
    the dot family (the interpreter) and ``forms=False`` is the heuristic without them."""
    from sglang_fp4ext import target_info

    tp8, fused = MoEShape(256, 6144, 256, 8), MoEShape(257, 6144, 256, 9)
    ep8 = MoEShape(32, 6144, 2048, 8, ep=8)
    dsr1 = MoEShape(256, 7168, 256, 8)
    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)

    def form(T, s, tgt=H200):
        c = heuristic_config(T, s, tgt)
        return (c.kstack1 and c.split_k1, c.kstack1 and c.warps1, c.slots2, c.block_n2, c.split_t)

    # (stacked splits, warps a split, slots2, GEMM2 rows, split_t)
    assert form(1, tp8) == (8, 1, 1, 64, 1)
    assert form(2, tp8) == (4, 1, 1, 32, 1)
    assert form(4, tp8) == (2, 2, 0, 32, 1)
    assert form(8, tp8) == (0, 0, 0, 32, 1)
    # 32-row token GEMM2 tiles at every T for chains of <= 1 K chunk a slot; Qwen3-30B-A3B's 3
    # chunks a slot only while they are <= 4 programs per SM
    assert [form(T, s)[3] for T in (16, 32) for s in (tp8, dsr1)] == [32] * 4
    qwen3 = MoEShape(128, 2048, 768, 8)
    assert heuristic_config(8, qwen3, H200).block_n2 == 32
    assert (heuristic_config(16, qwen3, H200).gemm2, form(16, qwen3)[3]) == ("tokens", 64)
    assert form(1, fused) == (4, 1, 0, 32, 1)
    assert form(2, fused)[:3] == (0, 0, 0)
    assert form(4, fused)[:3] == (2, 2, 0)
    assert form(1, ep8)[:3] == (0, 0, 0)
    assert form(2, ep8)[:3] == (4, 1, 0)
    assert form(4, ep8)[:3] == (0, 0, 0)  # 4096-row experts: stacked at 2 tokens only
    assert form(1, dsr1)[:3] == (4, 1, 1)  # 28 K chunks: 8 splits do not divide them
    c = heuristic_config(64, fused, H200)
    assert c.gemm2 == "pairs" and c.split_t == 4
    c = heuristic_config(32, fused, H200)  # GEMM1 beside the token GEMM2: a program a chunk
    assert (c.gemm2, c.grid, c.block_t, c.split_t) == ("tokens", "experts", 8, 4)
    assert heuristic_config(16, fused, H200).split_t == 1  # slot grid: chunks apart already
    assert heuristic_config(64, tp8, H200).split_t == 1  # no hot expert
    # The same forms wherever the Gluon decode runs (the users' sm_120 runs the heuristic).
    assert form(1, tp8, PRO6000)[:3] == (8, 1, 1)
    for T in (1, 2, 4, 8, 64, 256):
        for s in (tp8, fused, ep8, dsr1):
            plain = heuristic_config(T, s, H200, forms=False)
            assert (plain.kstack1, plain.slots2, plain.split_t) == (0, 0, 1), (T, s)
    monkeypatch.setattr(target_info, "is_interpreter", lambda: True)
    c = heuristic_config(1, tp8, H200)
    assert c.kernels == "dot" and c == heuristic_config(1, tp8, H200, forms=False)


def test_heuristic_path_moves_a_fused_shared_expert_to_prefill_from_128_on_wgmma(monkeypatch):
    """Without a table, the wgmma targets switch to prefill at 512 tokens, and at 128 where a
    fused shared expert sees every token (H100: 352.9 vs 473.7 us at 128); other targets keep
    their switch point (their prefill kernels were never timed against decode there)."""
    from sglang_fp4ext import target_info

    monkeypatch.setattr(target_info, "is_interpreter", lambda: False)
    tp8, fused = MoEShape(256, 6144, 256, 8), MoEShape(257, 6144, 256, 9)
    got = {T: C.heuristic_path(T, fused, H200) for T in (64, 65, 128, 256, 4096)}
    assert got == {64: "decode", 65: "prefill", 128: "prefill", 256: "prefill", 4096: "prefill"}
    assert C.heuristic_path(256, tp8, H200) == "decode"
    assert C.heuristic_path(512, tp8, H200) == "prefill"
    assert C.heuristic_path(128, fused, PRO6000) == "decode"


def test_reform_leaves_gemm1s_cap_behind_only_where_the_new_form_rejects_it():
    """``DecodeConfig.reform``: a config derived in another form keeps every other field; GEMM1's
    register cap goes where the form does not take it (the tl.dot family, stacked splits) and
    stays where it does; a cap the caller names is checked as given."""
    capped = GluonDecodeConfig(block_n1=128, warps1=4, maxnreg1=168)
    assert capped.reform(block_t=16) == dataclasses.replace(capped, block_t=16)
    assert capped.reform(gemm2="tokens", combine="counter").maxnreg1 == 168
    stack = {"kstack1": 1, "split_k1": 4, "warps1": 2, "block_n1": 64}
    derived = capped.reform(**stack)
    assert derived == dataclasses.replace(capped, maxnreg1=0, **stack)
    with pytest.raises(ValueError, match="caps the GEMM1 of split programs"):
        capped.reform(maxnreg1=168, **stack)
    # The other family: the shared tiles carry over, the knobs of this one stay behind.
    assert capped.reform(kernels="dot") == DotDecodeConfig(block_n1=128, warps1=4)
    assert DotDecodeConfig(stages1=4).reform(kernels="gluon") == GluonDecodeConfig()


def test_gpu_tier_forms_of_every_shipped_decode_entry_are_valid(tmp_path, monkeypatch):
    """The GPU tier derives its forms (one launch, stacked splits, the tl.dot family, ...) from
    the config a call would use; each must pass the config check on every shipped table's
    decode entries and on the heuristic (sm_90 and sm_120), or the tier fails before a kernel
    runs (the H200 run of 2026-12-06: GEMM1's register cap kept on stacked splits and on the
    one-launch form)."""
    from tests.test_decode_gpu import FAMILIES, _as, _with_gemm2

    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path / "no-user-tables"))
    C.clear_table_cache()
    cases = [(Target("sm_90", "no such GPU", 132), s) for s in (TP8, EP8)]
    cases += [(PRO6000, s) for s in (TP8, EP8)]
    for path in _tables():
        raw = json.loads(path.read_text())
        tgt = Target("sm_90", raw["device_name"], 132)
        cases += [(tgt, C.parse_shape_key(key)) for key in raw["shapes"]]
    forms = 0
    try:
        for (tgt, shape), b in [(c, b) for c in cases for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]:
            base = config_for(b, shape, tgt)
            for gemm2 in ("pairs", "tokens"):
                for kernels in FAMILIES:
                    cfg = _as(_with_gemm2(base, gemm2), kernels)  # as the tier's _config
                    assert isinstance(cfg, DecodeConfig), (tgt, shape, b, kernels)
                    forms += 1
    finally:
        C.clear_table_cache()
    assert len(cases) >= 4 + 3 * len(_tables())
    assert forms == len(cases) * 9 * 2 * len(FAMILIES)
