"""The roofline PNG of a ``fp4ext bench`` result document (matplotlib, imported when called)."""

from __future__ import annotations

from pathlib import Path

from sglang_fp4ext import model_shapes

__all__ = ["write_plot"]


def write_plot(result: dict, path: Path) -> Path:
    """Roofline PNG: TFLOP/s vs arithmetic intensity (FLOP per floor byte).

    Roofs: the measured copy bandwidth and the measured bf16 matmul rate when there is a GPU, and
    the dense BF16 peak of the hardware table (never a sparse figure); each legend entry names its
    basis. Points: measured fp4ext and torch-peer rows. Without measurements the roofs come from
    the table (labelled "spec, not measured") and the cases are marked only by their intensity.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    shape = model_shapes.preset(result["preset"]["name"])
    rates = result.get("rates") or {}
    tokens = result["settings"]["tokens"]
    ai = {
        T: shape.flops(T) / shape.bytes_floor(shape.expected_distinct(T), tokens=T) for T in tokens
    }
    xs = [min(ai.values()) / 4, max(ai.values()) * 4]
    top = rates.get("bf16_matmul_tflops") or rates.get("dense_bf16_tflops")
    bw_top = rates.get("copy_bandwidth_Bps") or rates.get("spec_bandwidth_Bps")
    if top and bw_top:  # reach the ridge point so the roofline's knee shows
        xs[1] = max(xs[1], 2 * top * 1e12 / bw_top)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    roofs = []
    if rates.get("copy_bandwidth_Bps"):
        roofs.append((rates["copy_bandwidth_Bps"], "measured copy bandwidth", "tab:blue", "-"))
    if rates.get("spec_bandwidth_Bps"):
        roofs.append((rates["spec_bandwidth_Bps"], rates["spec_label"], "tab:blue", ":"))
    for bw, label, color, ls in roofs:
        ax.plot(
            xs,
            [x * bw / 1e12 for x in xs],
            color=color,
            ls=ls,
            label=f"{label}: {bw / 1e12:.2f} TB/s",
        )
    if rates.get("bf16_matmul_tflops"):
        v = rates["bf16_matmul_tflops"]
        ax.axhline(v, color="tab:red", label=f"measured bf16 matmul: {v:.0f} TFLOP/s")
    if rates.get("dense_bf16_tflops"):
        v = rates["dense_bf16_tflops"]
        ax.axhline(v, color="tab:red", ls=":", label=f"{rates['dense_bf16_basis']}: {v:g} TFLOP/s")
    rows = result.get("rows") or []
    if rows:
        x = [r["flops"] / r["bytes_floor"] for r in rows]
        ax.plot(x, [r["tflops"] for r in rows], "o-", color="k", label="fp4ext (measured)")
        for xi, r in zip(x, rows):
            ax.annotate(
                f"T={r['T']}",
                (xi, r["tflops"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        peer = [
            (xi, r["flops"] / (r["peer_us"] * 1e-6) / 1e12)
            for xi, r in zip(x, rows)
            if r["peer_us"]
        ]
        if peer:
            ax.plot(
                *zip(*peer), "s--", color="tab:gray", label="torch bf16 grouped-GEMM (measured)"
            )
    else:
        for a in ai.values():
            ax.axvline(a, color="tab:gray", lw=0.5)
        ax.plot([], [], color="tab:gray", lw=0.5, label="case intensity (no time measured)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys = [line_y for line in ax.get_lines() for line_y in line.get_ydata() if line_y > 0]
    if not ys:  # no roof and no point: keep a valid log axis
        ax.set_ylim(1e-2, 1e4)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the NVFP4 bytes floor)")
    ax.set_ylabel("TFLOP/s")
    where = result["env"]["gpu"] or "no GPU (nothing measured)"
    ax.set_title(f"fp4ext MoE roofline: {result['preset']['name']} on {where}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
