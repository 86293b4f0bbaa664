"""``fp4ext check --model-path``'s rule (CPU tier, fixed inputs): fp4ext's greedy tokens are
scored teacher-forced on the default-backend server, and a token further than the tolerance below
that server's best fails the check, however many prompts are identical. The servers behind it
(``e2e.check_against_default_backend``) need a GPU: SGLang's default NVFP4 MoE does not run on
the CPU."""

from __future__ import annotations

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
