"""GLM-5's own architecture (``transformers``' ``GlmMoeDsaForCausalLM``) with fp4ext experts.

A tiny GLM-5 (DSA attention, sigmoid router with correction bias, routed scaling 2.5, shared
expert) built by transformers; its routed experts are NVFP4-quantised with our codec and the
dequantised values written back, so the untouched model is the oracle. Swapping the experts for
fp4ext must reproduce its logits and its greedy tokens.

CPU tier: the float32 torch twin (same math, different summation order). GPU tier: the Triton
kernels, which take bf16 activations and round the intermediate and the output to bf16.
"""

from __future__ import annotations

import copy

import pytest
import torch

from sglang_fp4ext.testing.compare import assert_close


def _tiny_glm5(seed):
    from sglang_fp4ext.testing.checkpoint import build_tiny_model
    from sglang_fp4ext.testing.hf_swap import quantize_experts

    model = build_tiny_model("glm_moe_dsa", seed=seed)
    packs = quantize_experts(model)
    return model, packs


def _greedy(model, prompt, n):
    out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


def _run(path, device, seed, logits_tol):
    from sglang_fp4ext.testing.hf_swap import swap_experts

    oracle, packs = _tiny_glm5(seed)
    oracle = oracle.to(device)
    ours = copy.deepcopy(oracle)
    swap_experts(ours, packs, path)
    g = torch.Generator().manual_seed(seed)
    vocab = oracle.config.vocab_size
    prompt = torch.randint(2, vocab, (1, 12), generator=g).to(device)
    batch = torch.randint(2, vocab, (3, 20), generator=g).to(device)
    with torch.no_grad():
        ref_logits = oracle(batch).logits.float()
        got_logits = ours(batch).logits.float()
        assert_close(got_logits, ref_logits, what=f"logits ({path})", **logits_tol)
        ref_tokens = _greedy(oracle, prompt, 32)
        got_tokens = _greedy(ours, prompt, 32)
    assert got_tokens == ref_tokens


def test_glm5_reference_experts_match_hf(seed):
    # Same float32 math as HF's expert loop on the same dequantised weights; only the summation
    # order differs, so logits agree to float32 rounding.
    _run("reference", "cpu", seed, dict(max_rel=1e-4, rms_rel=1e-5))


@pytest.mark.gpu
def test_glm5_triton_experts_match_hf_on_gpu(seed):
    # bf16 activations into the kernel and bf16 rounding of the intermediate and the output
    # (relative 2^-9 each) through 3 MoE layers: logits within 2e-2 of max and 1e-2 RMS.
    _run("triton", "cuda", seed, dict(max_rel=2e-2, rms_rel=1e-2))
