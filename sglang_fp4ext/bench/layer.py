"""The measured MoE layer of ``fp4ext bench`` and ``fp4ext tune``: random NVFP4 layer copies,
inputs rotated beyond the L2, and the steps the timer replays (fp4ext on either path, the torch
bf16 peer, SGLang's peers), each checkable against the fp32 torch twin.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from sglang_fp4ext import roofline
from sglang_fp4ext.bench.report import dispatch_path
from sglang_fp4ext.model_shapes import ModelShape

__all__ = ["Layer", "make_routing"]


def make_routing(shape: ModelShape, tokens: int, *, device, generator=None):
    """Uniform top-k over the model's routed experts as rank 0 of the layout sees it.

    EP: ids of other ranks become -1. Fused shared expert(s) (TP): extra columns with the local
    ids after the routed ones, weight 1. Returns ``(topk_ids int32 (T, top_k_local), topk_weights
    fp32, distinct local experts)``.
    """
    scores = torch.rand(tokens, shape.n_experts, device=device, generator=generator)
    w, ids = scores.topk(shape.top_k, dim=1)
    w = w / w.sum(dim=1, keepdim=True)
    local = shape.n_experts // shape.ep
    ids = torch.where(ids < local, ids, -1)
    if shape.fuse_shared:
        shared = torch.arange(local, local + shape.n_shared, device=device).expand(tokens, -1)
        ids = torch.cat([ids, shared], dim=1)
        w = torch.cat([w, torch.ones(tokens, shape.n_shared, device=device)], dim=1)
    ids = ids.to(torch.int32).contiguous()
    return ids, w.float().contiguous(), roofline.distinct_experts(ids)


class Layer:
    """``copies`` random NVFP4 copies of ``shape``'s per-GPU MoE layer on ``device`` (the GPU;
    the CPU tier uses the interpreter at a tiny shape), prepared for the kernels, plus (lazily)
    the torch bf16 peer of each copy; inputs per token count.

    L2: at small T a call touches only a few experts (GLM-5 TP8, T = 1: 8 x 2.65 MB), so a few
    copies with one routing each would stay in a 60-128 MB L2 across replays. Each token count
    therefore gets ``n_inputs(T)`` = ``copies x rotations`` inputs (x, routing, output), input
    ``i`` on copy ``i % copies``, with rotations chosen so the bytes one pass touches exceed
    ``L2_FACTOR`` x the L2 size. It depends on the GPU and T only (expected, not measured,
    distinct experts), so a graph of one pass is the same from run to run.
    """

    L2_FACTOR = 3
    MAX_ROTATIONS = 16

    def __init__(
        self, shape: ModelShape, copies: int, *, seed: int = 2026, device="cuda", l2_bytes=None
    ):
        from sglang_fp4ext.bench import random_packed_weights
        from sglang_fp4ext.moe.prepared import PreparedMoEWeights

        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        self.shape, self.copies, self.device = shape, copies, torch.device(device)
        if l2_bytes is None:
            l2_bytes = 0
            if self.device.type == "cuda":
                l2_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size
        self.l2_bytes = l2_bytes
        self.seed = seed
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.packs = [
            random_packed_weights(
                shape.E_local, shape.hidden, shape.I_local, device=self.device, generator=self.gen
            )
            for _ in range(copies)
        ]
        self.prepared = [PreparedMoEWeights.from_moe_weights(p, shape.ep) for p in self.packs]
        self._peers = None
        self._sglang: dict[str, list] = {}
        self._inputs: dict[int, tuple] = {}

    def n_inputs(self, T: int) -> int:
        """Inputs rotated for ``T`` tokens (see the class docstring)."""
        per_call = self.shape.bytes_floor(self.shape.expected_distinct(T), tokens=T)
        want = self.L2_FACTOR * self.l2_bytes / (self.copies * max(per_call, 1.0))
        return self.copies * min(self.MAX_ROTATIONS, max(1, math.ceil(want)))

    def inputs(self, T: int):
        """``n_inputs(T)`` of: x (T, H) bf16 N(0, 1), routing, output; cached for the last T.

        Drawn from a generator seeded by (seed, T) alone, so a run times the same routings
        whichever token counts, presets or cases ran before it: a regression gate compares equal
        work. (Drawn from the shared stream, the H200 gate demo's EP8 T = 8 inputs hit 7.25
        distinct local experts per call against the baseline's 6.00 and read 12.8% slower with
        unchanged kernels; ``benchmarks/results/gate_demo_h200.log``.)
        """
        if T not in self._inputs:
            self._inputs.clear()
            g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + T)
            xs, routes, outs = [], [], []
            for _ in range(self.n_inputs(T)):
                x = torch.randn(T, self.shape.hidden, device=self.device, generator=g)
                xs.append(x.to(torch.bfloat16))
                routes.append(make_routing(self.shape, T, device=self.device, generator=g))
                outs.append(torch.empty_like(xs[-1]))
            self._inputs[T] = (xs, routes, outs)
        return self._inputs[T]

    def config(self, T: int, path: str = "decode"):
        """The config the kernels pick for ``T`` on ``path`` (table entry or heuristic), for the
        record."""
        from sglang_fp4ext.moe.tables import path_config

        return path_config(path, T, *self._moe_shape_target())

    def _moe_shape_target(self):
        from sglang_fp4ext.moe.shape import current_target

        mshape = self.prepared[0].shape(self.shape.top_k_local)
        target = current_target(self.device)
        return mshape, target

    def served_path(self, T: int) -> str:
        """The path the runner core (``moe.dispatch``) takes for ``T`` tokens on this layer."""
        return dispatch_path(T, *self._moe_shape_target())

    def ours(self, T: int, path: str | None = None) -> Callable[[int], object]:
        """Step over the inputs for fp4ext on ``path`` (default: the one served for ``T``) with
        the config :meth:`config` gives."""
        from sglang_fp4ext.moe import paths

        path = path or self.served_path(T)
        run = paths.get(path).launcher()
        cfg = self.config(T, path)
        xs, routes, outs = self.inputs(T)

        def step(i):
            ids, tw, _ = routes[i]
            return run(xs[i], self.prepared[i % self.copies], ids, tw, out=outs[i], config=cfg)

        return step

    def peer(self, T: int) -> Callable[[int], object]:
        from sglang_fp4ext.bench.peers import TorchGroupedMMMoE

        if self._peers is None:
            self._peers = [TorchGroupedMMMoE(p) for p in self.packs]
        xs, routes, _ = self.inputs(T)
        return lambda i: self._peers[i % self.copies](xs[i], routes[i][0], routes[i][1])

    def sglang_peer(self, T: int, name: str) -> Callable[[int], object]:
        """Step over the inputs for SGLang's peer ``name`` (``bench/peers.py``), one adapter per
        layer copy (built on first use; raises with the reason where it cannot run)."""
        from sglang_fp4ext.bench.peers import make_sglang_peer

        adapters = self._sglang.get(name)
        if adapters is None:
            # Own seed: the calibration (hence FlashInfer's scales) must not depend on run order.
            g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 - 1)
            calib = torch.randn(64, self.shape.hidden, device=self.device, generator=g)
            calib = calib.to(torch.bfloat16)
            adapters = [
                make_sglang_peer(name, p, x_calib=calib, ep_size=self.shape.ep) for p in self.packs
            ]
            self._sglang[name] = adapters
        xs, routes, _ = self.inputs(T)
        return lambda i: adapters[i % self.copies](xs[i], routes[i][0], routes[i][1])

    def check_sglang_peer(self, T: int, name: str) -> dict:
        """SGLang peer ``name`` on input 0 vs the fp32 twin of the pack it computes (W4A4 twin
        for FlashInfer, whose activations are NVFP4)."""
        from sglang_fp4ext.compare import error_stats
        from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

        out = self.sglang_peer(T, name)(0)
        adapter = self._sglang[name][0]
        w4a4 = adapter.w4a4
        xs, routes, _ = self.inputs(T)
        ref = fused_moe_nvfp4_torch(
            xs[0], adapter.weights, routes[0][0], routes[0][1], quantize_activations=w4a4
        )
        st = error_stats(out, ref)
        # W4A16 (marlin): bf16 output of fp32-accumulated GEMMs, as for fp4ext. W4A4: the
        # intermediate is requantised from bf16 vs the twin's fp32, moving a few E2M1 roundings.
        rms, mx = (5e-2, 5e-1) if w4a4 else (5e-3, 1e-2)
        ok = st.nonfinite == 0 and st.rms_rel <= rms and st.max_rel <= mx
        return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}

    def check(self, T: int, path: str | None = None) -> dict:
        """fp4ext output (NaN-poisoned first) vs the fp32 twin on copy 0."""
        from sglang_fp4ext.compare import error_stats
        from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

        xs, routes, outs = self.inputs(T)
        outs[0].fill_(float("nan"))
        self.ours(T, path)(0)
        ref = fused_moe_nvfp4_torch(xs[0], self.packs[0], routes[0][0], routes[0][1])
        st = error_stats(outs[0], ref)
        # bf16 output of fp32-accumulated NVFP4 GEMMs: tests/test_decode_gpu.py holds kernels to
        # rms 5e-3 / max 1e-2 of the twin; a wrong expert, slot or scale is O(1).
        ok = st.nonfinite == 0 and st.rms_rel <= 5e-3 and st.max_rel <= 1e-2
        return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}

    def distinct(self, T: int) -> float:
        """Mean distinct local experts per call over the inputs actually used."""
        routes = self.inputs(T)[1]
        return sum(r[2] for r in routes) / len(routes)
