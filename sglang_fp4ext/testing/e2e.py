"""End-to-end check: a real SGLang server with ``--moe-runner-backend fp4ext`` against an oracle.

Used by ``fp4ext check`` and the end-to-end tests. Three pieces:

* ``dequantized_copy(ckpt, out)``: the same model with every NVFP4 tensor dequantised
  (``e2m1 * block_scale * weight_scale_2``, ModelOpt's rule) into float32, written as a plain
  Hugging Face checkpoint; this is what ``transformers`` runs as the oracle.
* ``SGLangServer``: ``python -m sglang.launch_server`` in a subprocess on a free loopback port,
  waited for on ``/health``, greedy ``/generate`` on token ids, stopped with its process group.
* ``hf_greedy``: ``transformers`` greedy decoding on token ids (no tokenizer needed).
* ``expected_moe_layers`` / ``served_moe_layers``: which layers of a model are MoE layers (SGLang's
  rule) and which ones the server log says fp4ext served.
* ``install_cpu_workarounds``: an SGLang plugin, active only in servers started with
  ``cpu_server_args()``, that works around an SGLang 0.5.23 CPU bug in DeepSeek-family (MLA)
  prefill attention (see its docstring).

The servers and requests stay on 127.0.0.1 and are bounded in count and time.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from sglang_fp4ext.nvfp4.format import dequantize_nvfp4

__all__ = [
    "dequantized_copy",
    "SGLangServer",
    "hf_greedy",
    "hf_choice_gaps",
    "prompts_for",
    "expected_moe_layers",
    "served_moe_layers",
    "cpu_server_args",
    "install_cpu_workarounds",
]


def dequantized_copy(ckpt_dir, out_dir) -> Path:
    """Write ``ckpt_dir`` with NVFP4 tensors dequantised to float32 (no quantization config)."""
    from safetensors.torch import save_file

    from sglang_fp4ext.testing.checkpoint import read_checkpoint

    src, out = Path(ckpt_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = read_checkpoint(src)
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in t.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and tensor.dtype == torch.uint8:
            plain[name] = dequantize_nvfp4(
                tensor, t[f"{base}.weight_scale"], t[f"{base}.weight_scale_2"].float()
            )
        else:
            plain[name] = tensor.float() if tensor.is_floating_point() else tensor
    save_file(plain, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copy(src / extra, out / extra)
    return out


def prompts_for(vocab_size: int, n: int = 4, length: int = 8, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Skip the first ids: tiny configs use 0/1 as bos/eos.
    return [torch.randint(2, vocab_size, (length,), generator=g).tolist() for _ in range(n)]


def hf_greedy(model_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt with ``transformers`` in float32 on the CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    """``python -m sglang.launch_server`` on 127.0.0.1; use as a context manager."""

    def __init__(self, model_path, extra_args: list[str], *, env: dict | None = None,
                 log_path=None, start_timeout: float = 600):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
            "--host", "127.0.0.1", "--port", str(self.port), "--skip-tokenizer-init",
            *extra_args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(suffix=".log")[1])
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "SGLangServer":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        self.__exit__(None, None, None)
        raise TimeoutError(f"SGLang server not healthy after {self.start_timeout}s:\n{self.log()}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()

    def log(self, tail: int = 12000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def choice_gaps(self, prompt: list[int], output: list[int], timeout: float = 300) -> list[float]:
        """Teacher-forced: for each token of ``output``, the logprob gap to this server's best."""
        body = json.dumps({
            "input_ids": prompt + output,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            # SGLang gives no logprob for the first scored position: start one earlier and keep
            # the last len(output) entries.
            "logprob_start_len": len(prompt) - 1,
            "top_logprobs_num": 1,
        }).encode()
        req = urllib.request.Request(f"{self.url}/generate", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            meta = json.loads(r.read())["meta_info"]
        chosen = meta["input_token_logprobs"][-len(output):]  # [logprob, token_id, text]
        tops = meta["input_top_logprobs"][-len(output):]
        if len(chosen) != len(output) or [c[1] for c in chosen] != list(output):
            raise RuntimeError(f"SGLang scored {len(chosen)} tokens, expected {len(output)}")
        return [float(top[0][0]) - float(lp) for (lp, _, _), top in zip(chosen, tops)]

    def generate(self, input_ids: list[int], max_new_tokens: int, timeout: float = 300) -> list[int]:
        body = json.dumps({
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                "ignore_eos": True},
        }).encode()
        req = urllib.request.Request(f"{self.url}/generate", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())["output_ids"]


