"""A real SGLang HTTP server with ``--moe-runner-backend fp4ext`` on the CPU (issue 9, CPU tier).

A tiny GLM-4.5 (``Glm4MoeForCausalLM``: sigmoid router with correction bias, shared expert) is
quantised and exported by NVIDIA ModelOpt, served by ``python -m sglang.launch_server
--quantization modelopt_fp4 --moe-runner-backend fp4ext``, and greedy-decoded over HTTP. Every
served token is judged teacher-forced by two oracles on the dequantised weights: SGLang's own
bf16 MoE (same attention code, so only the expert path differs) and ``transformers`` in float32
(an independent implementation). See ``sglang_fp4ext.testing.e2e.GAP_TOLERANCE`` for the
tolerance and its measurement. The tiny model uses routed_scaling_factor 1.0: on non-CUDA devices
SGLang 0.5.23's GLM-4.5 block applies the factor a second time for NVFP4 (README).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_glm45(tmp_path_factory):
    from sglang_fp4ext.testing.checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("glm45") / "model",
        arch="glm4_moe",
        seed=1234,
        quantize_shared_experts=False,
        routed_scaling_factor=1.0,
    )


def test_server_tokens_match_oracles(tiny_glm45, tmp_path):
    from sglang_fp4ext.testing import e2e

    args, env = e2e.cpu_server_args()
    r = e2e.check_checkpoint_against_oracle(
        tiny_glm45, n_prompts=4, max_new_tokens=16, extra_args=args, env=env,
        work_dir=tmp_path, hf_oracle=True,
    )
    assert r["fp4ext_layers_logged"], "the server log does not show fp4ext serving MoE layers"
    assert all(len(o) == 16 for o in r["served"])
    assert r["max_gap"] <= e2e.GAP_TOLERANCE, r
    assert r["hf_max_gap"] <= e2e.GAP_TOLERANCE, r


def test_fp4ext_check_cli(tmp_path):
    """The README's main command, end to end, on the bundled tiny model."""
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_fp4ext", "check", "--work-dir", str(tmp_path),
         "--prompts", "2", "--tokens", "8"],
        capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "verdict: PASS" in proc.stdout
    assert "SGLang log says fp4ext served the MoE layers: yes" in proc.stdout
