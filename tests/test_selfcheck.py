"""First-use self-check (``moe/selfcheck.py``): a broken kernel is caught before it serves.

CPU tier: the ``tl.dot`` decode family under the interpreter, broken on purpose by the test-only
fault injection (one output tile corrupted after the kernels ran, ``moe/fault_inject.py``), is
caught by the check; the dispatcher then serves the torch twin and says so. The verdict is kept
on disk next to the tuned tables and a later process (here: the in-process cache cleared) does
not check again. GPU tier: every config the shipped H200 table names passes its check on this
GPU, and a broken Gluon decode family or wgmma prefill family falls back to the ``tl.dot``
kernels of the same tiles; configs with GEMM1's K splits stacked (``kstack1``) are checked on
K chunks their splits divide.
"""

import dataclasses
import logging

import pytest
import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.bench import random_packed_weights
from sglang_fp4ext.moe import dispatch, selfcheck
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import assert_close


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_FP4EXT_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("SGLANG_FP4EXT_SELFCHECK", "on")
    selfcheck.clear()
    dispatch.CALLS.clear()
    runs = []
    real = selfcheck._run_check

    def counting(*a, **k):  # a spy: the real check runs, the test counts it
        runs.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(selfcheck, "_run_check", counting)
    yield runs
    selfcheck.clear()


@pytest.fixture
def small_check(monkeypatch):
    """The CPU tier's checks on a smaller shape than :data:`selfcheck.CHECK_SHAPE` (the
    interpreter runs every program): 8 experts, H = 512 (2 K chunks for GEMM1, 8 N tiles of 64
    for GEMM2, one K chunk for GEMM2 at I = 256) and 16 prefill tokens (8 rows per expert on
    average at top_k = 4; the full check's 16 experts see 16). What the tests check does not
    depend on the size: a right kernel runs at rms_rel ~2.4e-3 on any shape, a corrupted output
    tile or NVFP4 activations against the W4A16 twin are errors of order 0.1-100."""
    from sglang_fp4ext.moe import paths

    monkeypatch.setitem(selfcheck.CHECK_SHAPE, "E", 8)
    monkeypatch.setitem(selfcheck.CHECK_SHAPE, "H", 512)
    prefill = paths.get("prefill")
    monkeypatch.setitem(paths._REGISTRY, "prefill", dataclasses.replace(prefill, check_tokens=16))


def _case(device, seed, T=3, E=8, H=256, I=256, k=4):
    g = torch.Generator(device=device).manual_seed(seed)
    w = random_packed_weights(E, H, I, device=device, generator=g)
    ids = torch.rand(T, E, device=device, generator=g).topk(k, dim=1).indices.to(torch.int32)
    tw = torch.rand(T, k, device=device, generator=g)
    x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
    return w, PreparedMoEWeights.from_moe_weights(w), x, ids.contiguous(), tw


