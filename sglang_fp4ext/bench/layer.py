"""The measured MoE layer of ``fp4ext bench``: the timed layer the tuner also uses (random NVFP4
copies, inputs rotated beyond the L2: ``timed_layer.py``) and the steps the timer replays on it
(fp4ext on either path, the torch bf16 peer, SGLang's peers), each checkable against the fp32
torch twin.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_fp4ext.bench.report import dispatch_path
from sglang_fp4ext.model_shapes import ModelShape
from sglang_fp4ext.timed_layer import TimedLayer, make_routing

__all__ = ["Layer", "make_routing"]


class Layer(TimedLayer):
    """The timed layer (``timed_layer.TimedLayer``: copies, routing, inputs rotated beyond the L2)
    plus the steps ``fp4ext bench`` times on it: fp4ext on either path, the torch bf16 peer of
    each copy (lazily) and SGLang's peers."""

    def __init__(
        self, shape: ModelShape, copies: int, *, seed: int = 2026, device="cuda", l2_bytes=None
    ):
        super().__init__(shape, copies, seed=seed, device=device, l2_bytes=l2_bytes)
        self._peers = None
        self._sglang: dict[str, list] = {}

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
        run = self.routed(T, path)
        xs, routes, _ = self.inputs(T)
        return lambda i: run(xs[i], i % self.copies, routes[i][0], routes[i][1], i)

    def routed(self, T: int, path: str | None = None):
        """fp4ext on ``path`` (default: the one served for ``T``) as ``run(x, copy, ids, weights,
        i)``, writing input ``i``'s output buffer: the step :meth:`ours` replays, and the routed
        experts of ``bench.block``."""
        from sglang_fp4ext.moe import paths

        path = path or self.served_path(T)
        run, cfg = paths.get(path).launcher(), self.config(T, path)
        outs = self.inputs(T)[2]
        return lambda x, c, ids, tw, i: run(x, self.prepared[c], ids, tw, out=outs[i], config=cfg)

    def peer(self, T: int) -> Callable[[int], object]:
        from sglang_fp4ext.bench.peers import TorchGroupedMMMoE

        if self._peers is None:
            self._peers = [TorchGroupedMMMoE(p) for p in self.packs]
        xs, routes, _ = self.inputs(T)
        return lambda i: self._peers[i % self.copies](xs[i], routes[i][0], routes[i][1])

    def sglang_peer(self, T: int, name: str) -> Callable[[int], object]:
        """Step over the inputs for SGLang's peer ``name`` (``bench/peers.py``), one adapter per
        layer copy (built on first use; raises with the reason where it cannot run)."""
        adapters = self.sglang_adapters(name)
        xs, routes, _ = self.inputs(T)
        return lambda i: adapters[i % self.copies](xs[i], routes[i][0], routes[i][1])

    def sglang_adapters(self, name: str) -> list:
        """SGLang's peer ``name`` on each layer copy, ``adapter(x, ids, weights) -> out``."""
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
        return adapters

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
