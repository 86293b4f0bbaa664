"""A kernel launch as data: what a launcher plans, tests inspect and both paths run.

A path's launcher builds the list of :class:`Launch` records of one call (``decode.plan``,
``prefill``'s plan) and runs them in order. Every argument goes by its parameter name (a keyword
the kernel does not take fails at launch, and the CPU tier checks every planned keyword against
the kernel's parameters). Triton is imported only
when a launch runs or its kernel is asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

__all__ = ["Launch"]


@dataclass(frozen=True, eq=False)
class Launch:
    """``sglang_fp4ext.moe.<module>.<kernel>[grid](**kwargs, **options)``: ``kwargs`` are the
    kernel's arguments by name (constexprs and layouts included), ``options`` Triton's launch
    options (``num_warps``, ``num_stages``, ``launch_pdl``, ``maxnreg``)."""

    module: str
    kernel: str
    grid: tuple
    kwargs: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def fn(self):
        """The ``@triton.jit`` / ``@gluon.jit`` function."""
        return getattr(importlib.import_module(f"sglang_fp4ext.moe.{self.module}"), self.kernel)

    def parameters(self) -> list[tuple[int, str, object, bool]]:
        """``(index, name, value, is_constexpr)`` of every argument given, in the kernel's
        parameter order: what an ahead-of-time compile of this launch specialises on."""
        fn = self.fn()
        given = self.kwargs
        const = set(fn.constexprs)
        return [(i, n, given[n], i in const) for i, n in enumerate(fn.arg_names) if n in given]

    def is_gluon(self) -> bool:
        return self.fn().is_gluon()

    def run(self) -> None:
        self.fn()[self.grid](**self.kwargs, **self.options)