def test_mode_is_validated(monkeypatch):
    monkeypatch.setenv("SGLANG_FP4EXT_SELFCHECK", "maybe")
    with pytest.raises(ValueError, match="SGLANG_FP4EXT_SELFCHECK must be on, off or warn"):
        selfcheck.mode(torch.device("cpu"))
    monkeypatch.delenv("SGLANG_FP4EXT_SELFCHECK")
    assert selfcheck.mode(torch.device("cpu")) == "off"  # the interpreter's default


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tier: the interpreter runs the dot family"
)
def test_broken_kernel_is_caught_and_the_twin_serves(fresh, small_check, monkeypatch, caplog, seed):
    monkeypatch.setenv("SGLANG_FP4EXT_FAULT_INJECT", "decode:dot")
    w, pw, x, ids, tw = _case("cpu", seed)
    with caplog.at_level(logging.INFO, logger="sglang_fp4ext"):
        out = dispatch.fused_moe(x, pw, ids, tw)
    assert dispatch.CALLS == {"reference": 1}
    assert len(fresh) == 1
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=1e-2, rms_rel=5e-3)
    failed = [r.getMessage() for r in caplog.records if "self-check FAILED" in r.getMessage()]
    assert len(failed) == 1 and "Triton" in failed[0] and "decode" in failed[0], failed
    assert "DecodeConfig(" in failed[0] and "rms_rel" in failed[0]
    ((key, v),) = selfcheck.verdicts().items()
    assert not v["ok"] and v["rms_rel"] > selfcheck.RMS_REL, v
    # A later process reads the verdict from disk: no second check, the twin serves again.
    selfcheck.clear()
    dispatch.fused_moe(x, pw, ids, tw)
    assert len(fresh) == 1 and dispatch.CALLS == {"reference": 2}


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tier: the interpreter runs the dot family"
)
def test_good_kernel_passes_once_and_serves(fresh, small_check, caplog, seed):
    w, pw, x, ids, tw = _case("cpu", seed)
    with caplog.at_level(logging.INFO, logger="sglang_fp4ext"):
        out = dispatch.fused_moe(x, pw, ids, tw)
        dispatch.fused_moe(x, pw, ids, tw)
    assert dispatch.CALLS == {"decode": 2} and len(fresh) == 1
    assert any("self-check passed" in r.getMessage() for r in caplog.records)
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=1e-2, rms_rel=5e-3)
    (v,) = selfcheck.verdicts().values()
    assert v["ok"] and v["rms_rel"] < 5e-3, v


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tier: the interpreter runs the dot family"
)
def test_warn_mode_logs_but_serves_what_was_chosen(fresh, small_check, monkeypatch, caplog, seed):
    monkeypatch.setenv("SGLANG_FP4EXT_SELFCHECK", "warn")
    monkeypatch.setenv("SGLANG_FP4EXT_FAULT_INJECT", "decode:dot")
    _, pw, x, ids, tw = _case("cpu", seed)
    with caplog.at_level(logging.INFO, logger="sglang_fp4ext"):
        dispatch.fused_moe(x, pw, ids, tw)
    assert dispatch.CALLS == {"decode": 1}
    assert any("self-check FAILED" in r.getMessage() for r in caplog.records)


@pytest.mark.gpu
def test_every_shipped_h200_config_passes_its_check(fresh):
    """Each config of the shipped table for this GPU, checked on this GPU (time per family). On
    another sm_90 card (an H100) the H200's table: the configs such a card is closest to."""
    from sglang_fp4ext.moe import tables as C

    name = torch.cuda.get_device_name()
    if not C.table_path(name).exists() and torch.cuda.get_device_capability() == (9, 0):
        name = "NVIDIA H200"
    try:
        entries = C.load_entries(name)
    except Exception:  # noqa: BLE001
        entries = {}
    if not entries:
        pytest.skip(f"no shipped table for {name}")
    dev = torch.device("cuda")
    seen, times = set(), {}
    for key, buckets in entries.items():
        top_k = int(key.split("top_k=")[1])
        for e in buckets.values():
            if (e, top_k) in seen:
                continue
            seen.add((e, top_k))
            v = selfcheck._verdict(e, top_k, dev)
            assert v is not None and v.ok, (key, e, v)
            fam = f"{e.path}:{getattr(e.config, 'kernels', 'prefill')}"
            times.setdefault(fam, []).append(v.seconds)
    for fam, ts in sorted(times.items()):
        print(f"self-check {fam}: {len(ts)} configs, {sum(ts):.2f} s in all, max {max(ts):.2f} s")


@pytest.mark.gpu
def test_broken_gluon_falls_back_to_dot(fresh, monkeypatch, seed):

    from sglang_fp4ext.moe.decode.heuristic import heuristic_config
    from sglang_fp4ext.moe.shape import current_target
    from sglang_fp4ext.moe.tables import TableEntry

    monkeypatch.setenv("SGLANG_FP4EXT_FAULT_INJECT", "decode:gluon")
    dev = torch.device("cuda")
    w, pw, x, ids, tw = _case("cuda", seed, T=4, E=64, H=1024, I=256, k=8)
    cfg = heuristic_config(4, pw.shape(8), current_target(dev)).reform(kernels="gluon")
    got = selfcheck.usable_entry(TableEntry("decode", cfg), 8, dev)
    assert got is not None and got.config.kernels == "dot", got
    assert got.config == cfg.reform(kernels="dot")  # the same tiles


