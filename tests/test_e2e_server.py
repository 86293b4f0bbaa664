"""A real SGLang HTTP server with ``--moe-runner-backend fp4ext`` on the CPU (CPU tier).

Two tiny models, quantised and exported by NVIDIA ModelOpt, are served by ``python -m
sglang.launch_server --quantization modelopt_fp4 --moe-runner-backend fp4ext`` and greedy-decoded
over HTTP (4 prompts x 16 tokens), each by one fp4ext server and one oracle server per module:

* GLM-4.5 (``Glm4MoeForCausalLM``: sigmoid router with correction bias, bf16 shared expert),
  through ``python -m sglang_fp4ext check`` (the README's command, whose output is checked too);
* DeepSeek-V3 (``DeepseekV3ForCausalLM``, the MoE block GLM-5 runs in SGLang: MLA with a yarn
  rope, grouped routing 4 groups / best 2, NVFP4 shared expert fused by SGLang as expert 16).

Every served token is judged teacher-forced by two oracles on the dequantised weights: SGLang's
own bf16 MoE (same attention code, so only the expert path differs) and ``transformers`` in
float32 (an independent implementation, which also checks the first oracle). See
``sglang_fp4ext.testing.e2e.GAP_TOLERANCE`` for the tolerance and its measurement. The server
log must show fp4ext serving exactly the model's MoE layers (ids from its config).

Two SGLang 0.5.23 CPU bugs shape the setup (README, Measured facts): the tiny models use
routed_scaling_factor 1.0 (SGLang applies the factor a second time for NVFP4 off CUDA), and the
CPU servers carry ``cpu_workarounds.install_cpu_workarounds`` (DeepSeek MLA prefill on
torch_native attends over the compressed latent; the workaround routes it through the
absorbed-MLA path decode uses; and the servers fork their scheduler and detokenizer instead of
spawning them, which only CUDA needs).
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from tests.sglang_cpu import run_python

# The README's main command on its bundled tiny GLM-4.5 (glm4_moe, BF16 shared expert), with the
# seed of this module's checkpoint. It serves the glm45 case of the assertions below as well:
# the same model, servers and oracle the module would otherwise build a second time.
CLI_GLM45 = ["check", "--prompts", "4", "--tokens", "16", "--seed", "1234"]
# DeepSeek-V3 by hand (make_tiny_checkpoint arguments, fp4ext-server-only flags). SGLang fuses
# shared experts by default only for 256/384 routed experts: force it, so the tiny model runs the
# fused-shared path GLM-5-NVFP4 and DeepSeek-V3 take at full size.
DSV3 = (dict(arch="deepseek_v3", quantize_shared_experts=True), ["--enforce-shared-experts-fusion"])


@pytest.fixture(scope="module")
def glm45_cli(tmp_path_factory):
    """``python -m sglang_fp4ext check`` on the tiny GLM-4.5: its output and its result (written
    by the check to ``result.json``), with the served tokens also scored by ``transformers``."""
    from sglang_fp4ext.testing import e2e

    root = tmp_path_factory.mktemp("glm45")
    proc = run_python(["-m", "sglang_fp4ext", *CLI_GLM45, "--work-dir", str(root)], timeout=1200)
    result = root / "result.json"  # written whether the check passes or not
    assert result.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    r = json.loads(result.read_text())
    r["moe_layers_served"] = {
        int(k): [tuple(x) for x in v] for k, v in r["moe_layers_served"].items()
    }
    hf = e2e.hf_choice_gaps(root / "dequantized", r["prompts"], r["served"])
    r["hf_gaps"] = [j["gaps"] for j in hf]
    r["hf_max_gap"] = max(max(j["gaps"]) for j in hf)
    return proc, root / "model", r


@pytest.fixture(scope="module")
def dsv3_served(tmp_path_factory):
    from sglang_fp4ext.testing import cpu_workarounds, e2e
    from sglang_fp4ext.testing.checkpoint import make_tiny_checkpoint

    kwargs, fp4ext_args = DSV3
    root = tmp_path_factory.mktemp("dsv3")
    ckpt = make_tiny_checkpoint(root / "model", seed=1234, routed_scaling_factor=1.0, **kwargs)
    args, env = cpu_workarounds.cpu_server_args()
    r = e2e.check_checkpoint_against_oracle(
        ckpt,
        n_prompts=4,
        max_new_tokens=16,
        extra_args=args,
        env=env,
        work_dir=root / "run",
        hf_oracle=True,
        fp4ext_args=fp4ext_args,
    )
    return ckpt, r


@pytest.fixture(scope="module", params=["dsv3", "glm45"])
def served_model(request):
    """One fp4ext server + one oracle server per model, shared by the assertions below."""
    if request.param == "glm45":
        _, ckpt, r = request.getfixturevalue("glm45_cli")
    else:
        ckpt, r = request.getfixturevalue("dsv3_served")
    return request.param, ckpt, r


@pytest.mark.sglang
@pytest.mark.slow
def test_server_tokens_match_oracles(served_model):
    from sglang_fp4ext.testing.e2e import GAP_TOLERANCE

    name, _, r = served_model
    assert all(len(o) == 16 for o in r["served"]), r["served"]
    summary = {k: r[k] for k in ("max_gap", "hf_max_gap", "exact_prompts", "server_log")}
    assert r["max_gap"] <= GAP_TOLERANCE, (name, summary, r["gaps"])
    assert r["hf_max_gap"] <= GAP_TOLERANCE, (name, summary, r["hf_gaps"])


@pytest.mark.sglang
@pytest.mark.slow
def test_server_log_shows_every_moe_layer(served_model):
    name, ckpt, r = served_model
    cfg = json.loads((ckpt / "config.json").read_text())
    expected = list(range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]))
    assert r["moe_layers_expected"] == expected == [1, 2, 3]
    # Every MoE layer logged by fp4ext, on the CPU's reference path, with its local experts
    # (routed, plus the shared expert where SGLang fused it).
    n_local = cfg["n_routed_experts"] + (1 if name == "dsv3" else 0)
    assert r["moe_layers_served"] == {i: [("reference", n_local)] for i in expected}, r
    assert r["fp4ext_layers_logged"] is True
    if name == "dsv3":
        assert r["cpu_workaround_logged"], f"MLA workaround not active: {r['server_log']}"


@pytest.mark.sglang
@pytest.mark.slow
def test_fp4ext_check_cli(glm45_cli):
    """The README's main command, end to end, on the bundled tiny model."""
    proc, _, r = glm45_cli
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "verdict: PASS" in proc.stdout and r["ok"] is True
    assert "SGLang log says fp4ext served the MoE layers: yes" in proc.stdout
    assert "prompts identical to the oracle's greedy tokens: " in proc.stdout
    # Every phase on its own line with the time since the start, e.g.
    # "  [  14.4 s] starting fp4ext server on 127.0.0.1:18944".
    for phase in (
        r"quantizing and exporting the tiny model",
        r"starting fp4ext server on 127\.0\.0\.1:\d+",
        r"fp4ext server up after",
        r"starting oracle server on 127\.0\.0\.1:\d+",
        r"oracle server up after",
        r"done",
    ):
        assert re.search(rf"^  \[ *\d+\.\d s\] {phase}", proc.stdout, re.M), (phase, proc.stdout)


