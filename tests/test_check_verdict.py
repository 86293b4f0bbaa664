"""``fp4ext check --model-path``'s rule: fp4ext's greedy tokens are scored teacher-forced on the
reference server (SGLang's default NVFP4 MoE backend), and a token further than the tolerance
below that server's best fails the check, however many prompts are identical.

The rule on fixed inputs, then the command end to end on a tiny ModelOpt NVFP4 checkpoint through
real SGLang servers (CPU tier): it passes with fp4ext healthy, and fails, naming where each prompt
diverges, with fp4ext's output broken on the checked server only
(``SGLANG_FP4EXT_FAULT_INJECT=decode:reference``, which the reference server never inherits).
SGLang's own NVFP4 MoE backends need a GPU (Blackwell, or Marlin on SM80+), so here the reference
server runs fp4ext too (``-- --moe-runner-backend fp4ext``): these runs show that the servers,
the scoring, the printed lines and the exit code can pass and can fail, not that fp4ext agrees
with another backend. In the passing run that reference would be the checked server again (same
flags, no fault), so the check serves both parts from one server; the failing run starts two.

The checkpoint is NVIDIA's GLM-5.x-NVFP4 layout (``checkpoint.NVIDIA_LAYOUT``): only the routed
experts NVFP4; the shared expert, attention, the dense layer and the MTP layer bf16 and in the
exclusion lists. SGLang then does not fuse the shared expert, so fp4ext serves E = 16 routed
experts, top-k 4 (``16 local experts`` in the output), and the target's loader skips the MTP
layer. Its architecture is GLM-4.5 (``Glm4MoeForCausalLM``: the same MoE block, sigmoid router
with correction bias, bf16 shared expert beside it), not GLM-5's ``GlmMoeDsaForCausalLM``, which
SGLang 0.5.23 cannot serve on a CPU: argument resolution calls
``torch.cuda.get_device_capability()`` for DSA models (``arg_groups/model_hook.py:341``,
RuntimeError without a GPU). Past that (capability faked, measured) SGLang picks CUDA-only DSA
attention (``flashmla_sparse`` prefill, ``fa3`` decode), the model build stops in the DSA
indexer's CPU rope (``layers/rotary_embedding/factory.py:478`` asserts a rope scaling), and the
indexer has no CPU forward at all (``layers/attention/dsa/dsa_indexer.py:1888-1891``:
``forward_native`` raises NotImplementedError).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from sglang_fp4ext.cli import main
from sglang_fp4ext.testing.e2e import GAP_TOLERANCE, judge_against_default


def test_identical_prompts_pass_and_say_so():
    j = judge_against_default([None, None], [[0.0] * 3, [0.0] * 3], layers_served=True)
    assert j["ok"] is True
    assert j["line"] == (
        f"PASS: 2/2 prompts identical; largest teacher-forced gap 0.00 <= {GAP_TOLERANCE}; "
        "fp4ext served every MoE layer"
    )


def test_a_near_tie_divergence_passes_and_names_where():
    j = judge_against_default([None, 1], [[0.0] * 3, [0.0, 0.05, 0.2]], layers_served=True)
    assert j["ok"] is True
    assert j["line"].startswith(
        "PASS: 1/2 prompts identical; prompt 1 diverges at token 1 (fp4ext's token 0.05 below "
        "the default backend's best); largest teacher-forced gap 0.20 <= 0.5;"
    )


def test_a_token_beyond_the_tolerance_fails_even_with_identical_prompts_elsewhere():
    j = judge_against_default([None, None, 2], [[0.0], [0.0], [0.0, 0.0, 1.7]], layers_served=True)
    assert j["ok"] is False
    assert j["line"].startswith("FAIL: 2/3 prompts identical; prompt 2 diverges at token 2")
    assert "largest teacher-forced gap 1.70 > 0.5" in j["line"]


def test_moe_layers_not_served_fail():
    j = judge_against_default([None], [[0.0]], layers_served=False)
    assert j["ok"] is False and j["line"].endswith("fp4ext did NOT serve every MoE layer")


def test_check_help_states_the_default_tolerance(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert f"(default {GAP_TOLERANCE}:" in " ".join(capsys.readouterr().out.split())


# ---- end to end: `fp4ext check --model-path` through two real SGLang servers ----


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    pytest.importorskip("modelopt.torch.export", reason="nvidia-modelopt is not importable")
    from sglang_fp4ext.testing.checkpoint import NVIDIA_LAYOUT, make_tiny_checkpoint

    # routed_scaling_factor 1.0 as `fp4ext check` builds its tiny model on a CPU (see check.py).
    out = tmp_path_factory.mktemp("check-model") / "model"
    return make_tiny_checkpoint(
        out, arch="glm4_moe", seed=0, routed_scaling_factor=1.0, **NVIDIA_LAYOUT
    )


def _check_model(model, fault: str = "") -> subprocess.CompletedProcess:
    from sglang_fp4ext.testing.cpu_workarounds import cpu_server_args

    args, env = cpu_server_args()
    env = {**os.environ, **env, "PYTHONWARNINGS": "ignore", "SGLANG_FP4EXT_FAULT_INJECT": fault}
    cli = [sys.executable, "-m", "sglang_fp4ext", "check", "--model-path", str(model)]
    launch = [*args, "--moe-runner-backend", "fp4ext"]
    return subprocess.run(
        [*cli, "--prompts", "2", "--tokens", "8", "--", *launch],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


@pytest.mark.sglang
@pytest.mark.slow
def test_check_model_passes_with_fp4ext_healthy(tiny_checkpoint):
    proc = _check_model(tiny_checkpoint)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert ", fp4ext vs the fp4ext MoE backend" in proc.stdout
    assert "  reference: the fp4ext server itself" in proc.stdout
    assert re.findall(r"starting (.*) on 127", proc.stdout) == ["fp4ext server"], proc.stdout
    # NVIDIA's layout: the bf16 shared expert stays out of the MoE (E = 16 routed, not 17).
    for layer in (1, 2, 3):
        line = f"  fp4ext served MoE layer {layer}: reference path, 16 local experts\n"
        assert line in proc.stdout, proc.stdout
    for i in range(2):
        assert re.search(rf"^  prompt {i}: identical; ", proc.stdout, re.M), proc.stdout
    assert re.search(
        r"^verdict: PASS: 2/2 prompts identical; largest teacher-forced gap \d\.\d\d <= 0\.5; "
        r"fp4ext served every MoE layer",
        proc.stdout,
        re.M,
    ), proc.stdout


@pytest.mark.sglang
@pytest.mark.slow
def test_check_model_fails_with_fp4ext_broken_on_the_checked_server(tiny_checkpoint):
    # A reference server broken the same way generates the same tokens (measured: 2/2 prompts
    # identical, failed only by the teacher-forced gaps): the divergences show it was not.
    proc = _check_model(tiny_checkpoint, fault="decode:reference")
    print(proc.stdout)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "reference: the fp4ext server itself" not in proc.stdout
    starts = re.findall(r"starting (.*) on 127", proc.stdout)
    assert starts == ["fp4ext server", "default-backend server"], proc.stdout
    for i in range(2):
        assert re.search(rf"^  prompt {i}: diverges at token \d+; ", proc.stdout, re.M), proc.stdout
    verdict = re.search(r"^verdict: FAIL: .*$", proc.stdout, re.M)
    assert verdict, proc.stdout
    gap = float(re.search(r"largest teacher-forced gap (\d+\.\d+) > 0\.5", verdict[0])[1])
    assert gap > 0.5 and "fp4ext served every MoE layer" in verdict[0], verdict[0]
