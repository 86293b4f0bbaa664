"""The kernel-path dispatcher (``moe/dispatch.py``) and ``run_experts`` on the Triton path.

A v2 table in a user config directory (``SGLANG_FP4EXT_CONFIG_DIR``) forces decode or prefill per
bucket; the dispatcher must run that path's kernels with that table's config. Which kernels ran
is read from two observables: ``dispatch.CALLS`` and the output itself, which must be bit-identical
to the chosen entry point called directly with the table's config (both are deterministic) and
differ from the other path's output. Results are held to the fp32 twin at the bounds of the
kernel tests (rms_rel 5e-3, max_rel 1e-2: three bf16 roundings, fp32 accumulation). Kernels run
under the Triton interpreter without a GPU (small shapes), compiled on a GPU.
"""

from __future__ import annotations

import json

import pytest
import torch

from sglang_fp4ext.moe import dispatch
from sglang_fp4ext.moe import shape as S
from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe.decode.config import DotDecodeConfig
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.prefill.config import DotPrefillConfig
from sglang_fp4ext.moe.prefill.launch import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.shape import MoEShape, Target
from sglang_fp4ext.moe.weights import random_moe_weights
from sglang_fp4ext.testing.compare import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"
E, H, I, K = 6, 256, 128, 2
DECODE = DotDecodeConfig(block_n2=32, gemm2="tokens")
PREFILL = DotPrefillConfig(block_m=16, block_n1=64, block_n2=64, block_p=64)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A user config dir holding ``put(shape, {bucket: TableEntry})`` tables for this device."""
    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path))
    C.clear_table_cache()
    tgt = S.current_target(torch.device(DEV))
    name = tgt.device_name or "Test GPU"
    target = Target(tgt.arch, name, tgt.num_sms)

    def put(shape: MoEShape, entries: dict):
        doc = C.table_document(name, {shape.key(): entries})
        (tmp_path / C.table_file_name(name)).write_text(json.dumps(doc))
        C.clear_table_cache()

    yield put, target
    C.clear_table_cache()


def _case(T, seed):
    g = torch.Generator().manual_seed(seed)
    w = random_moe_weights(E, H, I, generator=g)
    pw = PreparedMoEWeights.from_moe_weights(w).to(DEV)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    ids[0, 1] = -1  # another rank's expert
    tw = torch.rand(T, K, generator=g) + 0.1
    return w, pw, x.to(DEV), ids.to(DEV), tw.to(DEV)


@pytest.mark.parametrize("T,forced", [(5, "prefill"), (3, "decode")])
def test_table_forces_the_path(tables, T, forced, seed):
    put, target = tables
    w, pw, x, ids, tw = _case(T, seed)
    shape = pw.shape(K)
    b = S.token_bucket(T)
    other = "decode" if forced == "prefill" else "prefill"
    cfgs = {"decode": DECODE, "prefill": PREFILL}
    # The forced path at T's bucket; the other path at the bucket below (must not be used).
    put(shape, {b: C.TableEntry(forced, cfgs[forced]), b // 2: C.TableEntry(other, cfgs[other])})
    entry = dispatch.choose(T, pw, K, target)
    assert entry == C.TableEntry(forced, cfgs[forced])
    dispatch.CALLS.clear()
    out = dispatch.fused_moe(x, pw, ids, tw, target=target)
    assert dispatch.CALLS == {forced: 1}
    ref = fused_moe_nvfp4_torch(x.float().cpu(), w, ids.cpu(), tw.cpu())
    assert_close(out.cpu(), ref, max_rel=1e-2, rms_rel=5e-3, what=f"dispatch {forced}")
    direct = {
        "decode": lambda: fused_moe_nvfp4(x, pw, ids, tw, config=DECODE),
        "prefill": lambda: fused_moe_nvfp4_prefill(x, pw, ids, tw, config=PREFILL),
    }
    assert torch.equal(out, direct[forced]())
    assert not torch.equal(out, direct[other]()), "paths agree bit for bit: test cannot tell"


def test_heuristic_switch_without_table(tables):
    _, target = tables
    shape = MoEShape(E, H, I, K)
    lo, hi = C.PREFILL_MIN_TOKENS // 2, C.PREFILL_MIN_TOKENS
    assert C.select(lo, shape, target).path == "decode"
    assert C.select(hi, shape, target).path == "prefill"
    assert C.select(hi, shape, target).config == C.prefill_config_for(hi, shape, target)
    assert C.select(1, shape, target).config == C.config_for(1, shape, target)


def test_decode_only_table_does_not_extend_decode_into_prefill(tables):
    put, target = tables
    shape = MoEShape(E, H, I, K)
    put(shape, {4: C.TableEntry("decode", DECODE)})
    assert C.select(4, shape, target) == C.TableEntry("decode", DECODE)
    assert C.select(8, shape, target) == C.TableEntry("decode", DECODE)  # beyond: largest bucket
    big = C.select(C.PREFILL_MIN_TOKENS, shape, target)
    assert big.path == "prefill"
    # A prefill entry at the top extends to every larger T.
    put(shape, {4: C.TableEntry("decode", DECODE), 8: C.TableEntry("prefill", PREFILL)})
    assert C.select(10**5, shape, target) == C.TableEntry("prefill", PREFILL)
    assert C.prefill_config_for(10**5, shape, target) == PREFILL
    assert C.config_for(10**5, shape, target) == heuristic_config(10**5, shape, target)


def test_override_forces_path(seed):
    shape = MoEShape(E, H, I, K)
    with C.override_config(PREFILL):
        assert C.select(1, shape) == C.TableEntry("prefill", PREFILL)
        assert C.prefill_config_for(1, shape) is PREFILL
    with C.override_config(DECODE):
        assert C.select(10**4, shape) == C.TableEntry("decode", DECODE)


def test_run_experts_triton_goes_through_the_dispatcher(tables, monkeypatch, seed):
    """The runner core's and the transformers swap's entry point runs the dispatched kernels."""
    from sglang_fp4ext.moe.experts import run_experts

    put, target = tables
    w, pw, x, ids, tw = _case(4, seed)
    put(pw.shape(K), {4: C.TableEntry("prefill", PREFILL)})
    if DEV == "cpu":  # run_experts takes the target of its device: make it this table's device
        monkeypatch.setattr(S, "DEFAULT_TARGET", target)
    dispatch.CALLS.clear()
    out = run_experts("triton", pw, x.float(), ids.long(), tw)
    assert dispatch.CALLS == {"prefill": 1} and out.dtype == torch.float32
    ref = fused_moe_nvfp4_torch(x.float().cpu(), w, ids.cpu(), tw.cpu())
    assert_close(out.cpu(), ref, max_rel=1e-2, rms_rel=5e-3, what="run_experts")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tp8_shared", "ep8"])
@pytest.mark.parametrize("T", [1, 64, 512, 2048])
def test_glm5_shipped_table_path_on_gpu(name, T, seed):
    """GPU tier: at GLM-5 shapes the runner's entry (``run_experts`` -> dispatcher) takes the path
    the shipped table (or the heuristic switch) names for T, and its output matches the twin."""
    from sglang_fp4ext.moe.experts import run_experts
    from tests import glm5_cases

    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    want = C.select(T, pw.shape(ids.shape[1]), S.current_target(torch.device("cuda"))).path
    before = dispatch.CALLS[want]
    out = run_experts("triton", pw, x, ids, tw)
    assert dispatch.CALLS[want] == before + 1
    ref = fused_moe_nvfp4_torch(x, w, ids, tw)
    assert_close(out, ref, max_rel=1e-2, rms_rel=5e-3, what=f"{name} T={T} {want}")
