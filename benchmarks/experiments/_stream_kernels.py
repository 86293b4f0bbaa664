"""Triton kernels of ``decode_floor.py`` (``@triton.jit`` only): the memory floor of the decode
access pattern, no FP4 decode and no MMA."""

import triton
import triton.language as tl


@triton.jit
def _stream_experts(base_ptr, ids_ptr, expert_words, words_per_prog, out_ptr, PPE,
                    BLOCK: tl.constexpr):  # fmt: skip
    """Program ``p`` reads words ``[(p % PPE) * words_per_prog, +words_per_prog)`` of expert
    ``ids[p // PPE]`` (int32 words, ``BLOCK`` per iteration: 16-byte loads, many in flight per
    thread) and writes their wrapped sum, so the loads cannot be dropped."""
    pid = tl.program_id(0)
    e = tl.load(ids_ptr + pid // PPE).to(tl.int64)
    first = (pid % PPE) * words_per_prog
    n = tl.minimum(words_per_prog, expert_words - first)  # the last program of an expert: less
    start = e * expert_words + first
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for w0 in range(0, words_per_prog, BLOCK):
        acc += tl.load(base_ptr + start + w0 + offs, mask=w0 + offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


@triton.jit
def _empty(out_ptr):
    """One store per program: the cost of a launch and its grid, nothing else."""
    tl.store(out_ptr + tl.program_id(0), 1)
