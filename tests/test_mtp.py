"""MTP (NextN speculative decoding) with fp4ext, CPU tier: everything before the point where
SGLang 0.5.23 stops on a CPU.

What runs here: ``fp4ext check --against no-speculation``'s flags (the checked server gets fp4ext
as the target's and the draft's MoE backend, the reference the same flags without the
``--speculative-*`` ones) and its usage errors; and SGLang's own argument resolution with
``--speculative-algorithm NEXTN`` on a GLM-4.5 NVIDIA-layout config (fresh interpreter,
``--device cuda`` with the two hardware facts ``test_capture_policy`` simulates): NEXTN resolves
to EAGLE, fp4ext is the draft's MoE backend (resolved, and at runtime inside SGLang's
``speculative_moe_backend_context``), and the capture policy sizes the decode graphs for the
verify batches, ``B x speculative_num_draft_tokens`` MoE rows (``draft steps + 1`` at top-k 1):
padding any batch to its captured size keeps its verify rows in the same kernel bucket, and the
buckets a first start tunes (``capture_tune.served_buckets``) are those verify sizes.

What does not run on a CPU (measured: ``python -m sglang.launch_server`` with the CPU flags of
``cpu_workarounds``, the tiny NVIDIA-layout GLM-4.5 with its MTP layer, ``--quantization
modelopt_fp4 --moe-runner-backend fp4ext --speculative-algorithm NEXTN --speculative-num-steps 2
--speculative-eagle-topk 1 --speculative-num-draft-tokens 3``), each failure found by working
around the one before it in a throwaway plugin:

1. Loading the draft: its LM head (``Glm4MoeForCausalLMNextN.lm_head``, prefix
   ``model.shared_head.head``, ``models/glm4_moe_nextn.py:143``; GLM-5's draft has the same,
   ``models/deepseek_nextn.py:298``) is matched by no pattern of NVIDIA's exclusion list, so it
   gets ModelOpt's NVFP4 linear method, whose ``process_weights_after_loading`` raises
   ``ValueError: ModelOpt NVFP4 native dense GEMM backends require SM100+``
   (``layers/quantization/modelopt_quant.py:1928-1932``).
   ``--speculative-draft-model-quantization unquant`` does not help: the draft re-detects the
   checkpoint's quantization. Worked around by excluding ``*shared_head*``.
2. The KV pool with speculation on (``mem_cache/kv_cache_configurator.py:2790``
   ``enable_kv_cache_copy``) warms up ``copy_all_layer_kv_cache_cpu`` (``mem_cache/
   memory_pool.py:2307`` -> ``kernels/ops/kvcache/cache_move.py:191`` ->
   ``sgl_kernel/kvcacheio.py:356``): ``AttributeError: '_OpNamespace' 'sgl_kernel' object has no
   attribute 'copy_all_layer_kv_cache_cpu'`` (pip's sgl-kernel is the CUDA build).
3. ``Glm4MoeForCausalLM.set_embed_and_head`` calls ``torch.cuda.synchronize()``
   (``models/glm4_moe.py:1259``; GLM-5's ``models/deepseek_v2.py:3448``): RuntimeError without
   a GPU.
4. The draft worker's attention (``speculative/eagle_worker_v2.py:405`` ->
   ``speculative/draft_utils.py:64``): ``ValueError: EAGLE is not supported in decode attention
   backend torch_native``. The draft backends (``draft_utils.py:100-140``) include no CPU one but
   ``intel_amx``, which needs an Intel AMX CPU and SGLang's CPU build of sgl-kernel; this is
   where it ends on this machine (AMD EPYC).

So no test serves with speculation on; ``fp4ext check --against no-speculation`` runs on a GPU.
"""

from __future__ import annotations

import json

import pytest

from sglang_fp4ext.cli import main
from sglang_fp4ext.moe.shape import token_bucket
from sglang_fp4ext.testing.e2e import checked_server_args, without_speculation
from tests.sglang_cpu import run_child

NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]  # fmt: skip


# ---- `fp4ext check --against no-speculation`: the two servers' flags ------------------------


def test_checked_server_gets_fp4ext_for_the_target_and_the_draft():
    assert checked_server_args(["--tp", "8", *NEXTN]) == [
        "--tp", "8", *NEXTN, "--moe-runner-backend", "fp4ext",
        "--speculative-moe-runner-backend", "fp4ext",
    ]  # fmt: skip
    # A draft backend the user named stays; no speculation, no draft backend.
    named = [*NEXTN, "--speculative-moe-runner-backend", "triton"]
    assert checked_server_args(named) == [*named, "--moe-runner-backend", "fp4ext"]
    assert checked_server_args(["--tp", "8"]) == ["--tp", "8", "--moe-runner-backend", "fp4ext"]


def test_reference_drops_every_speculative_flag_and_only_those():
    launch = ["--tp", "8", *NEXTN, "--speculative-use-rejection-sampling", "--ep-size", "8",
              "--speculative-draft-model-quantization=unquant",
              "--speculative-adaptive"]  # fmt: skip
    assert without_speculation(launch) == ["--tp", "8", "--ep-size", "8"]
    assert checked_server_args(without_speculation(launch)) == [
        "--tp", "8", "--ep-size", "8", "--moe-runner-backend", "fp4ext",
    ]  # fmt: skip


