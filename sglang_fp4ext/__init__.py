"""sglang_fp4ext: NVFP4 fused-MoE Triton kernels for SGLang, loaded as a plugin.

Importing this package imports nothing from SGLang, torch or Triton: the plugin entry point
(``sglang_fp4ext.plugin:register``) imports SGLang lazily, and the kernels, references and
benchmarks import without SGLang so they run on machines that do not have it.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