def test_stacked_gemm1_is_checked_on_k_chunks_its_splits_divide():
    """A decode config with GEMM1's K splits stacked on one program (``kstack1``) needs K chunks
    that ``split_k1`` divides; the check widens H for it (6 chunks do not divide into 4 or 8: the
    H100 Marlin harness saw such configs fail their check and fall back to tl.dot, 2026-12-05)."""
    from sglang_fp4ext.moe.decode.config import GluonDecodeConfig
    from sglang_fp4ext.moe.tables import TableEntry

    base = GluonDecodeConfig(split_k1=2, warps1=1, block_n1=32)
    assert selfcheck.check_hidden(TableEntry("decode", base)) == selfcheck.CHECK_SHAPE["H"]
    for sk, want in ((2, 1536), (4, 3072), (8, 6144)):
        e = TableEntry("decode", dataclasses.replace(base, kstack1=1, split_k1=sk))
        h = selfcheck.check_hidden(e)
        # equal splits, and the static rings' depths (2, 3) still divide the chunks
        assert h == want and (h // 256) % sk == 0 and (h // 256) % 6 == 0, (sk, h)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k1", [2, 4, 8])
def test_stacked_gemm1_passes_its_check(fresh, split_k1):
    """A kstack1 config passes its check and serves as it is (no tl.dot fallback)."""
    from sglang_fp4ext.moe.decode.config import GluonDecodeConfig
    from sglang_fp4ext.moe.tables import TableEntry

    dev = torch.device("cuda")
    if not target_info.supports_gluon_decode(target_info.device_capability(dev)):
        pytest.skip("the Gluon decode family does not run on this GPU")
    cfg = GluonDecodeConfig(grid="slots", kstack1=1, split_k1=split_k1, warps1=1, block_n1=32)
    e = TableEntry("decode", cfg)
    assert selfcheck.usable_entry(e, 8, dev) == e, selfcheck._verdict(e, 8, dev)
    assert fresh == [e]


@pytest.mark.gpu
def test_broken_wgmma_prefill_falls_back_to_dot(fresh, monkeypatch, seed):
    """A wrong wgmma prefill kernel (fault injected) is caught; the same tiles on tl.dot serve
    (``w4a16_twin_config``: the wgmma-only knobs dropped)."""
    from sglang_fp4ext.moe.prefill.config import w4a16_twin_config
    from sglang_fp4ext.moe.prefill.heuristic import prefill_heuristic_config
    from sglang_fp4ext.moe.shape import MoEShape, current_target
    from sglang_fp4ext.moe.tables import TableEntry

    dev = torch.device("cuda")
    if not target_info.supports_wgmma_prefill(target_info.device_capability(dev)):
        pytest.skip("the wgmma prefill family runs on sm_90 only")
    monkeypatch.setenv("SGLANG_FP4EXT_FAULT_INJECT", "prefill:wgmma")
    s = selfcheck.CHECK_SHAPE
    shape = MoEShape(s["E"], s["H"], s["I"], 8)
    cfg = prefill_heuristic_config(512, shape, current_target(dev), "wgmma")
    got = selfcheck.usable_entry(TableEntry("prefill", cfg), 8, dev)
    assert got is not None and got.config.kernels == "dot", got
    assert got.config == w4a16_twin_config(cfg)
    assert (got.config.block_m, got.config.block_n1, got.config.block_n2) == (
        cfg.block_m,
        cfg.block_n1,
        cfg.block_n2,
    )


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU tier: the interpreter runs the W4A4 kernels"
)
def test_w4a4_is_checked_against_the_w4a4_twin_and_falls_back_to_w4a16(
    fresh, small_check, monkeypatch
):
    """The W4A4 prefill family (interpreter: fp32 operands) is checked like with like, against
    the twin with NVFP4 activations: a correct kernel passes (its FP4 activations differ from the
    W4A16 twin by ~16% rms, which would fail); a broken one falls back to the same tiles on the
    W4A16 tl.dot kernels."""
    from sglang_fp4ext.moe.prefill.config import W4A4PrefillConfig, w4a16_twin_config
    from sglang_fp4ext.moe.tables import TableEntry

    dev = torch.device("cpu")
    cfg = W4A4PrefillConfig(
        block_m=32,
        block_n1=64,
        block_n2=64,
        block_k1=256,
        block_k2=256,
        block_p=1024,
    )
    entry = TableEntry("prefill", cfg)
    v = selfcheck._verdict(entry, 4, dev)
    assert v.ok and v.rms_rel < 5e-3, v
    selfcheck.clear(disk=True)  # forget the good verdict (a new process on a fresh machine)
    monkeypatch.setenv("SGLANG_FP4EXT_FAULT_INJECT", "prefill:w4a4")
    got = selfcheck.usable_entry(entry, 4, dev)
    assert got == TableEntry("prefill", w4a16_twin_config(cfg)), got
