"""End-to-end check: a real SGLang server with ``--moe-runner-backend fp4ext`` against an oracle.

Used by ``fp4ext check`` and the end-to-end tests. The servers are ``server.SGLangServer``s
(CPU flags: ``cpu_workarounds.cpu_server_args``); here:

* ``dequantized_copy(ckpt, out)``: the same model with every NVFP4 tensor dequantised
  (``e2m1 * block_scale * weight_scale_2``, ModelOpt's rule) into float32, written as a plain
  Hugging Face checkpoint; this is what ``transformers`` runs as the oracle.
* ``hf_greedy``: ``transformers`` greedy decoding on token ids (no tokenizer needed).
* ``expected_moe_layers`` / ``served_moe_layers``: which layers of a model are MoE layers (SGLang's
  rule) and which ones the server log says fp4ext served.
* ``check_checkpoint_against_oracle`` / ``check_against_default_backend``: the checks behind
  ``fp4ext check``; ``judge_against_default`` the latter's rule.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from sglang_fp4ext import envs
from sglang_fp4ext.nvfp4.format import dequantize_nvfp4
from sglang_fp4ext.testing.cpu_workarounds import CPU_WORKAROUND_LOG
from sglang_fp4ext.testing.server import Progress, SGLangServer, flag_value, serving

__all__ = [
    "dequantized_copy",
    "hf_greedy",
    "hf_choice_gaps",
    "prompts_for",
    "expected_moe_layers",
    "served_moe_layers",
    "check_against_default_backend",
    "judge_against_default",
    "checked_server_args",
    "reference_is_checked_server",
    "without_speculation",
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
#: a different MoE summation order flip near-ties. Measured on two tiny GLM-4.5 checkpoints (4
#: prompts x 16 tokens each, logit std ~1.0) against transformers in float32: SGLang serving the
#: *dequantised* weights with its own bf16 MoE picked tokens up to 0.22 below the best; fp4ext on
#: the NVFP4 checkpoint up to 0.14. With the routed scaling applied twice (SGLang's GLM-4.5 CPU
#: path, see README) fp4ext missed by 1.9-2.6. Tiny DeepSeek-V3 (fused NVFP4 shared expert,
#: grouped routing): fp4ext 0.03 below SGLang's own MoE and 0.11 below transformers; with the
#: fused shared expert dropped 2.35, with gate/up swapped 2.28, without
#: ``install_cpu_workarounds`` 3.5 (4.4 against transformers).
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


def check_checkpoint_against_oracle(
    ckpt_dir,
    *,
    n_prompts: int = 4,
    max_new_tokens: int = 16,
    extra_args=(),
    env=None,
    work_dir=None,
    seed: int = 0,
    hf_oracle: bool = False,
    fp4ext_args=(),
    progress: Progress | None = None,
) -> dict:
    """Serve an NVFP4 checkpoint with fp4ext; judge every served token with an oracle.

    The oracle is the same SGLang server code on the *dequantised* checkpoint with SGLang's own
    bf16 MoE (same attention, so only the expert path differs): each fp4ext token is scored
    teacher-forced there, and its logprob must be within ``GAP_TOLERANCE`` of the oracle's best.
    ``extra_args`` go to both servers, ``fp4ext_args`` to the fp4ext one only (e.g.
    ``--enforce-shared-experts-fusion``, which the bf16 oracle does not need).
    ``hf_oracle=True`` also scores the tokens with ``transformers`` in float32 (an independent
    model implementation: it checks the SGLang oracle itself). ``fp4ext_layers_logged`` is true
    when the server log shows fp4ext serving exactly the model's MoE layers. The result is also
    written to ``<work_dir>/result.json`` (layer ids as strings), next to the logs.
    ``progress(kind, text)`` hears each phase ("phase") and the servers' start-up ("start",
    "wait", "retry", "up"). The two servers run one after the other. Measured together on the
    2-core CPU machine: both up in 76.5 s against 42.6 + 40.1 s one after the
    other, but 16 tokens took 17.4 s next to the idle oracle against 2.9 s alone, and the
    glm45 e2e fixture 221 s against 89 s.
    """
    ckpt_dir = Path(ckpt_dir)
    work = Path(work_dir or tempfile.mkdtemp(prefix="fp4ext-check-"))
    work.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda kind, text: None)
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    prompts = prompts_for(cfg["vocab_size"], n_prompts, seed=seed)
    say("phase", "dequantising the checkpoint for the oracle (SGLang's own bf16 MoE)")
    deq = dequantized_copy(ckpt_dir, work / "dequantized")
    fp4ext = SGLangServer(
        ckpt_dir,
        [
            *extra_args,
            *fp4ext_args,
            "--quantization",
            "modelopt_fp4",
            "--moe-runner-backend",
            "fp4ext",
        ],
        env=env,
        log_path=work / "server.log",
        name="fp4ext server",
    )
    oracle = SGLangServer(
        deq,
        [*extra_args, "--dtype", "bfloat16"],
        env=env,
        log_path=work / "oracle-server.log",
        name="oracle server",
    )

    def generate():
        say(
            "phase",
            f"generating {len(prompts)} prompts x {max_new_tokens} tokens on the fp4ext server",
        )
        return [fp4ext.generate(p, max_new_tokens) for p in prompts], fp4ext.log(tail=10**8)

    def score(outs):
        say("phase", "scoring every served token on the oracle server")
        return (
            [oracle.generate(p, max_new_tokens) for p in prompts],
            [oracle.choice_gaps(p, o) for p, o in zip(prompts, outs)],
        )

    with serving(fp4ext, progress=progress):
        outs, log = generate()
    with serving(oracle, progress=progress):
        oracle_outs, gaps = score(outs)
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
        say("phase", "scoring every served token with transformers in float32")
        hf = hf_choice_gaps(deq, prompts, outs)
        result["hf_gaps"] = [j["gaps"] for j in hf]
        result["hf_max_gap"] = max(max(j["gaps"]) for j in hf)
    (work / "result.json").write_text(json.dumps(result, indent=1))
    return result


def checked_server_args(launch_args) -> list[str]:
    """The checked server's flags: ``launch_args`` with fp4ext as the MoE backend and, when they
    turn speculative decoding on and name no draft backend, as the draft's too
    (``--speculative-moe-runner-backend fp4ext``; SGLang 0.5.23 would copy the target's anyway,
    ``arg_groups/overrides.py`` ``_speculative_moe_runner_default``)."""
    args = [*launch_args, "--moe-runner-backend", "fp4ext"]
    speculative = flag_value(args, "--speculative-algorithm") is not None
    if speculative and flag_value(args, "--speculative-moe-runner-backend") is None:
        args += ["--speculative-moe-runner-backend", "fp4ext"]
    return args


def without_speculation(launch_args) -> list[str]:
    """``launch_args`` without their ``--speculative-*`` flags (each with its value, unless the
    next item is a flag: the boolean ones take none)."""
    args, out, i = list(launch_args), [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--speculative-"):
            takes_value = "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("--")
            i += 2 if takes_value else 1
            continue
        out.append(a)
        i += 1
    return out


def reference_is_checked_server(launch_args, env=None) -> bool:
    """Whether ``check_against_default_backend``'s reference server would be its checked server
    again: the launch flags already name fp4ext (``--moe-runner-backend fp4ext``, as on a CPU,
    where SGLang's own NVFP4 MoE backends need a GPU) and no fault is injected (the checked server
    inherits ``SGLANG_FP4EXT_FAULT_INJECT`` from ``env``, default ``os.environ``; the reference
    never does). Then both would run the same command in the same environment."""
    env = os.environ if env is None else env
    named = flag_value(list(launch_args), "--moe-runner-backend")
    return named == "fp4ext" and not env.get(envs.FAULT_INJECT.name)


def check_against_default_backend(
    model_path,
    launch_args,
    *,
    prompts: list[list[int]],
    max_new_tokens: int = 16,
    tolerance: float = GAP_TOLERANCE,
    against_no_speculation: bool = False,
    progress: Progress | None = None,
) -> dict:
    """fp4ext vs SGLang's default NVFP4 MoE backend on the same model and flags, one server
    after the other (a real model fills the GPUs): fp4ext generates greedily first; the
    default-backend server then generates its own greedy tokens and scores fp4ext's teacher-forced
    (``choice_gaps``), since greedy tokens legitimately drift apart between W4A16 and W4A4
    numerics. The verdict is :func:`judge_against_default`'s.

    When the reference would be the checked server again (:func:`reference_is_checked_server`),
    the checked server plays both parts and no second server starts (``reference`` in the result
    says which): it generates the reference's tokens again and scores its own, as an identical
    second server would.

    ``against_no_speculation``: the launch flags turn speculative decoding on (NextN / MTP), and
    the reference is fp4ext on the same flags without their ``--speculative-*`` ones
    (:func:`without_speculation`), so only speculation differs: the draft and the target's verify
    batches (``B x draft tokens`` rows) against plain decode."""
    say = progress or (lambda kind, text: None)
    base = list(launch_args)
    if against_no_speculation and flag_value(base, "--speculative-algorithm") is None:
        raise ValueError("against_no_speculation needs --speculative-algorithm in launch_args")
    one_server = not against_no_speculation and reference_is_checked_server(base)
    checked = SGLangServer(model_path, checked_server_args(base), name="fp4ext server")
    # A fault injected for the check (SGLANG_FP4EXT_FAULT_INJECT) breaks the checked server only:
    # the reference runs fp4ext too where the launch flags name it (a CPU has no other backend).
    no_fault = {envs.FAULT_INJECT.name: ""}
    if against_no_speculation:
        ref_args, ref_name = checked_server_args(without_speculation(base)), "no-speculation"
    else:
        ref_args, ref_name = base, "default-backend"
    default = (
        checked
        if one_server
        else SGLangServer(model_path, ref_args, env=no_fault, name=f"{ref_name} server")
    )

    def reference_pass(outs_fp4ext):
        who = "the same server" if one_server else f"the {ref_name} server"
        say("phase", f"generating {len(prompts)} prompts on {who} (reference)")
        outs_default = [default.generate(p, max_new_tokens) for p in prompts]
        say("phase", f"scoring fp4ext's tokens on {who} (teacher-forced)")
        gaps = [default.choice_gaps(p, o) for p, o in zip(prompts, outs_fp4ext)]
        return outs_default, gaps

    with serving(checked, progress=progress):
        say(
            "phase",
            f"generating {len(prompts)} prompts x {max_new_tokens} tokens on the fp4ext server",
        )
        outs_fp4ext = [checked.generate(p, max_new_tokens) for p in prompts]
        if one_server:
            outs_default, gaps = reference_pass(outs_fp4ext)
        log = checked.log(tail=10**8)
    if not one_server:
        with serving(default, progress=progress):
            outs_default, gaps = reference_pass(outs_fp4ext)
    first_diff = []
    for a, b in zip(outs_default, outs_fp4ext):
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        first_diff.append(d)
    expected = expected_moe_layers(json.loads((Path(model_path) / "config.json").read_text()))
    served = served_moe_layers(log)
    all_served = bool(expected) and sorted(served) == expected
    return {
        "default": outs_default,
        "fp4ext": outs_fp4ext,
        "reference": "checked server" if one_server else "second server",
        "identical_prompts": sum(d is None for d in first_diff),
        "first_divergence": first_diff,
        "gaps": gaps,
        "moe_layers_expected": expected,
        "moe_layers_served": {k: sorted(v) for k, v in sorted(served.items())},
        "fp4ext_layers_logged": all_served,
        **judge_against_default(first_diff, gaps, layers_served=all_served, tolerance=tolerance),
    }


def judge_against_default(
    first_divergence: list[int | None],
    gaps: list[list[float]],
    *,
    layers_served: bool,
    tolerance: float = GAP_TOLERANCE,
) -> dict:
    """The rule of ``fp4ext check --model-path``: pass when every fp4ext token is within
    ``tolerance`` (logits) of the default backend's best, scored teacher-forced, and fp4ext
    served every MoE layer. Returns ``ok``, ``max_gap`` and the verdict ``line``, which names
    each divergence and the gap of fp4ext's token there."""
    max_gap = max((max(g) for g in gaps if g), default=0.0)
    ok = layers_served and max_gap <= tolerance
    same = sum(d is None for d in first_divergence)
    parts = [f"{same}/{len(first_divergence)} prompts identical"]
    for i, d in enumerate(first_divergence):
        if d is not None:
            parts.append(
                f"prompt {i} diverges at token {d} (fp4ext's token {gaps[i][d]:.2f} below the "
                "default backend's best)"
            )
    parts.append(
        f"largest teacher-forced gap {max_gap:.2f} {'<=' if max_gap <= tolerance else '>'} "
        f"{tolerance}"
    )
    parts.append(f"fp4ext {'served' if layers_served else 'did NOT serve'} every MoE layer")
    line = f"{'PASS' if ok else 'FAIL'}: " + "; ".join(parts)
    return {"ok": ok, "max_gap": max_gap, "line": line}
