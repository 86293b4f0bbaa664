"""The kernel-path registry (``moe/paths.py``): a family added in one place reaches every user.

``chunked`` below is a complete kernel path of its own -- a frozen config type, a heuristic, a
search space and a launcher (the fp32 twin run over token chunks, so it computes the real layer)
-- added by one :func:`paths.register` call. Nothing else is touched, and the config tables, the
dispatcher, the first-use self-check, the tuner and the benchmark layer all take it (CPU tier).
The shipped paths' own tests are in test_dispatch.py, test_selfcheck.py and test_tune.py.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

import pytest
import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext import tune as TU
from sglang_fp4ext.moe import dispatch, paths, selfcheck
from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe.decode.config import DecodeConfig, DotDecodeConfig
from sglang_fp4ext.moe.prefill.config import DotPrefillConfig
from sglang_fp4ext.moe.shape import ConfigDict, MoEShape, Target
from sglang_fp4ext.testing.compare import assert_close

TGT = Target("sm_90", "Test GPU", 132)
TINY = model_shapes.ModelShape("tiny", 8, 2, 256, 128, 1)


@dataclass(frozen=True)
class ChunkedConfig(ConfigDict):
    """Tokens per chunk of the ``chunked`` path."""

    chunk: int = 4

    def __post_init__(self):
        if not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"ChunkedConfig.chunk must be an int >= 1, got {self.chunk!r}")


LAUNCHES: list[int] = []


def run_chunked(x, weights, topk_ids, topk_weights, *, out=None, config: ChunkedConfig):
    """The ``chunked`` launcher: the fp32 twin on ``config.chunk`` tokens at a time."""
    LAUNCHES.append(config.chunk)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    for lo in range(0, x.shape[0], config.chunk):
        sl = slice(lo, lo + config.chunk)
        selfcheck.reference_on_prepared(x[sl], weights, topk_ids[sl], topk_weights[sl], out[sl])
    return out


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """The one place the family is added (and removed again after the test)."""
    monkeypatch.setenv("SGLANG_FP4EXT_CONFIG_DIR", str(tmp_path))
    C.clear_table_cache()
    selfcheck.clear()
    LAUNCHES.clear()
    path = paths.register(paths.KernelPath(
        name="chunked",
        config_type=ChunkedConfig,
        runner=f"{__name__}:run_chunked",
        heuristic=lambda T, shape, target: ChunkedConfig(chunk=min(T, 4)),
        candidates=lambda T, shape, target, limit: [ChunkedConfig(min(T, 4)), ChunkedConfig(1)],
        check_tokens=3,
        tune_buckets=(1, 2),
    ))  # fmt: skip
    yield path
    paths.unregister("chunked")
    C.reset_config_override()
    C.clear_table_cache()
    selfcheck.clear()


def _layer_inputs(T=5, seed=7):
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights
    from sglang_fp4ext.moe.synthetic import random_packed_weights

    g = torch.Generator().manual_seed(seed)
    w = random_packed_weights(8, 256, 128, device="cpu", generator=g)
    ids = torch.rand(T, 8, generator=g).topk(2, dim=1).indices.to(torch.int32)
    ids[0, 1] = -1
    tw = torch.rand(T, 2, generator=g)
    x = torch.randn(T, 256, generator=g).to(torch.bfloat16)
    return w, PreparedMoEWeights.from_moe_weights(w), x, ids, tw


def test_shipped_paths_are_registered_in_order_with_their_config_types():
    assert paths.names()[:2] == ("decode", "prefill")
    assert paths.get("decode").config_type is DecodeConfig
    assert paths.path_of(DotPrefillConfig()).name == "prefill"
    with pytest.raises(ValueError, match="unknown kernel path 'nope'"):
        paths.get("nope")
    with pytest.raises(TypeError, match="config of no kernel path"):
        paths.path_of(object())
    with pytest.raises(ValueError, match="registered already"):
        paths.register(paths.get("decode"))


def test_a_family_added_in_one_place_is_read_from_tables(chunked):
    doc = C.table_document("Test GPU", {MoEShape(8, 256, 128, 2).key(): {
        1: C.TableEntry("decode", DotDecodeConfig()),
        4: C.TableEntry("chunked", ChunkedConfig(chunk=2)),
    }})  # fmt: skip
    _, entries = C.parse_table(doc)
    assert entries["E=8,H=256,I=128,top_k=2"][4] == C.TableEntry("chunked", ChunkedConfig(2))
    doc["shapes"]["E=8,H=256,I=128,top_k=2"]["4"]["config"] = {"chunk": 0}
    with pytest.raises(C.ConfigTableError, match="bucket '4'.*chunk must be an int >= 1"):
        C.parse_table(doc)
    with pytest.raises(TypeError, match="needs a ChunkedConfig"):
        C.TableEntry("chunked", DotDecodeConfig())


def test_a_family_added_in_one_place_is_dispatched_and_self_checked(chunked, monkeypatch):
    """Forced by a config of its type, the dispatcher runs it (counted under its name) after the
    first-use self-check has checked that very path on its own inputs."""
    monkeypatch.setenv("SGLANG_FP4EXT_SELFCHECK", "on")
    w, pw, x, ids, tw = _layer_inputs()
    dispatch.CALLS.clear()
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16)
    with C.override_config(ChunkedConfig(chunk=2)):
        assert dispatch.choose(5, pw, 2) == C.TableEntry("chunked", ChunkedConfig(2))
        dispatch.fused_moe(x, pw, ids, tw, out=out)
    assert dispatch.CALLS == {"chunked": 1}
    assert LAUNCHES == [2, 2], "the self-check's launch (3 tokens), then the call's"
    (verdict,) = [v for k, v in selfcheck.verdicts().items() if "| chunked |" in k]
    assert verdict["ok"] and verdict["rms_rel"] < 1e-2
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=1e-2, rms_rel=5e-3)


def test_a_family_added_in_one_place_is_tuned_and_benchmarked(chunked):
    """The tuner times its candidates in its bucket range and writes its winner to the table;
    the benchmark layer runs it by name."""
    from sglang_fp4ext.bench.layer import Layer

    def wall(step, n):
        t = time.perf_counter()
        for i in range(n):
            step(i)
        return (time.perf_counter() - t) * 1e6 / n

    space = TU.search_space(
        2, MoEShape(8, 256, 128, 2), TGT, ranges={"decode": (0, 0), "prefill": (0, 0)}
    )
    assert space == {"decode": [], "prefill": [], "chunked": [ChunkedConfig(2), ChunkedConfig(1)]}
    log = TU.tune(
        [TINY],
        [1, 2],
        budget_s=30,
        copies=1,
        device="cpu",
        timer=wall,
        target=TGT,
        ranges={"decode": (0, 0), "prefill": (0, 0)},
        stream=io.StringIO(),
    )
    assert log["ok"]
    key = "E=8,H=256,I=128,top_k=2"
    assert [log["shapes"][key]["buckets"][b]["winner"] for b in ("1", "2")] == ["chunked"] * 2
    assert {e.path for e in C.load_entries("Test GPU")[key].values()} == {"chunked"}
    layer = Layer(TINY, 1, device="cpu")
    LAUNCHES.clear()
    layer.ours(3, "chunked")(0)
    assert LAUNCHES == [3]  # its heuristic's chunk at T = 3
