"""Decode kernels vs the fp32 torch reference MoE (``fused_moe_nvfp4_torch``), small shapes.

On a CPU machine the kernels run under ``TRITON_INTERPRET=1`` (conftest); on a GPU machine the same
tests run compiled. Covered: T = 0, 1, odd T; top_k 8 and 9 (fused shared expert = last expert);
``-1`` ids incl. tokens with no local expert; every token on one expert (several token groups);
non-power-of-two H and I (padding); both grids; split-K in both GEMMs; both GEMM2 forms (pairs
with the arrival-counter combine, tokens walking each token's experts, incl. multi-chunk K);
int64 ids and bf16 routing weights; counters left at zero; validation errors.

Tolerance: the kernels round the GEMM1 output (SiLU·mul) to bf16 before GEMM2 and the result to
bf16, each a relative error <= 2^-9 per element; everything else is exact (FP4 x e4m3 decode) or
fp32 accumulation. Random signs make the rounding errors average out: rms_rel 2.2-2.5e-3 and
max_rel 2.6-3.5e-3 measured,
so rms_rel 5e-3 and max_rel (normalised by max|ref|) 1e-2 leave margin without hiding a wrong
expert, slot or scale (those give errors of order 1).
"""

from dataclasses import dataclass

import pytest
import torch

from sglang_fp4ext.moe.decode import plan as decode_plan
from sglang_fp4ext.moe.decode.config import DecodeConfig, DotDecodeConfig, GluonDecodeConfig
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import assert_close
from tests.kernel_cases import DEV, small_weights

MAX_REL, RMS_REL = 1e-2, 5e-3


def _weights(E, H, I):
    return small_weights(E, H, I, seed=1234)


def _routing(T, E, k, g, *, shared=False, drop=0.0, one_expert=None):
    """Distinct random experts per token; optional shared last column, -1 drops, one-expert mode."""
    n_routed = E - 1 if shared else E
    kr = k - 1 if shared else k
    ids = (
        torch.stack([torch.randperm(n_routed, generator=g)[:kr] for _ in range(T)])
        if T
        else (torch.zeros(0, kr, dtype=torch.long))
    )
    if one_expert is not None:
        ids[:, 0] = one_expert
        ids[:, 1:] = torch.where(ids[:, 1:] == one_expert, (one_expert + 1) % n_routed, ids[:, 1:])
    if drop:
        ids = torch.where(torch.rand(ids.shape, generator=g) < drop, -1, ids)
    if shared:
        ids = torch.cat([ids, torch.full((T, 1), E - 1, dtype=ids.dtype)], dim=1)
    w = torch.rand(T, k, generator=g) + 0.05
    return ids.to(torch.int32), w


@dataclass(frozen=True)
class Case:
    name: str
    E: int
    H: int
    I: int
    T: int
    k: int
    cfg: DecodeConfig | None = None
    shared: bool = False
    drop: float = 0.0
    one_expert: int | None = None


