"""SGLang on the CPU: the flags the CPU test servers run with, and a plugin fixing an SGLang bug.

``cpu_server_args()`` gives the flags and environment; they load ``install_cpu_workarounds``, an
SGLang plugin active only in those servers, that works around an SGLang 0.5.23 CPU bug in
DeepSeek-family (MLA) prefill attention (see its docstring) and lets the servers fork their
scheduler and detokenizer instead of spawning them (``_fork_children``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["cpu_server_args", "install_cpu_workarounds"]


#: The entry-point name of ``install_cpu_workarounds`` in the servers ``cpu_server_args`` starts.
CPU_WORKAROUND_PLUGIN = "fp4ext_e2e_cpu"
CPU_WORKAROUND_LOG = (
    "fp4ext e2e CPU workaround: torch_native MLA prefill runs SGLang's absorbed-MLA path"
)
_MLA_HANDLER_MODULE = "sglang.srt.models.deepseek_common.attention_backend_handler"
_logger = logging.getLogger("sglang_fp4ext")


def _absorbed_mla(attn, forward_batch):
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        _dispatch_mla_subtype,
    )

    return _dispatch_mla_subtype(attn, forward_batch)


def _register_mla_handler(module) -> None:
    module.AttentionBackendRegistry.register("torch_native", _absorbed_mla)
    _logger.warning(CPU_WORKAROUND_LOG)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_register_mla_handler`` right after the handler module is first imported, so the
    processes that never build a DeepSeek model do not pay its ~7 s import."""

    def find_spec(self, name, path=None, target=None):
        if name != _MLA_HANDLER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:  # moved in a later SGLang: nothing to fix here
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_mla_handler(module)

        spec.loader.exec_module = exec_then_register
        return spec


def install_cpu_workarounds() -> None:
    """SGLang plugin for the CPU test servers: fixes DeepSeek-family prefill attention.

    SGLang 0.5.23 bug (CPU, ``--attention-backend torch_native``): DeepSeek's MLA attention
    has no torch_native handler, so ``AttentionBackendRegistry.get_handler`` falls back to the
    triton one (``models/deepseek_common/attention_backend_handler.py:54-55``), which sends every
    prefix-free prefill down the MHA path (same file, 247-251). That path calls
    ``attn_mha(q, k, v, save_kv_cache=False)`` with per-head K/V expanded from the latent
    (``attention_forward_methods/forward_mha.py:305``), but
    ``TorchNativeAttnBackend.forward_extend`` ignores the ``k``/``v`` it is given and attends
    over the KV pool, which for MLA holds the compressed latent
    (``layers/attention/torch_native_backend.py:313-316``). With DeepSeek's real dims (q 192
    wide, latent 576) the shapes would not even match; with a tiny model where ``kv_lora_rank ==
    qk_nope_head_dim == v_head_dim`` it silently attends over the latent. Decode takes the
    absorbed-MLA path and is right, so prefill and decode of the same tokens disagree. Measured
    on the tiny DeepSeek-V3: at the first prefill position, where attention is a
    copy of V, SGLang's log-probabilities differed from transformers' by up to 4.9 (max over the
    vocabulary); with this workaround its top-5 tokens there equal transformers' to 0.01.

    The workaround registers a torch_native handler that always takes the absorbed-MLA path
    (the one decode uses): only attention changes, identically in the fp4ext and oracle servers.
    """
    if _MLA_HANDLER_MODULE in sys.modules:
        _register_mla_handler(sys.modules[_MLA_HANDLER_MODULE])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    _fork_children()


def _fork_children() -> None:
    """SGLang starts its scheduler and detokenizer with ``spawn`` (``entrypoints/engine.py``:
    ``mp.set_start_method("spawn", force=True)``), so each re-imports SGLang: ~25 s of CPU per
    process, most of a CPU test server's start. Spawn is there for CUDA, which must not be
    initialised in a process that forks; the CPU servers have none, so they fork, and the children
    inherit the launcher's imports (its plugins, this one included, are loaded again in each child
    as with spawn)."""
    import multiprocessing

    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1" or getattr(
        multiprocessing.set_start_method, "_fp4ext_fork", False
    ):
        return
    from sglang_fp4ext.target_info import has_cuda_gpu

    if has_cuda_gpu():
        return
    set_start_method = multiprocessing.set_start_method

    def fork_instead_of_spawn(method, force=False):
        set_start_method("fork" if method == "spawn" else method, force=force)

    fork_instead_of_spawn._fp4ext_fork = True
    multiprocessing.set_start_method = fork_instead_of_spawn


_PLUGIN_DIR: Path | None = None


def _cpu_workaround_plugin_dir() -> Path:
    """A directory holding a dist-info that declares ``install_cpu_workarounds`` as an SGLang
    plugin (SGLang finds plugins by entry point); put on ``PYTHONPATH`` of the CPU servers."""
    global _PLUGIN_DIR
    if _PLUGIN_DIR is None:
        d = Path(tempfile.mkdtemp(prefix="fp4ext-e2e-plugin-"))
        info = d / f"{CPU_WORKAROUND_PLUGIN}-0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {CPU_WORKAROUND_PLUGIN}\nVersion: 0\n"
        )
        (info / "entry_points.txt").write_text(
            f"[sglang.srt.plugins]\n{CPU_WORKAROUND_PLUGIN} = "
            f"{__name__}:{install_cpu_workarounds.__name__}\n"
        )
        _PLUGIN_DIR = d
    return _PLUGIN_DIR


def cpu_server_args() -> tuple[list[str], dict[str, str]]:
    """SGLang flags and environment for serving on a CPU-only machine (with the CPU workaround
    plugin, see ``install_cpu_workarounds``)."""
    env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        # A stopped server's launcher sees its scheduler die of SIGTERM and, before it exits,
        # sleeps 5 s "to let GPU activity settle" for a py-spy dump and a CUDA coredump: neither
        # applies on a CPU, and every test server paid the 5 s at its stop.
        "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
        "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(_cpu_workaround_plugin_dir()), os.environ.get("PYTHONPATH")) if p
        ),
    }
    if os.environ.get("SGLANG_PLUGINS"):  # a whitelist: keep ours on it
        env["SGLANG_PLUGINS"] = f"{os.environ['SGLANG_PLUGINS']},{CPU_WORKAROUND_PLUGIN}"
    # SGLang's CPU memory profile fails a server whose free memory drops by more than 1 - this
    # fraction while it loads; a second server starting beside it took 10.3% (CI, two at once).
    # A KV pool of 8,192 tokens holds every test request many times over; sized from the memory
    # fraction instead, its allocation cost each start 2-6 s of the 2-core machine's CPU.
    return (
        [
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--mem-fraction-static",
            "0.2",
            "--max-total-tokens",
            "8192",
        ],
        env,
    )
