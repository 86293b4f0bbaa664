"""sglang-fp4ext: NVFP4 fused-MoE Triton kernels for SGLang, as a plugin (no fork)."""

import re
from pathlib import Path

from setuptools import find_packages, setup

_ROOT = Path(__file__).parent
_VERSION = re.search(
    r'^__version__ = "([^"]+)"', (_ROOT / "sglang_fp4ext" / "__init__.py").read_text(), re.M
).group(1)

setup(
    name="sglang-fp4ext",
    version=_VERSION,
    description="NVFP4 fused-MoE Triton kernels and a CUDA-graph capture policy for SGLang",
    long_description=(_ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    # tests/ and benchmarks/ never ship.
    packages=find_packages(include=["sglang_fp4ext", "sglang_fp4ext.*"]),
    package_data={"sglang_fp4ext": ["moe/configs/*.json"]},
    # torch and triton come through sglang (0.5.23 pins torch 2.14.1 / triton 3.8.0).
    install_requires=["sglang>=0.5.23,<0.6", "packaging"],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist",  # the CPU tier runs a worker per core (-n auto --dist loadfile)
            "hypothesis>=6",
            "nvidia-modelopt",
            "safetensors",
            "transformers",
            "ruff==0.17.6",  # pinned: CI checks the tree is formatted as this version formats
        ],
        "bench": ["pytest-benchmark>=5", "matplotlib"],
    },
    entry_points={
        "sglang.srt.plugins": ["fp4ext = sglang_fp4ext.plugin:register"],
        "console_scripts": ["fp4ext = sglang_fp4ext.cli:main"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Environment :: GPU :: NVIDIA CUDA",
    ],
)
