"""What ``fp4ext bench`` prints at the end: the text table of the result document (nothing
printed that was not measured). The progress bar while it runs is ``sglang_fp4ext.progress``.
"""

from __future__ import annotations

__all__ = ["format_block_table", "format_table", "format_target"]


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_table(result: dict) -> str:
    """The measured rows as a text table (nothing printed that was not measured)."""
    lines = []
    rates = result.get("rates") or {}
    if result["mode"] == "gpu":
        lines.append(
            f"{result['env']['gpu']} | {result['preset']['name']} | copy bandwidth "
            f"{rates['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, bf16 matmul "
            f"{rates['bf16_matmul_tflops']:.0f} TFLOP/s (both measured in this run)"
        )
        sgl = sorted({k for r in result["rows"] for k in r.get("sglang_peers") or {}})
        lines.append(
            f"{'T':>5} {'path':7} {'us':>9} {'floor us':>9} {'TB/s':>6} {'% BW':>6} "
            f"{'TFLOP/s':>8} {'torch us':>9} {'x torch':>7} {'check':>5}"
            + "".join(f" {'x ' + k.removeprefix('sglang-'):>20}" for k in sgl)
        )
        for r in result["rows"]:
            frac = r["fraction_of_copy_bw"]
            peers = r.get("sglang_peers") or {}
            lines.append(
                f"{r['T']:5d} {r['path']:7} {r['us']:9.1f} {_f(r['floor_us'], '9.1f')} "
                f"{r['achieved_TBps']:6.2f} {_f(None if frac is None else 100 * frac, '5.1f')}% "
                f"{r['tflops']:8.1f} {_f(r['peer_us'], '9.1f')} "
                f"{_f(r['speedup_vs_torch_peer'], '7.2f')} "
                f"{'ok' if r['check']['ok'] else 'FAIL':>5}"
                + "".join(f" {_f((peers.get(k) or {}).get('speedup'), '.2f'):>20}" for k in sgl)
            )
    else:
        lines.append("no CUDA GPU: nothing was timed; correctness check on the reference path")
        for c in result["check"]:
            lines.append(
                f"  {c['what']:<40} max_rel {c['max_rel']:.2e} rms_rel {c['rms_rel']:.2e} "
                f"(tolerance {c['tolerance']}) {'ok' if c['ok'] else 'FAIL'}"
            )
    proj = result.get("projection")
    if proj:
        if proj["rows"]:
            lines.append(f"PROJECTION (not measured) for {proj['target']}:")
            for p in proj["rows"]:
                lines.append(
                    f"  T={p['T']:5d} layer {p['projected_layer_us']:8.1f} us, "
                    f"{proj['n_moe_layers']} MoE layers "
                    f"{p['projected_step_us'] / 1e3:7.2f} ms/step, "
                    f"{p['projected_us_per_token']:8.1f} us/token"
                )
                if p.get("prefill_format"):  # compute-bound: both activation formats
                    w4 = p.get("prefill_w4a4_us")
                    lines.append(
                        f"          prefill W4A16 {p['prefill_w4a16_us']:8.1f} us, W4A4 "
                        + ("n/a" if w4 is None else f"{w4:8.1f} us")
                        + f" (served: {p['prefill_format'].upper()}; "
                        + p[f"prefill_{p['prefill_format']}_label"].split(": ", 1)[1]
                        + ")"
                    )
            lines.append("  assumptions: " + "; ".join(proj["assumptions"]))
        if proj.get("note"):
            lines.append(f"projection for {proj['target']}: {proj['note']}")
    return "\n".join(lines)


def format_block_table(result: dict) -> str:
    """``fp4ext bench --block``'s rows: the block per implementation (us, % of the copy
    bandwidth for the block's bytes), the routed experts' share of it, the shared expert and the
    router alone, and the ratio of each peer's block to fp4ext's."""
    bw = result["rates"]["copy_bandwidth_Bps"]
    lines = [
        f"{result['env']['gpu']} | {result['preset']['name']} MoE block (router, routed experts, "
        f"bf16 shared expert on the alternate stream) | copy bandwidth {bw / 1e12:.2f} TB/s "
        "(measured in this run)"
    ]
    peers = sorted({k for r in result["rows"] for k in r["impls"]} - {"fp4ext"})
    lines.append(
        f"{'T':>5} {'verify':>9} {'block us':>9} {'% BW':>6} {'routed us':>9} {'share':>6} "
        f"{'shared us':>9} {'router us':>9}" + "".join(f" {p + ' us':>18} {'x':>6}" for p in peers)
    )
    for r in result["rows"]:
        f = r["impls"].get("fp4ext")
        if f is None:
            lines.append(f"{r['T']:>5} fp4ext FAILED its check")
            continue
        line = (
            f"{r['T']:>5} {','.join(r['verify_of']) or '-':>9} {f['block_us']:>9.1f} "
            f"{f['block_pct_copy_bw']:>5.1f}% {f['routed_us']:>9.1f} "
            f"{100 * f['routed_share']:>5.0f}% {r['shared_us']:>9.1f} {r['router_us']:>9.1f}"
        )
        for p in peers:
            q = r["impls"].get(p)
            line += " " + (
                f"{q['block_us']:>18.1f} {q['block_us'] / f['block_us']:>5.2f}x"
                if q
                else f"{'-':>18} {'-':>6}"
            )
        lines.append(line)
    return "\n".join(lines)


