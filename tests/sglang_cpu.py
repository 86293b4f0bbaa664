"""Run SGLang code in a fresh Python process (CPU tier).

SGLang's plugin loader, HookRegistry patches and runtime context are process-global and
irreversible, so every SGLang integration scenario runs in its own process: the child prints
one JSON object on its last stdout line, which the test reads. ``PRELUDE_CPU_LAYER`` is the
sequence that builds SGLang's own ``FusedMoE`` on a CPU-only machine (SGLang's
``benchmark/one_batch.py`` does the same publish/initialise steps on a GPU).

Each child is forked from a fork server (``multiprocessing``'s, one per test process) that has
imported SGLang's third-party dependencies (torch, flashinfer and the CuTe DSL, transformers, ...)
but nothing of SGLang or sglang_fp4ext: ~85% of a fresh interpreter's ~25-30 s of imports
(``python -X importtime``) is paid once per test process instead of once per child, while the
state the scenarios exercise (SGLang's modules, plugin loading, hooks) is still built from
scratch in every child. A child gets its own environment and ``PYTHONPATH`` (an SGLang copy first
on it is imported, not the installed one). Without a GPU only: CUDA must not be initialised in a
process that forks, so with one every child is a fresh interpreter, as before.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# Standard library only at module level: a forked child imports this module (``_forked_main``)
# before its own environment is in place, and must not import sglang_fp4ext with the old one.

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
    from sglang_fp4ext.testing.server_ports import PORT_BLOCK, reserve_ports

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


#: Imported once by the fork server. Not SGLang nor sglang_fp4ext: each child imports those.
FORK_PRELOAD = (
    "torch",
    "torch.distributed.tensor",
    "sgl_kernel",
    "flashinfer",
    "transformers",
    "transformers.activations",
    "triton",
    "scipy",
    "sympy",
    "fastapi",
    "aiohttp",
    "openai",
)
_FORK = None  # the fork server's context, once started; False: fresh interpreters


def _fork_context():
    global _FORK
    if _FORK is None:
        import torch

        _FORK = False
        if not torch.cuda.is_available():
            _FORK = multiprocessing.get_context("forkserver")
            _FORK.set_forkserver_preload(list(FORK_PRELOAD))
    return _FORK


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS",)}
    full_env.update(env or {})
    full_env.setdefault("PYTHONWARNINGS", "ignore")
    return full_env


def _forked_main(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """A forked child: ``env`` replaces the environment, ``PYTHONPATH`` goes first on
    ``sys.path``, stdout and stderr go to files, then ``argv`` runs as ``python *argv`` would
    (``-c CODE`` or ``-m MODULE ARGS``); its exit status is the child's."""
    import runpy
    import warnings

    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(env)
    if env.get("PYTHONWARNINGS") == "ignore":
        warnings.simplefilter("ignore")
    first = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = ["", *first, *(p for p in sys.path if p and p not in first)]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        assert argv[0] == "-m", argv
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


class _Forked:
    """A forked child with ``subprocess.Popen``'s ``communicate`` and ``returncode``."""

    def __init__(self, ctx, argv: list[str], env: dict[str, str]):
        self._dir = tempfile.TemporaryDirectory(prefix="fp4ext-child-")
        self._out, self._err = (os.path.join(self._dir.name, n) for n in ("out", "err"))
        self.args = [sys.executable, *argv]
        self._proc = ctx.Process(target=_forked_main, args=(argv, env, self._out, self._err))
        self._proc.start()
        self.returncode = None

    def poll(self):
        if self._proc.exitcode is not None:
            self.returncode = self._proc.exitcode
        return self.returncode

    def kill(self) -> None:
        if self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.returncode = self._proc.exitcode
        with open(self._out) as o, open(self._err) as e:
            out, err = o.read(), e.read()
        self._dir.cleanup()
        return out, err


def start_python(argv: list[str], env: dict[str, str] | None = None):
    """``python *argv`` (``-c CODE`` or ``-m MODULE ARGS``) in a fresh process with the child
    environment (``SGLANG_PLUGINS`` dropped, ``env`` on top): forked from the fork server, or a
    new interpreter where there is none; read it with ``communicate``."""
    full_env = _child_env(env)
    ctx = _fork_context()
    if ctx:
        return _Forked(ctx, argv, full_env)
    return subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def run_python(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``start_python`` to completion: ``returncode``, ``stdout``, ``stderr`` as
    ``subprocess.run(..., capture_output=True, text=True)`` gives them."""
    p = start_python(argv, env)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess([sys.executable, *argv], p.returncode, out, err)


def _result(returncode: int, out: str, err: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if returncode != 0 or not lines:
        raise AssertionError(
            f"child failed (rc={returncode})\n--- stdout ---\n{out[-4000:]}\n"
            f"--- stderr ---\n{err[-8000:]}"
        )
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise AssertionError(f"child printed no JSON last line:\n{out[-4000:]}") from exc
    result["_stderr"] = err
    return result


def run_child(code: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run ``code`` in a fresh process; return the JSON object on its last stdout line."""
    proc = run_python(["-c", textwrap.dedent(code)], env=env, timeout=timeout)
    return _result(proc.returncode, proc.stdout, proc.stderr)


def run_children(codes: list[str], *, env: dict[str, str] | None = None, timeout: float = 300):
    """Run several children at once (ranks of one gloo group); return their JSON results."""
    procs = [start_python(["-c", textwrap.dedent(c)], env) for c in codes]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [_result(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


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
