"""End-to-end check: a real SGLang server with ``--moe-runner-backend fp4ext`` against an oracle.

Used by ``fp4ext check`` and the end-to-end tests. The servers are ``server.SGLangServer``s
(CPU flags: ``cpu_workarounds.cpu_server_args``); here:

* the oracle (``hf_oracle.py``): the checkpoint dequantised for ``transformers``, its greedy
  tokens and teacher-forced gaps, ``GAP_TOLERANCE``;
* ``expected_moe_layers`` / ``served_moe_layers``: which layers of a model are MoE layers (SGLang's
  rule) and which ones the server log says fp4ext served.
* ``check_checkpoint_against_oracle`` / ``check_against_default_backend``: the checks behind
  ``fp4ext check``; ``judge_against_default`` the latter's rule.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from sglang_fp4ext import envs
from sglang_fp4ext.testing.cpu_workarounds import CPU_WORKAROUND_LOG
from sglang_fp4ext.testing.hf_oracle import (
    GAP_TOLERANCE,
    dequantized_copy,
    hf_choice_gaps,
    hf_greedy,
    prompts_for,
)
from sglang_fp4ext.testing.server import Progress, SGLangServer, flag_value, serving

__all__ = [
    "GAP_TOLERANCE",
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