def format_target(section: dict) -> str:
    """``fp4ext bench --project``'s target section: each launch's static resources on the target,
    the projected decode per family and T (labelled PROJECTION) and b12x's figures at equal
    bytes."""
    lines = []
    res = section.get("resources")
    if res:
        lim = res["limits"]
        lines.append(
            f"Static resources on {res['target']} ({res['arch']}, {res['sms']} SMs), compiled "
            f"here, shape E,H,I,top_k,ep = {res['shape']}; per SM: {lim['regs']} registers, "
            f"{lim['max_warps']} warps, {lim['max_blocks']} CTAs, {lim['smem_per_sm']} B shared "
            f"({lim['smem_per_block_optin']} B a CTA)"
        )
        lines.append(
            f"{'family':7} {'T':>3} {'kernel':17} {'grid':>13} {'thr':>4} {'regs':>4} "
            f"{'spill':>5} {'smem B':>7} {'CTA/SM':>6} {'limit':13} {'warps':>5} {'occ':>5} "
            f"{'resident':>10}"
        )
        for r in res["rows"]:
            head = (
                f"{r['family']:7} {r['T']:>3} {r['kernel']:17} {'x'.join(map(str, r['grid'])):>13}"
            )
            if r.get("error"):
                lines.append(f"{head} did not compile: {r['error']}")
                continue
            if r["cooperative"]:  # the grid must be resident at once, or the launch fails
                resident = "yes" if r["co_resident"] else "NO"
            else:
                resident = f"{r['waves']:.2f} waves"
            lines.append(
                f"{head} {r['threads_per_cta']:>4} {r['registers']:>4} "
                f"{_f(r['spill_store_bytes'], '>5')} {r['shared_bytes']:>7} {r['ctas_per_sm']:>6} "
                f"{','.join(r['limited_by']):13} {r['resident_warps_per_sm']:>5} "
                f"{r['occupancy']:>5.0%} {resident:>10}"
            )
        configs = {(r["family"], r["T"]): (r["config"], r["config_source"]) for r in res["rows"]}
        for (fam, T), (cfg, src) in configs.items():
            lines.append(f"  {fam} T={T}: {cfg} [{src}]")
    dec = section.get("decode")
    if dec and dec["rows"]:
        lines.append(
            f"PROJECTION (not measured) for {dec['target']}: decode us per MoE layer, from the "
            f"fraction of copy bandwidth measured on {dec['measured_on']} "
            f"({dec['measured_source']})"
        )
        lines.append(
            f"{'family':7} {'T':>3} {'bytes MB':>9} {'meas us':>8} {'% copy':>7} "
            f"{'proj us':>8} {'floor us':>8}"
        )
        for r in dec["rows"]:
            lines.append(
                f"{r['family']:7} {r['T']:>3} {r['bytes'] / 1e6:>9.2f} {r['measured_us']:>8.1f} "
                f"{r['measured_fraction_of_copy_bw']:>7.1%} {r['projected_us']:>8.1f} "
                f"{r['target_floor_us']:>8.1f}"
            )
        lines.append("  assumptions: " + "; ".join(dec["assumptions"]))
        if dec["missing"]:
            lines.append("  not in the measured file: " + ", ".join(dec["missing"]))
    for b in section.get("b12x") or []:
        line = (
            f"b12x {b['name']}: {b['bytes'] / 1e6:.2f} MB, {b['b12x_us']:.1f} us = "
            f"{b['b12x_fraction_of_spec_bw']:.0%} of spec bw ({b['b12x_gpu']})"
        )
        for fam, f in b["fp4ext"].items():
            line += f"; fp4ext {fam} PROJECTION {f['projected_us']:.1f} us ({f['efficiency_from']})"
        lines.append(line)
        lines.append(f"    source: {b['source']}" + (f"; {b['note']}" if b["note"] else ""))
    lines += [f"note: {n}" for n in section.get("notes", [])]
    return "\n".join(lines)
