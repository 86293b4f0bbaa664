"""Run SGLang code in a fresh Python process (CPU tier).

SGLang's plugin loader, HookRegistry patches and runtime context are process-global and
irreversible, so every SGLang integration scenario runs in its own interpreter: the child prints
one JSON object on its last stdout line, which the test reads. ``PRELUDE_CPU_LAYER`` is the
sequence that builds SGLang's own ``FusedMoE`` on a CPU-only machine (SGLang's
``benchmark/one_batch.py`` does the same publish/initialise steps on a GPU).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from sglang_fp4ext.testing.server_ports import PORT_BLOCK, reserve_ports

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "rope_theta": 10000.0,
}


def tiny_model_dir(root: Path) -> Path:
    """A config-only model dir: enough for SGLang's argument resolution."""
    d = root / "tiny-llama"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    return d


_BLOCK = None  # this process's port block (its lock held until the process exits)
_NEXT = 0


def free_port() -> int:
    """A free port for a child's gloo TCPStore, from a port block this process holds.

    Not ``bind(0)``: that hands out a port in the kernel's ephemeral range, which is free again
    once the probe socket closes and can be taken by any outgoing connection (a pip download, a
    gloo pair, another test's server) before the child binds it. The block (``reserve_ports``,
    below the ephemeral range, locked against the harness's other servers and test processes)
    keeps other users of the range away; ports are handed out in turn and probed before use.
    """
    global _BLOCK, _NEXT
    if _BLOCK is None:
        _BLOCK = reserve_ports()
    for _ in range(PORT_BLOCK):
        _NEXT = _NEXT % (PORT_BLOCK - 2) + 1
        port = _BLOCK.port + 1 + _NEXT  # not the base nor base + 1 (a server's HTTP / nccl)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port in {_BLOCK}")


def run_child(code: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run ``code`` in a fresh interpreter; return the JSON object on its last stdout line."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS",)}
    full_env.update(env or {})
    full_env.setdefault("PYTHONWARNINGS", "ignore")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"child failed (rc={proc.returncode})\n--- stdout ---\n{proc.stdout[-4000:]}\n"
            f"--- stderr ---\n{proc.stderr[-8000:]}"
        )
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise AssertionError(f"child printed no JSON last line:\n{proc.stdout[-4000:]}") from exc
    result["_stderr"] = proc.stderr
    return result


def run_children(codes: list[str], *, env: dict[str, str] | None = None, timeout: float = 300):
    """Run several children at once (ranks of one gloo group); return their JSON results."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS",)}
    full_env.update(env or {})
    full_env.setdefault("PYTHONWARNINGS", "ignore")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(c)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
        )
        for c in codes
    ]
    results = []
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        lines = [ln for ln in out.splitlines() if ln.strip()]
        if p.returncode != 0 or not lines:
            raise AssertionError(
                f"child failed (rc={p.returncode})\n--- stdout ---\n{out[-4000:]}\n"
                f"--- stderr ---\n{err[-8000:]}"
            )
        r = json.loads(lines[-1])
        r["_stderr"] = err
        results.append(r)
    return results


def prelude_cpu_layer(
    model_dir: Path, backend: str, port: int, *, tp: int = 1, ep: int = 1, rank: int = 0
) -> str:
    """Code that resolves ServerArgs for ``backend`` and initialises SGLang's state on CPU.

    ``tp``/``ep`` > 1 with one child per ``rank`` builds a gloo group of ``tp`` processes.
    """
    return f"""
import json, torch
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt import runtime_context
from sglang.srt.runtime_context import SpawnRanks, override_platform
from sglang.srt.server_args import ServerArgs
server_args = ServerArgs(model_path={str(model_dir)!r}, device="cpu",
                         attention_backend="torch_native", skip_tokenizer_init=True,
                         moe_runner_backend={backend!r}, tp_size={tp}, ep_size={ep})
server_args.resolve_once()
runtime_context.publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank={rank}))
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
init_distributed_environment(world_size={tp}, rank={rank}, local_rank={rank}, backend="gloo",
                             distributed_init_method="tcp://127.0.0.1:{port}")
initialize_model_parallel()
from sglang.srt.layers.moe import initialize_moe_config
initialize_moe_config()
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.layers.quantization.modelopt_quant import (
    ModelOptFp4Config, ModelOptNvFp4FusedMoEMethod)
QUANT_CONFIG = ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, kv_cache_quant_algo=None,
                                 group_size=16, exclude_modules=[])

def make_layer(num_experts=8, hidden=256, inter=128, top_k=2):
    return FusedMoE(num_experts=num_experts, hidden_size=hidden, intermediate_size=inter,
                    layer_id=0, top_k=top_k, params_dtype=torch.bfloat16,
                    quant_config=QUANT_CONFIG, prefix="model.layers.0.mlp.experts")
"""