def hf_choice_gaps(model_dir, prompts: list[list[int]], outputs: list[list[int]]):
    """Teacher-forced oracle: for each generated token, how far its logit is below the best one.

    Runs ``transformers`` in float32 on ``prompt + output`` in one pass and returns, per prompt,
    ``max(logits_i) - logits_i[output_i]`` for every generated position ``i`` (0 means the served
    token is the oracle's argmax), together with the oracle's own top-1/top-2 margin there. A
    served token that is not the argmax is acceptable only at a near-tie, where bf16 rounding on
    the served side may legitimately flip the choice.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    result = []
    with torch.no_grad():
        for p, out in zip(prompts, outputs):
            ids = torch.tensor([p + out])
            logits = model(ids).logits[0, len(p) - 1 : len(p) - 1 + len(out)].float()
            best = logits.max(dim=-1).values
            chosen = logits.gather(1, torch.tensor(out).unsqueeze(1)).squeeze(1)
            top2 = logits.topk(2, dim=-1).values
            result.append(
                {
                    "gaps": (best - chosen).tolist(),
                    "margins": (top2[:, 0] - top2[:, 1]).tolist(),
                    "logit_scale": float(logits.std()),
                }
            )
    return result


# ---- the checks behind `fp4ext check` ----

#: A served token may sit this far (in logits) below the oracle's best token: bf16 activations and
#: a different MoE summation order flip near-ties. Measured 2026-11-29 on two tiny GLM-4.5
#: checkpoints (4 prompts x 16 tokens each, logit std ~1.0) against transformers in float32:
#: SGLang serving the *dequantised* weights with its own bf16 MoE picked tokens up to 0.22 below
#: the best; fp4ext on the NVFP4 checkpoint up to 0.14. With the routed scaling applied twice
#: (SGLang's GLM-4.5 CPU path, see README) fp4ext missed by 1.9-2.6. Tiny DeepSeek-V3 (fused
#: NVFP4 shared expert, grouped routing; 2026-11-30): fp4ext 0.03 below SGLang's own MoE and 0.11
#: below transformers; with the fused shared expert dropped 2.35, with gate/up swapped 2.28,
#: without ``install_cpu_workarounds`` 3.5 (4.4 against transformers).
GAP_TOLERANCE = 0.5


# ---- which MoE layers fp4ext served ----

# The line sglang_backend.Fp4ExtRunnerCore logs once per layer (tests/test_sglang_layer.py parses
# a real one with this).
_SERVED_RE = re.compile(
    r"fp4ext served MoE layer (\d+): (triton|reference) path, (\d+) local experts"
)


def expected_moe_layers(config: dict) -> list[int]:
    """Layer ids SGLang builds as MoE layers for a DeepSeek-V2/V3 or GLM-4.5 style ``config``.

    SGLang 0.5.23's rule: ``layer_id >= first_k_dense_replace`` and, in the DeepSeek-V2 code
    that DeepSeek-V3 and GLM-5 run (``deepseek_v2.py`` ``_is_layer_sparse``),
    ``layer_id % moe_layer_freq == 0``; GLM-4.5 (``glm4_moe.py``) ignores ``moe_layer_freq``.
    MTP layers are not served without speculation.
    """
    if not config.get("n_routed_experts"):
        return []
    freq = 1 if config.get("model_type") == "glm4_moe" else config.get("moe_layer_freq", 1)
    first = config.get("first_k_dense_replace", 0)
    return [i for i in range(config["num_hidden_layers"]) if i >= first and i % freq == 0]


def served_moe_layers(log: str) -> dict[int, set[tuple[str, int]]]:
    """``{layer id: {(path, local experts), ...}}`` from fp4ext's per-layer lines in a server log
    (one line per layer and process; TP/EP ranks each log their own)."""
    served: dict[int, set[tuple[str, int]]] = {}
    for m in _SERVED_RE.finditer(log):
        served.setdefault(int(m.group(1)), set()).add((m.group(2), int(m.group(3))))
    return served


# ---- SGLang on the CPU ----

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
    on the tiny DeepSeek-V3 (2026-11-30): at the first prefill position, where attention is a
    copy of V, SGLang's log-probabilities differed from transformers' by up to 4.9 (max over the
    vocabulary); with this workaround its top-5 tokens there equal transformers' to 0.01.

    The workaround registers a torch_native handler that always takes the absorbed-MLA path
    (the one decode uses): only attention changes, identically in the fp4ext and oracle servers.
    """
    if _MLA_HANDLER_MODULE in sys.modules:
        _register_mla_handler(sys.modules[_MLA_HANDLER_MODULE])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


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
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(_cpu_workaround_plugin_dir()), os.environ.get("PYTHONPATH")) if p
        ),
    }
    if os.environ.get("SGLANG_PLUGINS"):  # a whitelist: keep ours on it
        env["SGLANG_PLUGINS"] = f"{os.environ['SGLANG_PLUGINS']},{CPU_WORKAROUND_PLUGIN}"
    return (
        ["--device", "cpu", "--attention-backend", "torch_native", "--mem-fraction-static", "0.1"],
        env,
    )