CASES = [
    Case("T1_k8_slots", E=16, H=256, I=128, T=1, k=8, cfg=DotDecodeConfig(grid="slots")),
    Case("T1_k8_heuristic", E=16, H=256, I=128, T=1, k=8),
    Case(
        "T5_k9_shared_drop_splitk_nonpow2",
        E=10,
        H=272,
        I=80,
        T=5,
        k=9,
        shared=True,
        drop=0.3,
        cfg=DotDecodeConfig(grid="slots", split_k1=2, split_k2=2, block_n1=32, block_n2=128),
    ),
    Case(
        "T7_k8_experts_grid_splitk",
        E=12,
        H=512,
        I=96,
        T=7,
        k=8,
        drop=0.2,
        cfg=DotDecodeConfig(grid="experts", split_k1=2, block_n1=128, block_n2=128, block_p=16),
    ),
    Case(
        "T20_all_on_one_expert",
        E=8,
        H=256,
        I=64,
        T=20,
        k=2,
        one_expert=3,
        cfg=DotDecodeConfig(grid="experts", block_t=16, block_p=16, split_k2=2),
    ),
    Case(
        "T5_k9_shared_drop_gemm2_tokens",
        E=10,
        H=272,
        I=80,
        T=5,
        k=9,
        shared=True,
        drop=0.3,
        cfg=DotDecodeConfig(grid="slots", split_k1=2, block_n2=32, gemm2="tokens"),
    ),
    Case(
        "T9_k8_drop_gemm2_tokens_bt16_multichunk",
        E=16,
        H=256,
        I=640,
        T=9,
        k=8,
        drop=0.5,
        cfg=DotDecodeConfig(grid="experts", block_t=16, gemm2="tokens"),
    ),
    Case(
        "T6_k9_experts_grid_both_splits",
        E=10,
        H=272,
        I=80,
        T=6,
        k=9,
        shared=True,
        drop=0.2,
        cfg=DotDecodeConfig(grid="experts", split_k1=2, split_k2=2),
    ),
    Case(  # GPU: the third-launch top-k sum, pair chunks split (interpreter: the dot family)
        "T20_k9_experts_split2_combine_kernel_split_t",
        E=10,
        H=272,
        I=80,
        T=20,
        k=9,
        shared=True,
        drop=0.2,
        cfg=GluonDecodeConfig(grid="experts", split_k1=2, split_k2=2, combine="kernel", split_t=2),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_reference(case, seed):
    g = torch.Generator().manual_seed(seed)
    w, pw = _weights(case.E, case.H, case.I)
    ids, tw = _routing(
        case.T, case.E, case.k, g, shared=case.shared, drop=case.drop, one_expert=case.one_expert
    )
    x = torch.randn(case.T, case.H, generator=g).to(torch.bfloat16)
    x, ids, tw = x.to(DEV), ids.to(DEV), tw.to(DEV)
    out = torch.full((case.T, case.H), float("nan"), dtype=torch.bfloat16, device=DEV)  # poison
    res = fused_moe_nvfp4(x, pw, ids, tw, out=out, config=case.cfg)
    assert res is out
    ref = fused_moe_nvfp4_torch(x, w, ids, tw)
    st = assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=case.name)
    print(case.name, st)
    # Graph safety: every arrival counter is back at zero after the call.
    for name in ("cnt1", "cnt2"):
        buf = decode_plan._WORKSPACES.get((str(out.device), name))
        assert buf is None or int(buf.abs().sum()) == 0, f"{name} not reset"


@pytest.mark.parametrize("gemm2", ["pairs", "tokens"])
def test_no_local_expert_gives_zeros_and_deterministic_repeat(seed, gemm2):
    """EP rank with nothing local for some tokens: their rows are zeros; repeat is bit-identical."""
    g = torch.Generator().manual_seed(seed)
    w, pw = _weights(16, 256, 128)
    ids, tw = _routing(3, 16, 8, g)
    ids[1] = -1
    x = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    x, ids, tw = x.to(DEV), ids.to(DEV), tw.to(DEV)
    cfg = DotDecodeConfig(gemm2=gemm2)
    out = torch.full((3, 256), float("nan"), dtype=torch.bfloat16, device=DEV)
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=cfg)
    assert out[1].eq(0).all()
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL)
    again = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))
    everything_dropped = torch.full_like(ids, -1)
    z = fused_moe_nvfp4(x, pw, everything_dropped, tw, config=cfg)
    assert z.eq(0).all()


def test_int64_ids_bf16_weights(seed):
    g = torch.Generator().manual_seed(seed)
    w, pw = _weights(16, 256, 128)
    ids, tw = _routing(2, 16, 8, g)
    x = torch.randn(2, 256, generator=g).to(torch.bfloat16)
    x, ids, tw = x.to(DEV), ids.long().to(DEV), tw.to(torch.bfloat16).to(DEV)
    out = fused_moe_nvfp4(x, pw, ids, tw)
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL)


def test_zero_tokens_returns_empty():
    _, pw = _weights(16, 256, 128)
    x = torch.empty(0, 256, dtype=torch.bfloat16, device=DEV)
    ids = torch.empty(0, 8, dtype=torch.int32, device=DEV)
    out = fused_moe_nvfp4(x, pw, ids, torch.empty(0, 8, device=DEV))
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16


def test_validation_errors():
    w, pw = _weights(16, 256, 128)
    x = torch.zeros(2, 256, dtype=torch.bfloat16, device=DEV)
    ids = torch.zeros(2, 8, dtype=torch.int32, device=DEV)
    tw = torch.ones(2, 8, device=DEV)
    with pytest.raises(TypeError, match="PreparedMoEWeights"):
        fused_moe_nvfp4(x, w, ids, tw)
    with pytest.raises(ValueError, match="bfloat16"):
        fused_moe_nvfp4(x.float(), pw, ids, tw)
    with pytest.raises(ValueError, match="hidden size"):
        fused_moe_nvfp4(torch.zeros(2, 128, dtype=torch.bfloat16, device=DEV), pw, ids, tw)
    with pytest.raises(ValueError, match="topk_ids must be int32 or int64"):
        fused_moe_nvfp4(x, pw, ids.float(), tw)
    with pytest.raises(ValueError, match=r"\(T, top_k\)"):
        fused_moe_nvfp4(x, pw, ids[:1], tw[:1])
    with pytest.raises(ValueError, match="contiguous"):
        fused_moe_nvfp4(x, pw, ids.t().contiguous().t(), tw)
    with pytest.raises(ValueError, match="out must be"):
        fused_moe_nvfp4(x, pw, ids, tw, out=torch.empty(3, 256, dtype=torch.bfloat16, device=DEV))
    with pytest.raises(ValueError, match="topk_weights must be"):
        fused_moe_nvfp4(x, pw, ids, tw.to(torch.int32))


