"""The ``triton_kernels`` MXFP4 MoE peer of the benchmark suite (``bench/tk_peer.py``).

CPU tier: the availability rule, one test per refusal (triton_kernels missing, the pre-3.8 API,
another Triton, no GPU, another architecture) and its answer on this machine; the NVFP4 ->
MXFP4 re-quantisation bit-exact against a direct computation (nearest E2M1, ties to even,
scale 2^ceil(log2(amax / 6))); exact when the NVFP4 values fit MXFP4, so the MXFP4 oracle
equals the project's NVFP4 twin there; what the peer hands triton_kernels' layouts (shapes,
dtypes, K-major strides, Hopper scale padding, SwiGLU bias); the routing inputs and
triton_kernels' own routing kernels (run under the interpreter) against the ids, including a
torch MoE driven by exactly those gather/scatter/gate indices. triton_kernels' matmul kernels
need the GPU: the GPU-tier test runs the peer against the fp32 MXFP4 oracle where it can
(neither this machine, no GPU, nor the H200 box, Triton 3.6 without triton_kernels, can).
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4ext.bench import tk_availability as avail
from sglang_fp4ext.bench import tk_peer
from sglang_fp4ext.bench.tk_availability import TKEnvironment
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.weights import MoEWeights, random_moe_weights

HERE = "/venv/site-packages/triton_kernels"
OK = TKEnvironment("3.8.0", HERE, "matmul", (9, 0))
P = avail.TK_PEER

# ---- availability ------------------------------------------------------------------------------


def _env(**kw):
    return TKEnvironment(**{**OK.__dict__, **kw})


def test_reason_none_where_it_can_run():
    for cap in ((9, 0), (10, 0), (10, 3)):
        assert avail.tk_unavailable_reason(_env(capability=cap)) is None
    assert avail.tk_unavailable_reason(_env(triton="3.8.1+git1234")) is None


def test_reason_triton_kernels_missing():
    got = avail.tk_unavailable_reason(_env(triton="3.6.0", tk_path=None, tk_api=None))
    assert got == (
        f"{P}: triton_kernels not importable on this machine (Triton 3.6.0; this peer calls the "
        "triton_kernels shipped with Triton 3.8)"
    )
    got = avail.tk_unavailable_reason(_env(triton=None, tk_path=None, tk_api=None))
    assert "(no Triton;" in got


def test_reason_old_api():
    got = avail.tk_unavailable_reason(_env(triton="3.6.0", tk_api="matmul_ogs"))
    assert got == (
        f"{P}: triton_kernels at {HERE} has the matmul_ogs API; this peer calls the Triton 3.8 "
        "API (triton_kernels.matmul)"
    )
    assert "has no triton_kernels.matmul;" in avail.tk_unavailable_reason(_env(tk_api=None))


@pytest.mark.parametrize("triton", ["3.6.0", "3.7.1", "3.9.0", "4.0.0", None])
def test_reason_triton_version(triton):
    got = avail.tk_unavailable_reason(_env(triton=triton))
    have = f"Triton {triton}" if triton else "no Triton"
    assert got == (
        f"{P}: the installed triton_kernels is written for Triton 3.8, this machine has {have}"
    )


def test_reason_without_gpu():
    got = avail.tk_unavailable_reason(_env(capability=None))
    assert got == f"{P}: no CUDA GPU on this machine"


@pytest.mark.parametrize("cap", [(8, 0), (8, 9), (12, 0), (12, 1), (11, 0)])
def test_reason_by_architecture(cap):
    got = avail.tk_unavailable_reason(_env(capability=cap))
    assert got == (
        f"{P}: needs sm_90 (Hopper MXFP4 layouts) or sm_100 (Blackwell), this GPU is "
        f"sm_{cap[0]}{cap[1]}"
    )


def test_reasons_come_in_order():
    """The H200 box: Triton 3.6, no triton_kernels, a GPU -> the import reason names Triton."""
    got = avail.tk_unavailable_reason(TKEnvironment("3.6.0", None, None, (9, 0)))
    assert "not importable" in got and "Triton 3.6.0" in got
    got = avail.tk_unavailable_reason(TKEnvironment("3.6.0", HERE, "matmul", None))
    assert "written for Triton 3.8" in got  # the version before the missing GPU


def test_availability_on_this_machine():
    import importlib.util

    from sglang_fp4ext import target_info

    env = avail.probe_environment()
    assert env.capability == target_info.device_capability()
    if importlib.util.find_spec("triton_kernels") is None:
        assert env.tk_path is None
    else:
        import triton

        assert env.triton == triton.__version__ and env.tk_path.endswith("triton_kernels")
    assert avail.tk_peer_unavailable() == avail.tk_unavailable_reason(env)
    if not target_info.has_cuda_gpu():
        assert avail.tk_peer_unavailable() is not None
        w = random_moe_weights(2, 64, 32, generator=torch.Generator().manual_seed(0))
        with pytest.raises(RuntimeError) as exc:
            tk_peer.make_tk_peer(w)
        assert str(exc.value) == avail.tk_peer_unavailable()


# ---- NVFP4 -> MXFP4 ------------------------------------------------------------------------------

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _mxfp4_direct(v: torch.Tensor):
    """Direct MXFP4 of fp32 ``v`` (..., K) along K: per 32, scale exponent ceil(log2(amax / 6))
    (E8M0 byte e + 127; 0 for an all-zero block), codes the nearest E2M1 of v / 2^e with ties to
    the even code, sign bit 8 (also for -0.0), element 2j in the low nibble of byte j."""
    blocks = v.reshape(*v.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    m, ex = torch.frexp(amax / 6.0)  # amax / 6 = m * 2^ex, m in [0.5, 1)
    e = torch.where(m == 0.5, ex - 1, ex)
    zero = amax == 0
    scale_byte = torch.where(zero, 0, e + 127).squeeze(-1).to(torch.uint8)
    q = torch.where(zero, 0.0, blocks / torch.exp2(e.float()))
    dist = (q.abs().unsqueeze(-1) - E2M1).abs()
    best = dist.min(-1, keepdim=True).values
    tie = dist == best
    # among the nearest grid points prefer the even code (ties to even)
    code = torch.where(tie, torch.arange(8) + 8 * (torch.arange(8) % 2), 99).argmin(-1)
    code = code + 8 * torch.signbit(q).long()
    code = code.reshape(v.shape).to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed, scale_byte


def test_direct_quantiser_hand_cases():
    v = torch.zeros(64)
    v[:8] = torch.tensor([6.0, -3.0, 0.25, 0.75, 1.25, 2.5, 5.0, -0.0])  # amax 6: scale 2^0
    v[32] = 12.0  # second block: scale 2^1, 12 -> code 7
    packed, s = _mxfp4_direct(v)
    assert s.tolist() == [127, 128]
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(-1)
    assert codes[:8].tolist() == [7, 8 + 5, 0, 2, 2, 4, 6, 8]
    assert codes[32] == 7 and int(codes[33:].sum()) == 0


def _weights(seed, E=3, H=64, I=32):
    return random_moe_weights(E, H, I, generator=torch.Generator().manual_seed(seed))


def test_requantisation_bit_exact(seed):
    pytest.importorskip("triton_kernels")
    w = _weights(seed)
    mx = tk_peer.mxfp4_from_nvfp4(w, max_elems=64 * 32 * 3)  # one expert per chunk: 3 chunks
    w13, w2 = w.dequantize()
    w13 = tk_peer.interleave_gate_up(w13.to(torch.bfloat16).float())
    for got, want in (
        ((mx.w13, mx.w13_scale), _mxfp4_direct(w13)),
        ((mx.w2, mx.w2_scale), _mxfp4_direct(w2.to(torch.bfloat16).float())),
    ):
        assert got[0].dtype == torch.uint8 and got[1].dtype == torch.uint8
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert mx.w13.shape == (3, 64, 32) and mx.w13_scale.shape == (3, 64, 2)
    assert mx.w2.shape == (3, 64, 16) and mx.w2_scale.shape == (3, 64, 1)


def test_interleave_gate_up():
    w = torch.arange(2 * 6 * 1).reshape(2, 6, 1)  # I = 3: rows [g0 g1 g2 u0 u1 u2]
    got = tk_peer.interleave_gate_up(w)[..., 0]
    assert got.tolist() == [[0, 3, 1, 4, 2, 5], [6, 9, 7, 10, 8, 11]]


def _pow2_pack(seed, E=3, H=64, I=64):
    """An NVFP4 pack whose values MXFP4 holds exactly: per 32 along K one power-of-two block
    scale (both 16-blocks), power-of-two globals."""
    g = torch.Generator().manual_seed(seed)

    def scales(*shape):
        e = torch.randint(-3, 4, (*shape[:-1], shape[-1] // 2), generator=g).float()
        return torch.exp2(e).repeat_interleave(2, -1).to(torch.float8_e4m3fn)

    def codes(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)

    return MoEWeights(
        w13=codes(E, 2 * I, H // 2), w13_scale=scales(E, 2 * I, H // 16),
        w13_scale_2=torch.exp2(torch.randint(-6, -3, (E, 2), generator=g).float()),
        w2=codes(E, H, I // 2), w2_scale=scales(E, H, I // 16),
        w2_scale_2=torch.exp2(torch.randint(-6, -3, (E,), generator=g).float()),
    )  # fmt: skip


def test_mxfp4_exact_where_nvfp4_fits_and_oracle_matches_twin(seed):
    """Conversion, gate/up interleave and the MXFP4 oracle against the project's NVFP4 twin."""
    pytest.importorskip("triton_kernels")
    w = _pow2_pack(seed)
    mx = tk_peer.mxfp4_from_nvfp4(w)
    a13, a2 = mx.dequantize()
    b13, b2 = w.dequantize()
    assert torch.equal(a13, tk_peer.interleave_gate_up(b13)) and torch.equal(a2, b2)
    g = torch.Generator().manual_seed(seed + 1)
    T, k, E = 7, 2, 3
    x = torch.randn(T, 64, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int()
    ids[0, 1] = -1  # EP: another rank's expert
    tw = torch.rand(T, k, generator=g)
    got = tk_peer.fused_moe_mxfp4_torch(x, mx, ids, tw)
    torch.testing.assert_close(got, fused_moe_nvfp4_torch(x, w, ids, tw), rtol=1e-5, atol=1e-5)


def test_layout_inputs_shapes_and_padding(seed):
    """What is wrapped and converted (SGLang's _swizzle_mxfp4 inputs): K-major uint8 views;
    Hopper scales padded to whole 128-wide K tiles with E8M0 one. I = 160: 5 -> 8 columns."""
    pytest.importorskip("triton_kernels")
    E, H, I = 2, 128, 160
    mx = tk_peer.mxfp4_from_nvfp4(_weights(seed, E, H, I))
    for hopper, s2_cols in ((False, I // 32), (True, 8)):
        w13, s13, w2, s2 = tk_peer.layout_inputs(mx, hopper=hopper)
        assert w13.shape == (E, H // 2, 2 * I) and s13.shape == (E, H // 32, 2 * I)
        assert w2.shape == (E, I // 2, H) and s2.shape == (E, s2_cols, H)
        for t in (w13, s13, w2, s2):
            assert t.dtype == torch.uint8 and t.stride(-2) == 1
        assert torch.equal(s2[:, : I // 32], mx.w2_scale.transpose(-2, -1))
        assert bool((s2[:, I // 32 :] == 127).all())
        assert torch.equal(w13, mx.w13.transpose(-2, -1))
    b = tk_peer.swiglu_bias(2, 3)
    assert b.dtype == torch.float32 and b.tolist() == [[0.0, -1.0] * 3] * 2
    # the stock epilogue s * (u + b + 1) with that bias is silu(g) * u
    g, u = torch.randn(5), torch.randn(5)
    s = g * torch.sigmoid(g)
    torch.testing.assert_close(s * ((u + b[0, 1]) + 1), torch.nn.functional.silu(g) * u)


def test_layouts_accept_the_inputs(seed):
    """triton_kernels' Hopper layouts (built explicitly: the default-layout helpers ask the GPU)
    take what layout_inputs gives, and unswizzle back to it."""
    pytest.importorskip("triton_kernels")
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

    mx = tk_peer.mxfp4_from_nvfp4(_weights(seed, 2, 256, 128))
    w13, s13, _, _ = tk_peer.layout_inputs(mx, hopper=True)
    v = wrap_torch_tensor(w13, dtype=FP4)
    assert v.shape == [2, 256, 256]  # logical (E, K, N): two codes per byte along K
    vl = HopperMXValueLayout(mx_axis=-2, mma_version=3)
    sl = HopperMXScaleLayout(mx_axis=-2, num_warps=tk_peer.NUM_WARPS)
    for t, lay, fp4 in ((v, vl, True), (wrap_torch_tensor(s13), sl, False)):
        canonical = t.storage.layout.make_transformation(list(t.shape), fp4)
        canonical = canonical.unswizzle_data(t.storage.data)
        sw = convert_layout(t, lay)
        assert type(sw.storage.layout) is type(lay) and sw.shape == t.shape
        back = lay.make_transformation(list(t.shape), fp4).unswizzle_data(sw.storage.data)
        assert torch.equal(back, canonical)


# ---- routing -------------------------------------------------------------------------------------


def test_padded_top_k():
    assert [tk_peer.padded_top_k(k) for k in (1, 2, 3, 8, 9, 16)] == [1, 2, 4, 8, 16, 16]


def test_routing_inputs():
    ids = torch.tensor([[3, -1, 0], [1, 2, -1]], dtype=torch.int32)
    w = torch.tensor([[0.5, 0.25, 0.125], [0.75, 0.0625, 0.5]])
    scores, got = tk_peer.routing_inputs(ids, w, E=4)
    assert got.dtype == torch.int32 and got.tolist() == [[3, 5, 0, 7], [1, 2, 6, 7]]
    assert scores.shape == (2, 8) and scores.dtype == torch.float32
    want = torch.zeros(2, 8)
    want[0, [3, 5, 0]] = torch.tensor([0.5, 0.25, 0.125])
    want[1, [1, 2, 6]] = torch.tensor([0.75, 0.0625, 0.5])
    assert torch.equal(scores, want)


def _moe_from_metadata(x, mx, E, ragged, gather, scatter, gate, kp):
    """The MoE the two matmuls compute, in torch, driven only by the metadata the peer hands
    them: rows of slices < E, GEMM1 on x[gather], SwiGLU, GEMM2 times gate into slot
    scatter, summed over the kp slots of each token."""
    w13, w2 = mx.dequantize()
    T = x.shape[0]
    y = torch.zeros(T * kp, w2.shape[1])
    offs = ragged.slice_offs.tolist()
    for e in range(E):
        rows = torch.arange(offs[e], offs[e + 1])
        h = x[gather[rows].long()].float() @ w13[e].T
        a = torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2]
        y[scatter[rows].long()] = (a @ w2[e].T) * gate[rows].unsqueeze(1)
    return y.view(T, kp, -1).sum(1)


@pytest.mark.parametrize("k, ep", [(4, 1), (3, 1), (4, 2)])
def test_routing_metadata_drives_the_right_moe(seed, k, ep):
    """triton_kernels' topk / bitmatrix / ragged kernels (interpreter on the CPU) on the peer's
    inputs: per-expert slice sizes, every valid slot exactly once, skipped slots after slice E;
    a MoE driven by that metadata equals the MXFP4 oracle. k = 3 pads to 4; ep = 2 drops ids."""
    pytest.importorskip("triton_kernels")
    g = torch.Generator().manual_seed(seed)
    E, H, I, T = 6, 64, 32, 9
    mx = tk_peer.mxfp4_from_nvfp4(_weights(seed, E, H, I))
    ids = torch.stack([torch.randperm(E * ep, generator=g)[:k] for _ in range(T)]).int()
    ids = torch.where(ids < E, ids, -1)
    tw = torch.rand(T, k, generator=g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ragged, gather, scatter, gate, kp = tk_peer.tk_routing(ids, tw, E, ep_size=ep)
    assert kp == tk_peer.padded_top_k(k) and gather.shape == scatter.shape == (T * kp,)
    assert gather.dtype == scatter.dtype == torch.int32 and gate.dtype == torch.float32
    counts = torch.bincount(ids[ids >= 0].long(), minlength=E)
    assert ragged.slice_sizes[:E].tolist() == counts.tolist()
    n = int(counts.sum())
    assert int(ragged.slice_offs[E]) == n and ragged.slice_sizes.shape == (E + kp,)
    assert ragged.expected_slice_size == max(1, T * k // (E * ep))
    valid = scatter[:n].long()
    assert sorted(valid.tolist()) == sorted(
        (t * kp + j) for t in range(T) for j in range(k) if ids[t, j] >= 0
    )
    assert torch.equal(gather[:n].long(), valid // kp)
    assert torch.equal(ids[valid // kp, valid % kp].long().sort().values,
                       ids[ids >= 0].long().sort().values)  # fmt: skip
    assert torch.equal(gate[:n], tw[valid // kp, valid % kp])
    got = _moe_from_metadata(x, mx, E, ragged, gather, scatter, gate, kp)
    torch.testing.assert_close(
        got, tk_peer.fused_moe_mxfp4_torch(x, mx, ids, tw), rtol=1e-5, atol=1e-5
    )


# ---- GPU tier ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("k, ep", [(4, 1), (3, 1), (4, 2)])
def test_peer_matches_mxfp4_oracle(seed, k, ep):
    """The peer on the GPU (Hopper / Blackwell, Triton 3.8) against the fp32 MXFP4 oracle; bf16
    between the GEMMs and at the output, as in serving (rms 2-3e-3 measured with v3.6)."""
    reason = avail.tk_peer_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from sglang_fp4ext.bench import random_packed_weights
    from sglang_fp4ext.testing.compare import error_stats

    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I, T = 8, 512, 256, 37
    w = random_packed_weights(E, H, I, device="cuda", generator=g)
    peer = tk_peer.make_tk_peer(w, ep_size=ep, keep_mx=True)
    scores = torch.rand(T, E * ep, device="cuda", generator=g)
    tw, ids = scores.topk(k, dim=1)
    ids = torch.where(ids < E, ids, -1).int()
    tw = (tw / tw.sum(1, keepdim=True)).float()
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    out = peer(x, ids, tw)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    st = error_stats(out, tk_peer.fused_moe_mxfp4_torch(x, peer.mx, ids, tw))
    assert st.nonfinite == 0 and st.rms_rel <= 1e-2 and st.max_rel <= 5e-2, st


def test_suite_times_the_peer_before_fp4ext():
    """The suite collects the peer in every (preset, T) group, after the other peers and
    before fp4ext, so fp4ext's speedup_vs can hold the ratio to it."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[1] / "benchmarks/test_moe_bench.py"
    spec = importlib.util.spec_from_file_location("_moe_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    opts = {"--fp4ext-presets": "glm5-tp8", "--fp4ext-tokens": "1,8", "--fp4ext-paths": "decode"}
    got = {}
    meta = SimpleNamespace(
        fixturenames=["case"],
        config=SimpleNamespace(getoption=opts.get),
        parametrize=lambda name, cases, ids: got.update(cases=cases),
    )
    mod.pytest_generate_tests(meta)
    for T in (1, 8):
        impls = [i for _, t, i in got["cases"] if t == T]
        assert impls.index(P) == impls.index("fp4ext-decode") - 1 and impls.index(P) > 0
