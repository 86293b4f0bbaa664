"""GLM-5's own architecture (``transformers``' ``GlmMoeDsaForCausalLM``) with fp4ext experts.

A tiny GLM-5 (DSA attention, sigmoid router with correction bias, routed scaling 2.5, shared
expert) built by transformers; its routed experts are NVFP4-quantised with our codec and the
dequantised values written back, so the untouched model is the oracle. Swapping the experts for
fp4ext must reproduce its logits and its greedy tokens.

CPU tier: the float32 torch twin (same math, different summation order). GPU tier: the Triton
kernels, which take bf16 activations and round the intermediate and the output to bf16. There the
oracle's expert choices are replayed into the swapped model (:class:`RoutingTape`): the tiny
random model's sigmoid router has near-ties that any bf16 MoE boundary flips (measured on CPU:
the fp32 twin with only its input and output rounded to bf16 flips experts for 2 of 4 seeds, up
to max_rel 0.20 on the logits), and a flipped expert says nothing about the kernels.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from sglang_fp4ext.testing.compare import assert_close, error_stats


def _tiny_glm5(seed):
    from sglang_fp4ext.testing.checkpoint import build_tiny_model
    from sglang_fp4ext.testing.hf_swap import quantize_experts

    model = build_tiny_model("glm_moe_dsa", seed=seed)
    packs = quantize_experts(model)
    return model, packs


class RoutingTape:
    """Records the oracle's router output (``top_k_index``, ``top_k_weights``) per MoE layer and
    call (forward pre-hooks on its experts) and feeds it, in the same order, to the swapped
    model's experts: the weights belong to the chosen experts, so they travel together."""

    def __init__(self, oracle, ours):
        from sglang_fp4ext.testing.hf_swap import moe_expert_modules

        self.layers = list(moe_expert_modules(oracle))
        self.tape = {i: [] for i in self.layers}
        self.cursor = dict.fromkeys(self.layers, 0)
        self.flips = 0  # choices of ours' own router that the tape overrode
        for i in self.layers:
            oracle.model.layers[i].mlp.experts.register_forward_pre_hook(
                functools.partial(self._record, i)
            )
            ours.model.layers[i].mlp.experts.register_forward_pre_hook(
                functools.partial(self._replay, i)
            )

    def _record(self, i, module, args):
        self.tape[i].append((args[1].detach().clone(), args[2].detach().clone()))

    def _replay(self, i, module, args):
        ids, weights = (t.to(args[1].device) for t in self.tape[i][self.cursor[i]])
        self.cursor[i] += 1
        assert ids.shape == args[1].shape, (i, ids.shape, args[1].shape)
        self.flips += int((args[1].sort(-1).values != ids.sort(-1).values).any(-1).sum())
        return (args[0], ids, weights.to(args[2].dtype), *args[3:])


def _greedy(model, prompt, n):
    out = model.generate(
        prompt,
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, prompt.shape[1] :].tolist()


def _run(path, device, seed, logits_tol, pin_routing=False):
    from sglang_fp4ext.testing.hf_swap import swap_experts

    oracle, packs = _tiny_glm5(seed)
    oracle = oracle.to(device)
    ours = copy.deepcopy(oracle)
    swap_experts(ours, packs, path)
    tape = RoutingTape(oracle, ours) if pin_routing else None
    g = torch.Generator().manual_seed(seed)
    vocab = oracle.config.vocab_size
    prompt = torch.randint(2, vocab, (1, 12), generator=g).to(device)
    batch = torch.randint(2, vocab, (3, 20), generator=g).to(device)
    with torch.no_grad():
        ref_logits = oracle(batch).logits.float()
        got_logits = ours(batch).logits.float()
        st = error_stats(got_logits, ref_logits)
        print(
            f"seed {seed}: logits ({path}) vs HF: max_rel {st.max_rel:.2e}, "
            f"rms_rel {st.rms_rel:.2e} (tolerance {logits_tol})"
        )
        assert_close(got_logits, ref_logits, what=f"logits ({path})", **logits_tol)
        ref_tokens = _greedy(oracle, prompt, 32)
        got_tokens = _greedy(ours, prompt, 32)
    assert got_tokens == ref_tokens
    if tape is not None:
        assert all(tape.cursor[i] == len(tape.tape[i]) for i in tape.layers)  # every call replayed
        print(f"routing choices pinned to the oracle's: {tape.flips} token-layers differed")


def test_glm5_reference_experts_match_hf(seed):
    # Same float32 math as HF's expert loop on the same dequantised weights; only the summation
    # order differs, so logits agree to float32 rounding.
    _run("reference", "cpu", seed, dict(max_rel=1e-4, rms_rel=1e-5))


@pytest.mark.gpu
def test_glm5_triton_experts_match_hf_on_gpu(seed):
    # bf16 activations into the kernel and bf16 rounding of the intermediate and the output
    # (relative 2^-9 each) through 3 MoE layers: logits within 2e-2 of max and 1e-2 RMS.
    _run("triton", "cuda", seed, dict(max_rel=2e-2, rms_rel=1e-2), pin_routing=True)