@pytest.mark.sglang
def test_fp4ext_check_cli_port_taken_fails_at_once(tmp_path):
    """``fp4ext check`` whose server port is taken says so at once (it used to wait
    out the 600 s health timeout), naming the port."""
    pytest.importorskip("modelopt.torch.export", reason="nvidia-modelopt is not importable")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        proc = run_python(
            ["-m", "sglang_fp4ext", "check", "--work-dir", str(tmp_path), "--prompts", "1"]
            + ["--tokens", "1", "--", "--port", str(port)]
        )
        elapsed = time.monotonic() - t0
    print(f"fp4ext check on a taken port: exit {proc.returncode} after {elapsed:.1f} s")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"FAILED: fp4ext server on 127.0.0.1:{port} did not come up" in proc.stdout
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stdout
    assert "verdict: FAIL (a server did not come up)" in proc.stdout
    assert elapsed < 120  # the tiny model's export, then no wait at all


def test_moe_layer_ids_from_config_and_log():
    """The two halves of the "fp4ext served every MoE layer" check, on fixed inputs."""
    from sglang_fp4ext.testing.e2e import expected_moe_layers, served_moe_layers

    dsv3 = dict(
        model_type="deepseek_v3",
        n_routed_experts=16,
        num_hidden_layers=6,
        first_k_dense_replace=1,
        moe_layer_freq=2,
    )
    assert expected_moe_layers(dsv3) == [2, 4]
    assert expected_moe_layers({**dsv3, "model_type": "glm4_moe"}) == [1, 2, 3, 4, 5]
    assert expected_moe_layers({**dsv3, "n_routed_experts": None}) == []
    log = (
        "[t] fp4ext served MoE layer 4: triton path, 32 local experts\n"
        "[t] fp4ext served MoE layer 2: triton path, 32 local experts\n"
        "[t TP1] fp4ext served MoE layer 2: triton path, 33 local experts\n"
        "[t] fp4ext MoE layers run Triton W4A16\n"
    )
    assert served_moe_layers(log) == {2: {("triton", 32), ("triton", 33)}, 4: {("triton", 32)}}
