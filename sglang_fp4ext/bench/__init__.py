"""Benchmark helpers shared by ``benchmarks/run_decode.py`` and the pytest-benchmark suite.

* ``timing.py``: CUDA-graph replay timer with weights rotated over layer copies (L2-cold) and the
  device-to-device copy bandwidth, measured in the same run.
* ``peers.py``: the torch bf16 grouped-GEMM MoE peer (``torch._grouped_mm`` on sorted tokens).
* ``layer.py``: a model preset's layer (``model_shapes``), its routing and inputs; random NVFP4
  packs come from ``moe.synthetic``.
"""

from __future__ import annotations

from sglang_fp4ext.moe.synthetic import random_packed_weights

__all__ = ["nvfp4_bytes_per_expert", "random_packed_weights"]


def nvfp4_bytes_per_expert(H: int, I: int) -> int:
    """Checkpoint bytes one expert streams: E2M1 codes (3HI/2), e4m3 scales (3HI/16), 3 fp32."""
    return 3 * H * I // 2 + 3 * H * I // 16 + 3 * 4
