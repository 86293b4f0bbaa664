"""The one place that knows the Gluon API differences between Triton 3.6 (H200) and 3.8 (users, CI).

Kernel modules import Gluon names from here when the two versions spell them differently:

* ``barrier``: a CTA-wide thread barrier, ``gl.thread_barrier`` in 3.6, ``gl.barrier`` in 3.8.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

__all__ = ["gluon", "gl", "mma_v2", "barrier"]

barrier = getattr(gl, "barrier", None) or gl.thread_barrier