def test_against_no_speculation_needs_a_checkpoint_and_speculation(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    assert main(["check", "--against", "no-speculation", "--", *NEXTN]) == 2
    assert "pass --model-path DIR" in capsys.readouterr().err
    args = ["check", "--model-path", str(tmp_path), "--against", "no-speculation"]
    assert main([*args, "--", "--tp", "8"]) == 2
    assert "pass e.g. -- --speculative-algorithm NEXTN" in capsys.readouterr().err


# ---- SGLang's own resolution with NEXTN on ---------------------------------------------------

_RESOLVE = """
import json, logging, warnings
warnings.simplefilter("ignore")
# Simulated hardware facts, as in test_capture_policy: 96 GiB, breakable prefill graphs.
import sglang.srt.arg_groups.memory_hook as memory_hook
memory_hook.get_device_memory_capacity = lambda device=None: 96.0 * 1024
import sglang.srt.model_executor.cuda_graph_config as cuda_graph_config
cuda_graph_config.default_prefill_backend = lambda: "breakable"
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt import runtime_context
from sglang.srt.runtime_context import SpawnRanks
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.layers.moe import initialize_moe_config
from sglang.srt.layers.moe.utils import get_moe_runner_backend, speculative_moe_backend_context
from sglang_fp4ext import capture_hooks, capture_tune
logging.getLogger("sglang_fp4ext").setLevel(logging.WARNING)
BASE = ["--model-path", MODEL, "--device", "cuda", "--skip-tokenizer-init", "--tp-size", "8",
        "--moe-runner-backend", "fp4ext"]
name_of = lambda b: getattr(b, "value", str(b))
out = {}
for name, flags in SCENARIOS.items():
    sa = prepare_server_args(BASE + flags)
    sa.resolve_once()
    v = resolved_view(sa)
    runtime_context.publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0))
    initialize_moe_config()
    target = name_of(get_moe_runner_backend())
    with speculative_moe_backend_context():
        draft = name_of(get_moe_runner_backend())
    policy = capture_hooks.policy_from_server_args(sa)[0]
    out[name] = {
        "algorithm": v.speculative_algorithm, "draft_tokens": v.speculative_num_draft_tokens,
        "draft_backend_arg": v.speculative_moe_runner_backend,
        "target_runtime": target, "draft_runtime": draft,
        "decode_bs": list(v.cuda_graph_config.decode.bs),
        "tokens_per_req": policy.inputs.tokens_per_req, "policy_decode_bs": list(policy.decode_bs),
        "policy_buckets": list(policy.token_buckets()),
        "served_buckets": list(capture_tune.served_buckets()),
    }
print(json.dumps(out))
"""

_SCENARIOS = {
    "off": [],
    "nextn": NEXTN,
    "nextn, draft backend named": [*NEXTN, "--speculative-moe-runner-backend", "fp4ext"],
    "nextn, SGLang's defaults": ["--speculative-algorithm", "NEXTN"],
}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    from sglang_fp4ext.testing.checkpoint import tiny_config

    model = tmp_path_factory.mktemp("glm45-nvidia-layout")
    cfg = tiny_config("glm4_moe").to_dict()
    n = cfg["num_hidden_layers"]
    cfg["quantization_config"] = {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "ignore": ["lm_head", "model.embed_tokens", "model.layers.0*", f"model.layers.{n}*",
                   *(f"model.layers.{i}.{m}" for i in range(1, n)
                     for m in ("self_attn*", "mlp.gate", "mlp.shared_experts*"))],
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(cfg))
    code = f"MODEL = {str(model)!r}\nSCENARIOS = {_SCENARIOS!r}\n" + _RESOLVE
    return run_child(code)


@pytest.mark.sglang
def test_nextn_resolves_with_fp4ext_as_the_drafts_backend(resolved):
    for name in _SCENARIOS:
        r = resolved[name]
        assert (r["target_runtime"], r["draft_runtime"]) == ("fp4ext", "fp4ext"), (name, r)
        assert r["draft_backend_arg"] == "fp4ext", (name, r)
        if name != "off":
            assert r["algorithm"] == "EAGLE", (name, r)  # NEXTN is SGLang's alias of EAGLE
    assert resolved["nextn"]["draft_tokens"] == 3
    assert resolved["nextn, SGLang's defaults"]["draft_tokens"] > 1


@pytest.mark.sglang
def test_capture_policy_covers_the_verify_sizes(resolved):
    off = resolved["off"]
    assert off["tokens_per_req"] == 1 and 1 in off["served_buckets"]
    for name in _SCENARIOS:
        if name == "off":
            continue
        r = resolved[name]
        T, captured = r["draft_tokens"], r["decode_bs"]
        # The policy read the draft tokens SGLang resolved, and SGLang captures its sizes.
        assert r["tokens_per_req"] == T and captured == r["policy_decode_bs"], (name, r)
        # A batch of b requests verifies b * T rows; padded to the next captured size it stays in
        # the kernel bucket (config) of its real rows.
        for b in range(1, captured[-1] + 1):
            padded = min(c for c in captured if c >= b)
            assert token_bucket(b * T) == token_bucket(padded * T), (name, b, padded)
        # What a first start tunes: the verify buckets (no 1-row decode bucket is left).
        verify = {token_bucket(c * T) for c in captured}
        assert verify <= set(r["served_buckets"]) and r["served_buckets"] == r["policy_buckets"]
        assert min(r["served_buckets"]) == token_bucket(T), (name, r["served_buckets"])
    # Three draft tokens move the kernel-bucket edges: the captured sizes differ from plain decode.
    assert resolved["nextn"]["decode_bs"] != off["decode_bs"]
