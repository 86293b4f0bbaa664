"""The manifest of fp4ext's hooks on SGLang, as data: records, capability checks, rendering.

One :class:`HookRecord` per hook the plugin installs (``sglang_backend.HOOKS`` and
``capture_hooks.install``): the dotted target, why the hook exists, how it works, the SGLang
version it was verified on, the diff in ``patches/`` that adds the missing extension point to
SGLang, the *capability* (a dotted name that exists once SGLang has that extension point) and when
to remove the hook. ``patches/README.md`` renders :func:`render_markdown` between its manifest
markers (a test keeps them equal).

Capability, not version: when :func:`upstream_has` finds a record's capability in the running
SGLang, the plugin registers with that extension point and installs no hook for the record.

The check against an SGLang copy (``fp4ext patches check``) is ``patch_check.py``.

This module imports no SGLang at import time (``fp4ext patches list`` works without it).
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST",
    "PATCHES_DIR",
    "HookRecord",
    "list_patches",
    "record_for",
    "render_markdown",
    "render_table",
    "upstream_has",
    "upstream_object",
]

#: The diffs ship with the source tree (repo ``patches/``), not with the wheel.
PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches"

_METHOD = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
_VERIFIED = "0.5.23"


@dataclass(frozen=True)
class HookRecord:
    """One hook on SGLang. ``kind``: ``around`` (a ``HookRegistry`` AROUND hook on ``target``)
    or ``resolution`` (``register_resolution_hook`` on the step named by ``target``'s last part).
    ``params``: the target's ``inspect.signature`` parameter names, as verified. ``diff``: file in
    ``patches/`` (None: the hook uses a public extension point). ``capability``: dotted name that
    exists once SGLang has the upstream change (None: nothing upstream to wait for)."""

    number: int
    target: str
    kind: str
    params: tuple[str, ...]
    why: str
    how: str
    upstream: str
    remove_when: str
    diff: str | None = None
    capability: str | None = None
    verified: str = _VERIFIED

    @property
    def short(self) -> str:
        """``Class.method`` or ``module.function``: the last two dotted parts."""
        return ".".join(self.target.split(".")[-2:])

    @property
    def step(self) -> str:
        """The resolution step name (``resolution`` records)."""
        return self.target.rsplit(".", 1)[-1]


MANIFEST: tuple[HookRecord, ...] = (
    HookRecord(
        number=1,
        target=f"{_METHOD}.__init__",
        kind="around",
        params=("self", "quant_config"),
        why="the constructor raises 'Current platform does not support NVFP4' unless the "
        "platform is Blackwell or the backend is marlin; fp4ext's Triton kernels run on SM80+ "
        "(H100/H200, A100) and its torch reference on the CPU.",
        how="with fp4ext selected on a non-Blackwell platform, run the original inside SGLang's "
        "own override_platform(is_blackwell=True) scope.",
        upstream="register_moe_runner_core(name, factory, supports_platform=...) and "
        "runner_core_supports_platform(backend), consulted by the NVFP4 MoE platform check; "
        "fp4ext registers supports_platform.",
        remove_when="SGLang's NVFP4 MoE constructor asks registered runner cores about the "
        "platform.",
        diff="0001-runner-core-supports-platform.diff",
        capability="sglang.srt.layers.moe.moe_runner.runner.runner_core_supports_platform",
    ),
    HookRecord(
        number=2,
        target=f"{_METHOD}.process_weights_after_loading",
        kind="around",
        params=("self", "layer"),
        why="for an unknown backend the original falls into the CUTLASS path: it swizzles the "
        "block scales in place into the 128x4 layout (destroying the row-major scales fp4ext "
        "reads) and, with EP > 1, computes alphas from global [Eg] input scales against local "
        "[E] weight scales (a broadcast error).",
        how="with fp4ext, skip the original; build fp4ext's kernel layout from the loaded "
        "parameters (sglang_weights.process_weights), free the swizzled-scale placeholders and "
        "the checkpoint-layout copies, clear the dispatcher's FP4 input scale.",
        upstream="WeightOwningRunnerCore (moe_runner/base.py): a DispatchMoeRunnerCore with "
        "process_weights_after_loading(quant_method, layer); the NVFP4 method delegates to it "
        "after deinterleaving. Fp4ExtRunnerCore subclasses it.",
        remove_when="the NVFP4 MoE method delegates weight processing to registered runner cores.",
        diff="0002-nvfp4-moe-delegates-to-runner-core.diff",
        capability="sglang.srt.layers.moe.moe_runner.base.WeightOwningRunnerCore",
    ),
    HookRecord(
        number=3,
        target=f"{_METHOD}.apply",
        kind="around",
        params=("self", "layer", "dispatch_output"),
        why="for an unknown backend the original raises 'Unsupported moe_runner_backend for "
        "NVFP4 MoE'.",
        how="with fp4ext, call self.runner.run(dispatch_output, Fp4ExtQuantInfo); SGLang's "
        "MoeRunner hands it to Fp4ExtRunnerCore.",
        upstream="the same WeightOwningRunnerCore: apply returns "
        "self.runner.run(dispatch_output, core.build_quant_info(layer)).",
        remove_when="the NVFP4 MoE method delegates apply to registered runner cores.",
        diff="0002-nvfp4-moe-delegates-to-runner-core.diff",
        capability="sglang.srt.layers.moe.moe_runner.base.WeightOwningRunnerCore",
    ),
    HookRecord(
        number=4,
        target="sglang.srt.arg_groups.memory_hook.handle_gpu_memory_settings",
        kind="resolution",
        params=("server_args",),
        why="choose the decode batch sizes and prefill token buckets SGLang captures (dense "
        "where decode lives, aligned with the fp4ext kernel buckets; prefill at the 128-token "
        "tile).",
        how="register_resolution_hook('handle_gpu_memory_settings') (launcher process): run "
        "SGLang's step first, then declare_resolution(cuda_graph_config=with_phase(...)) for "
        "every key the user did not set (_cuda_graph_config_locked), only when the backend is "
        "fp4ext.",
        upstream="none needed: register_resolution_hook is SGLang's public extension point.",
        remove_when="never (public API); re-verify the step name on SGLang upgrades.",
    ),
    HookRecord(
        number=5,
        target="sglang.srt.model_executor.forward_batch_info.enable_num_token_non_padded",
        kind="around",
        params=(),
        why="in TP mode SGLang routes CUDA-graph padding rows like real tokens, so a padded "
        "batch reads more experts' weights; SGLang only carries the real token count (and masks "
        "padded rows to -1 in TopK) for EP > 1, DP gather or a custom a2a.",
        how="original() or (backend is fp4ext and a2a none and no DP attention): plain TP then "
        "runs exactly the masking SGLang already runs for EP.",
        upstream="register_num_token_non_padded_condition(condition) in forward_batch_info: the "
        "predicate is also on while a registered condition holds; fp4ext registers its "
        "TP-mode condition.",
        remove_when="SGLang lets a runner backend ask for the non-padded token count.",
        diff="0003-num-token-non-padded-condition.diff",
        capability="sglang.srt.model_executor.forward_batch_info."
        "register_num_token_non_padded_condition",
    ),
)


def list_patches() -> tuple[HookRecord, ...]:
    """The manifest, in hook order."""
    return MANIFEST


def record_for(target: str) -> HookRecord:
    """The manifest record of a hook target (dotted path); KeyError names unknown targets."""
    for r in MANIFEST:
        if r.target == target:
            return r
    raise KeyError(f"{target!r} is not in the sglang_fp4ext hook manifest")


# ---- capability detection (in this process, against the imported SGLang) ------------------------


def upstream_object(target: str) -> Any | None:
    """The capability object for ``target`` when the running SGLang has it, else None."""
    cap = record_for(target).capability
    if cap is None:
        return None
    try:
        return pkgutil.resolve_name(cap)
    except (ImportError, AttributeError, ValueError):
        return None


def upstream_has(target: str) -> bool:
    """Does the running SGLang contain the extension point that replaces ``target``'s hook?"""
    return upstream_object(target) is not None


# ---- rendering ---------------------------------------------------------------------------------


def _doc_target(r: HookRecord) -> str:
    if r.kind == "resolution":
        return f"resolution step `{r.step}` (`{r.target}`)"
    return f"`{r.target}`"


def render_markdown() -> str:
    """The manifest section of ``patches/README.md`` (kept equal by a test)."""
    out = []
    for r in MANIFEST:
        sig = "(" + ", ".join(r.params) + ")"
        out += [
            f"### {r.number}. `{r.short}`"
            + (" (resolution hook)" if r.kind == "resolution" else ""),
            f"- **Target**: {_doc_target(r)}, {r.kind} hook; signature `{sig}`.",
            f"- **Why**: {r.why}",
            f"- **How**: {r.how}",
            f"- **Verified on**: SGLang {r.verified}.",
            f"- **Upstream change**: {r.upstream}",
            "- **Diff**: " + (f"[`{r.diff}`]({r.diff})" if r.diff else "none"),
            "- **Capability probe**: "
            + (
                f"`{r.capability}` (present: the plugin skips this hook)"
                if r.capability
                else "none"
            ),
            f"- **Remove when**: {r.remove_when}",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def render_table() -> str:
    """``fp4ext patches list``: one row per hook."""
    rows = [("#", "kind", "target", "signature", "diff", "capability probe")]
    for r in MANIFEST:
        rows.append(
            (
                str(r.number),
                r.kind,
                r.short,
                "(" + ", ".join(r.params) + ")",
                r.diff or "- (public API)",
                (r.capability or "-").rsplit(".", 1)[-1],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines += [f"{r.number}. {r.target}\n   remove when: {r.remove_when}" for r in MANIFEST]
    return "\n".join(lines)