def test_decode_bit_exact_vs_torch_twin(seed):
    """The kernels' in-register decode (inline PTX on a GPU, the fp32 bit trick under the
    interpreter) including the K permutation equals the torch twin bit for bit: every byte value
    and random non-negative e4m3 scales (incl. subnormal, zero and -0 scale bytes; zero-scale
    blocks' codes are zeroed by the layout), times 2^-26."""
    from sglang_fp4ext.moe.decode import _dot_kernels as K
    from sglang_fp4ext.moe.layout import dequantize_kernel_matrix, prepare_matrix

    g = torch.Generator().manual_seed(seed)
    E, N, Kd = 1, 64, 512
    q = torch.randint(0, 256, (E, N, Kd // 2), dtype=torch.uint8, generator=g)
    q[0, 0, :] = torch.arange(256, dtype=torch.uint8)  # every byte value in one row
    sb = torch.randint(0, 256, (E, N, Kd // 16), dtype=torch.uint8, generator=g)
    sb &= 0x7F  # block scales are >= 0
    sb[sb == 0x7F] = 0x38  # no NaN scales
    sb[0, 1, :8] = torch.tensor([0, 1, 2, 7, 0x80, 0x03, 0x08, 0x7E], dtype=torch.uint8)
    m = prepare_matrix(q, sb.view(torch.float8_e4m3fn), torch.ones(E, N))
    ref = dequantize_kernel_matrix(m)[0] * 2.0**-26
    dev = torch.device(DEV)
    out = torch.full((m.n_pad, m.k_pad), float("nan"), device=dev)
    qd, sd = m.q.to(dev), m.scale.to(dev)
    from sglang_fp4ext.target_info import is_interpreter

    K._decode_probe[(m.n_pad // 32, m.k_pad // 256)](
        qd[0],
        sd[0],
        out,
        m.k_pad // 256,
        qd.stride(1),
        sd.stride(1),
        BN=32,
        COMPUTE_F32=is_interpreter(),
        num_warps=2,
    )
    got = out.cpu()[:N, :Kd]
    assert torch.equal(got, ref), (got - ref).abs().max()


def test_scale_code_decode_gpu_and_interpreter_forms_agree():
    """``_scale_bf16``'s GPU form (16-bit multiply-add, bf16 bitcast) and its interpreter form
    (fp32 bits) give the same value for every scale code, and that value is the layout twin's
    scale times 2^100. (On a GPU the kernel runs compiled; on the CPU the interpreter executes
    the GPU form's integer ops too.)"""
    from sglang_fp4ext.moe.decode import _dot_kernels as K
    from sglang_fp4ext.moe.layout import scale_code_values

    codes = torch.zeros(256, dtype=torch.uint8)
    codes[:150] = torch.arange(1, 151, dtype=torch.uint8)  # every non-zero code (0: zero scale)
    out = torch.full((2, 256), float("nan"), device=DEV)  # poison
    K._scale_probe[(1,)](codes.to(DEV), out[0], out[1], N=256)
    gpu, interp = out[0, :150].cpu(), out[1, :150].cpu()
    assert torch.equal(gpu, interp)
    assert torch.equal(gpu * 2.0**-100, scale_code_values(codes[:150]))


def test_grown_workspace_keeps_the_old_buffer_alive():
    """A graph captured before a workspace grew still points at the old buffer: it must not be
    freed (SGLang captures the largest batch first, then warms smaller ones up eagerly)."""
    decode_plan.clear_workspaces()
    dev = torch.device("cpu")
    ptr = decode_plan._workspace(dev, "probe", 8, torch.float32, zero=False).data_ptr()
    grown = decode_plan._workspace(dev, "probe", 64, torch.float32, zero=False)
    assert grown.data_ptr() != ptr
    assert any(t.data_ptr() == ptr for t in decode_plan._RETIRED)
    assert (
        decode_plan._workspace(dev, "probe", 16, torch.float32, zero=False).data_ptr()
        == grown.data_ptr()
    )
    decode_plan.clear_workspaces()