def serve_greedy(model_path, extra_args, env, prompts, max_new_tokens, log_path=None):
    """Start SGLang, greedy-generate every prompt, stop it; returns (outputs, full server log)."""
    with SGLangServer(model_path, extra_args, env=env, log_path=log_path) as server:
        outs = [server.generate(p, max_new_tokens) for p in prompts]
        log = server.log(tail=10**8)
    return outs, log


def check_checkpoint_against_oracle(
    ckpt_dir, *, n_prompts: int = 4, max_new_tokens: int = 16, extra_args=(), env=None,
    work_dir=None, seed: int = 0, hf_oracle: bool = False, fp4ext_args=(),
) -> dict:
    """Serve an NVFP4 checkpoint with fp4ext; judge every served token with an oracle.

    The oracle is the same SGLang server code on the *dequantised* checkpoint with SGLang's own
    bf16 MoE (same attention, so only the expert path differs): each fp4ext token is scored
    teacher-forced there, and its logprob must be within ``GAP_TOLERANCE`` of the oracle's best.
    ``extra_args`` go to both servers, ``fp4ext_args`` to the fp4ext one only (e.g.
    ``--enforce-shared-experts-fusion``, which the bf16 oracle does not need).
    ``hf_oracle=True`` also scores the tokens with ``transformers`` in float32 (an independent
    model implementation: it checks the SGLang oracle itself). ``fp4ext_layers_logged`` is true
    when the server log shows fp4ext serving exactly the model's MoE layers.
    """
    ckpt_dir = Path(ckpt_dir)
    work = Path(work_dir or tempfile.mkdtemp(prefix="fp4ext-check-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    prompts = prompts_for(cfg["vocab_size"], n_prompts, seed=seed)
    outs, log = serve_greedy(
        ckpt_dir,
        [*extra_args, *fp4ext_args, "--quantization", "modelopt_fp4", "--moe-runner-backend",
         "fp4ext"],
        env,
        prompts,
        max_new_tokens,
        log_path=work / "server.log",
    )
    deq = dequantized_copy(ckpt_dir, work / "dequantized")
    with SGLangServer(deq, [*extra_args, "--dtype", "bfloat16"], env=env,
                      log_path=work / "oracle-server.log") as oracle:
        oracle_outs = [oracle.generate(p, max_new_tokens) for p in prompts]
        gaps = [oracle.choice_gaps(p, o) for p, o in zip(prompts, outs)]
    max_gap = max(max(g) for g in gaps)
    expected, served = expected_moe_layers(cfg), served_moe_layers(log)
    all_served = bool(expected) and sorted(served) == expected
    result = {
        "prompts": prompts,
        "served": outs,
        "oracle": oracle_outs,
        "exact_prompts": sum(a == b for a, b in zip(outs, oracle_outs)),
        "gaps": gaps,
        "max_gap": max_gap,
        "moe_layers_expected": expected,
        "moe_layers_served": {k: sorted(v) for k, v in sorted(served.items())},
        "fp4ext_layers_logged": all_served,
        "cpu_workaround_logged": CPU_WORKAROUND_LOG in log,
        "ok": max_gap <= GAP_TOLERANCE and all_served,
        "server_log": str(work / "server.log"),
    }
    if hf_oracle:
        hf = hf_choice_gaps(deq, prompts, outs)
        result["hf_gaps"] = [j["gaps"] for j in hf]
        result["hf_max_gap"] = max(max(j["gaps"]) for j in hf)
    return result


def check_against_default_backend(
    model_path, launch_args, *, prompts: list[list[int]], max_new_tokens: int = 16
) -> dict:
    """Greedy tokens of fp4ext vs SGLang's default NVFP4 MoE backend on the same model/flags."""
    base = [a for a in launch_args]
    outs_default, _ = serve_greedy(model_path, base, None, prompts, max_new_tokens)
    outs_fp4ext, log = serve_greedy(
        model_path, [*base, "--moe-runner-backend", "fp4ext"], None, prompts, max_new_tokens
    )
    first_diff = []
    for a, b in zip(outs_default, outs_fp4ext):
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        first_diff.append(d)
    expected = expected_moe_layers(json.loads((Path(model_path) / "config.json").read_text()))
    served = served_moe_layers(log)
    return {
        "default": outs_default,
        "fp4ext": outs_fp4ext,
        "identical_prompts": sum(d is None for d in first_diff),
        "first_divergence": first_diff,
        "moe_layers_expected": expected,
        "moe_layers_served": {k: sorted(v) for k, v in sorted(served.items())},
        "fp4ext_layers_logged": bool(expected) and sorted(served) == expected,
    }
