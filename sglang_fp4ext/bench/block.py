"""The MoE block as SGLang 0.5.23 runs it for NVIDIA's GLM-5 NVFP4 checkpoints: the per-layer time
a user gets, and the share of it the routed experts own.

NVIDIA's checkpoints keep the shared expert in bf16, so SGLang does not fuse it
(``shared_fusion.py``) and ``DeepseekV2MoE.forward_normal_dual_stream`` runs, in this order:

* main stream: the router's bf16 gate (``F.linear``) and its top-k (sigmoid scores, the
  correction bias for the choice, the unbiased scores renormalised and scaled by
  ``routed_scaling_factor``; one Triton launch, as SGLang's fused gate kernel is one), then the
  routed experts (the NVFP4 MoE under test);
* alternate stream, issued after the routed experts: the shared expert as SGLang's
  ``DeepseekV2MLP`` computes it (gate_up ``F.linear``, SiLU·mul, down ``F.linear``; TP-sharded
  over the server's ``tp`` like every dense layer, ``I / 8`` at TP8 and at EP8);
* the main stream waits for the alternate one, then adds.

SGLang's own kernels for the top-k and the SiLU·mul (``sgl_kernel``) are not a dependency of
this package: the top-k is this module's one Triton launch and the SiLU·mul two torch ops, so
the non-MoE share is if anything overstated. The tensor-parallel all-reduce after the block
(one GPU here) is not timed.

:class:`MoEBlock` adds a router and a shared expert to each layer copy of a
:class:`~sglang_fp4ext.bench.layer.Layer` (inputs rotated beyond the L2, as for the layer alone);
:meth:`MoEBlock.step` takes the routed experts as ``routed(x, copy, ids, weights, i)``, so fp4ext
and each peer run in the same block. :func:`block_rows` times one implementation's block, its
routed experts alone on the router's own ids, and the shared expert alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
import triton

from sglang_fp4ext import roofline
from sglang_fp4ext.bench.layer import Layer

__all__ = ["ROUTED_SCALING_FACTOR", "MoEBlock", "block_rows", "verify_of"]

# GLM-5's (and DeepSeek-V3's) routed_scaling_factor; a scalar in the top-k weights, not a cost.
ROUTED_SCALING_FACTOR = 2.5

Routed = Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor, int], torch.Tensor]


def verify_of(T: int, factors: Sequence[int] = (2, 4)) -> list[str]:
    """The MTP verify sizes ``T`` is: ``bs x (draft + 1)`` for each factor that divides it."""
    return [f"{T // f}x{f}" for f in factors if T % f == 0]


class MoEBlock:
    """A router and a bf16 shared expert on each copy of ``layer`` (weights N(0, 1/fan_in), the
    gate's correction bias N(0, 0.01)); the routed experts are the caller's."""

    def __init__(self, layer: Layer):
        shape = layer.shape
        if shape.fuse_shared:
            raise ValueError(
                f"{shape.name}: the shared expert is fused into the routed experts; the block "
                "benchmark is for checkpoints that keep it bf16 (SGLang does not fuse those)"
            )
        self.layer, self.shape = layer, shape
        dev, H = layer.device, shape.hidden
        self.I_shared = shape.moe_intermediate * shape.n_shared // (shape.tp * shape.ep)
        g = torch.Generator(device=dev).manual_seed(layer.seed * 7919 + 1)

        def w(n, k):
            return (torch.randn(n, k, device=dev, generator=g) / k**0.5).to(torch.bfloat16)

        self.gate = [w(shape.n_experts, H) for _ in range(layer.copies)]
        self.bias = [
            0.01 * torch.randn(shape.n_experts, device=dev, generator=g)
            for _ in range(layer.copies)
        ]
        self.w13 = [w(2 * self.I_shared, H) for _ in range(layer.copies)] if self.I_shared else []
        self.w2 = [w(H, self.I_shared) for _ in range(layer.copies)] if self.I_shared else []
        self.alt = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def route(self, x: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy ``c``'s router: ``(ids int32 (T, k), weights fp32)`` as rank 0 sees them (EP:
        other ranks' experts are -1). The gate is one bf16 ``F.linear``, the top-k one Triton
        launch (``_router_kernels``), as SGLang runs them (a GEMM, then its fused gate kernel)."""
        from sglang_fp4ext.bench._router_kernels import _biased_topk

        s = self.shape
        logits = F.linear(x, self.gate[c])
        T, k = x.shape[0], s.top_k
        ids = torch.empty(T, k, dtype=torch.int32, device=x.device)
        tw = torch.empty(T, k, dtype=torch.float32, device=x.device)
        if T:
            _biased_topk[(T,)](
                logits, self.bias[c], ids, tw, s.n_experts, s.n_experts // s.ep,
                ROUTED_SCALING_FACTOR, TOP_K=k, BLOCK_E=triton.next_power_of_2(s.n_experts),
            )  # fmt: skip
        return ids, tw

    def route_torch(self, x: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`route` in torch ops (its twin): sigmoid scores, the top-k of score + bias, the
        unbiased scores renormalised and scaled by ``ROUTED_SCALING_FACTOR``."""
        scores = F.linear(x, self.gate[c]).float().sigmoid()
        ids = (scores + self.bias[c]).topk(self.shape.top_k, dim=1).indices
        tw = scores.gather(1, ids)
        tw = tw * (ROUTED_SCALING_FACTOR / tw.sum(dim=1, keepdim=True))
        local = self.shape.n_experts // self.shape.ep
        return torch.where(ids < local, ids, -1).to(torch.int32), tw

    def shared(self, x: torch.Tensor, c: int) -> torch.Tensor:
        """Copy ``c``'s shared expert: ``down(silu(gate) * up)``."""
        gu = F.linear(x, self.w13[c])
        g, u = gu.split(self.I_shared, dim=1)
        return F.linear(F.silu(g) * u, self.w2[c])

    def step(self, T: int, routed: Routed, *, shared: bool = True) -> Callable[[int], object]:
        """Input ``i``'s block on copy ``i % copies``: router, ``routed``, and (``shared``) the
        shared expert on the alternate stream, joined before the add."""
        xs, _, _ = self.layer.inputs(T)
        copies = self.layer.copies

        def run(i):
            c = i % copies
            x = xs[i]
            if self.alt is None:  # CPU: one stream
                ids, tw = self.route(x, c)
                out = routed(x, c, ids, tw, i)
                return out.add_(self.shared(x, c)) if shared else out
            cur = torch.cuda.current_stream()
            if shared:
                self.alt.wait_stream(cur)
            ids, tw = self.route(x, c)
            out = routed(x, c, ids, tw, i)
            if not shared:
                return out
            with torch.cuda.stream(self.alt):
                s = self.shared(x, c)
            cur.wait_stream(self.alt)
            return out.add_(s)

        return run

    def fp4ext(self, T: int) -> Routed:
        """fp4ext's routed experts on the path and config the dispatcher serves for ``T``."""
        return self.layer.routed(T)

    def check(
        self, T: int, routed: Routed, *, pack=None, rms: float = 5e-3, max_rel: float = 1e-2
    ) -> dict:
        """The block on input 0 (its output NaN-poisoned first where ``routed`` writes into the
        layer's buffers) against the fp32 twin of the routed experts plus the same shared
        expert. ``pack``: the weights ``routed`` computes on copy 0 where they are not the
        layer's (a peer's own format). Tolerances as ``Layer.check`` (a wrong expert, slot or
        weight is O(1)); a peer with a looser epilogue passes its own."""
        from sglang_fp4ext.compare import error_stats
        from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

        xs, _, outs = self.layer.inputs(T)
        outs[0].fill_(float("nan"))
        got = self.step(T, routed)(0)
        if self.alt is not None:
            torch.cuda.current_stream().synchronize()
        ids, tw = self.route(xs[0], 0)
        ref = fused_moe_nvfp4_torch(xs[0], pack or self.layer.packs[0], ids, tw)
        ref = ref + self.shared(xs[0], 0).float()
        st = error_stats(got, ref)
        ok = st.nonfinite == 0 and st.rms_rel <= rms and st.max_rel <= max_rel
        return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}

    def routes(self, T: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The router's ids and weights for every input (eager): the routed experts alone are
        timed on these, and the bytes count their distinct experts."""
        xs, _, _ = self.layer.inputs(T)
        return [self.route(x, i % self.layer.copies) for i, x in enumerate(xs)]

    def bytes(self, T: int, routes) -> dict:
        """Bytes one block call moves at least, by part (bf16 weights, NVFP4 routed experts,
        activations; the routed part counts the router's distinct local experts)."""
        s = self.shape
        distinct = sum(roofline.distinct_experts(ids) for ids, _ in routes) / len(routes)
        act = 2 * T * s.hidden * 2
        parts = {
            "router": s.n_experts * s.hidden * 2 + s.n_experts * 4,
            "routed": s.bytes_floor(distinct, tokens=T),
            "shared": 3 * s.hidden * self.I_shared * 2 + act,
        }
        return {"distinct": distinct, **parts, "block": sum(parts.values())}


def block_rows(
    block: MoEBlock,
    T: int,
    impls: dict[str, Routed],
    *,
    copy_bw_Bps: float,
    replays: int = 20,
) -> dict:
    """One token count: per implementation the block, its routed experts alone (on the router's
    ids) and their share; the shared expert and the router alone; bytes and % of the copy
    bandwidth. Times are CUDA-graph replay, us per call."""
    from sglang_fp4ext.graph_timing import time_graph_replay

    n = block.layer.n_inputs(T)
    routes = block.routes(T)
    xs = block.layer.inputs(T)[0]
    nbytes = block.bytes(T, routes)

    def pct(nb, us):
        return 100 * roofline.bandwidth_fraction(nb, us, copy_bw_Bps)

    def us(step):
        return time_graph_replay(step, n, replays=replays).us_per_call

    def alone(routed):
        return lambda i: routed(xs[i], i % block.layer.copies, *routes[i], i)

    shared_us = us(lambda i: block.shared(xs[i], i % block.layer.copies))
    router_us = us(lambda i: block.route(xs[i], i % block.layer.copies))
    row = {"T": T, "verify_of": verify_of(T), "inputs_rotated": n, "bytes": nbytes}
    row["shared_us"], row["router_us"] = shared_us, router_us
    row["impls"] = {}
    for name, routed in impls.items():
        b, r = us(block.step(T, routed)), us(alone(routed))
        row["impls"][name] = {
            "block_us": b,
            "routed_us": r,
            "routed_share": r / b,
            "block_pct_copy_bw": pct(nbytes["block"], b),
            "routed_pct_copy_bw": pct(nbytes["routed"], r),
        }
    return row
