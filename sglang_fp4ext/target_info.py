"""Hardware questions, asked through named predicates.

Every decision that depends on the GPU (which kernel path runs, whether native FP4 MMA exists,
how many SMs to fill) goes through a function here, never an inline capability comparison.
Nothing here imports SGLang; torch is imported lazily so ``fp4ext info`` works anywhere.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

__all__ = [
    "Capability",
    "is_interpreter",
    "has_cuda_gpu",
    "device_capability",
    "device_name",
    "num_sms",
    "smem_per_block",
    "has_native_fp4_mma",
    "supports_triton_w4a16",
    "supports_gluon_decode",
    "supports_wgmma_prefill",
    "supports_w4a4_prefill",
    "arch_capability",
    "kernel_path",
    "SM120_SMEM_PER_BLOCK",
    "SM_LIMITS_SOURCE",
    "SMLimits",
    "sm_limits",
]

Capability = tuple[int, int]

#: Opt-in shared memory per block on SM120 (RTX PRO 6000 / RTX 50): 99 KiB. Every config that may
#: run there must fit (https://github.com/Dao-AILab/quack/pull/118 reports
#: shared_memory_per_block_optin=101376 on an RTX 5060).
SM120_SMEM_PER_BLOCK = 101_376


@dataclass(frozen=True)
class SMLimits:
    """What one SM of a compute capability holds at once: the inputs of an occupancy estimate
    (``bench.target_resources``). Shared memory in bytes, registers 32-bit."""

    max_warps: int
    max_threads: int
    max_blocks: int
    regs: int
    max_regs_per_thread: int
    #: Registers are allocated per warp in units of this many (the occupancy calculator's
    #: ``regAllocUnit``), from 4 sub-partitions holding a quarter of the file each.
    reg_alloc_unit: int
    reg_sub_partitions: int
    smem_per_sm: int
    smem_per_block_optin: int
    #: Shared memory the driver reserves per block (from cc 8.0) and the allocation unit.
    smem_reserved_per_block: int
    smem_alloc_unit: int
    max_threads_per_block: int = 1024


#: Where every :data:`_SM_LIMITS` figure comes from.
SM_LIMITS_SOURCE = (
    "CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
    "(https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html"
    "#features-and-technical-specifications); for 10.0 and 12.0 also the Blackwell Tuning Guide "
    "section 1.4.1.1 Occupancy (https://docs.nvidia.com/cuda/blackwell-tuning-guide/index.html: "
    "48 warps an SM on 12.0, 64 on 10.0; 64K registers an SM, 255 a thread; 32 blocks an SM; "
    "228 KB shared memory an SM on 10.0; on 12.0 a 128 KB L1 of which shared memory takes at "
    "most 100 KB, 99 KB a block). Register allocation unit (256 a warp), "
    "4 register sub-partitions, 128 B shared-memory unit and the 1 KB reserved a block: the CUDA "
    "occupancy calculator (cuda_occupancy.h); not re-checked for 12.0 in a primary source"
)

_KB = 1024
_SM_LIMITS: dict[Capability, SMLimits] = {
    (8, 0): SMLimits(64, 2048, 32, 65536, 255, 256, 4, 164 * _KB, 163 * _KB, _KB, 128),
    (9, 0): SMLimits(64, 2048, 32, 65536, 255, 256, 4, 228 * _KB, 227 * _KB, _KB, 128),
    (10, 0): SMLimits(64, 2048, 32, 65536, 255, 256, 4, 228 * _KB, 227 * _KB, _KB, 128),
    (12, 0): SMLimits(48, 1536, 32, 65536, 255, 256, 4, 100 * _KB, SM120_SMEM_PER_BLOCK, _KB, 128),
}


def sm_limits(cap: Capability) -> SMLimits:
    """The per-SM limits of compute capability ``cap`` (:data:`SM_LIMITS_SOURCE`); a clear error
    for one without a sourced row."""
    try:
        return _SM_LIMITS[tuple(cap)]
    except KeyError:
        known = ", ".join(f"{a}.{b}" for a, b in _SM_LIMITS)
        raise ValueError(
            f"no per-SM limits for compute capability {cap[0]}.{cap[1]}; sourced: {known}"
        ) from None


def is_interpreter() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def has_cuda_gpu() -> bool:
    import warnings

    import torch

    with warnings.catch_warnings():
        # A CPU machine with only the user-space driver library (CI installs libcuda1 so that
        # sgl_kernel imports) makes torch warn that the driver is too old; it just means no GPU.
        warnings.simplefilter("ignore", UserWarning)
        return torch.cuda.is_available()


def device_capability(device=None) -> Capability | None:
    """(major, minor) of the CUDA device, or None without a GPU."""
    if not has_cuda_gpu():
        return None
    import torch

    return tuple(torch.cuda.get_device_capability(device))


def device_name(device=None) -> str | None:
    if not has_cuda_gpu():
        return None
    import torch

    return torch.cuda.get_device_name(device)


def num_sms(device=None) -> int | None:
    if not has_cuda_gpu():
        return None
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def smem_per_block(device=None) -> int | None:
    """Opt-in shared memory per block in bytes, or None without a GPU."""
    if not has_cuda_gpu():
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", None)


def has_native_fp4_mma(cap: Capability | None) -> bool:
    """Block-scaled FP4 tensor-core MMA exists: datacenter Blackwell (SM10x) and SM12x.

    Hopper (SM90) and Ampere (SM80) have none; NVFP4 there is dequantised in registers.
    """
    return cap is not None and cap[0] in (10, 11, 12)


def supports_triton_w4a16(cap: Capability | None) -> bool:
    """Our W4A16 Triton kernels need bf16 ``mma.sync`` (SM80 or newer)."""
    return cap is not None and cap >= (8, 0)


def supports_gluon_decode(cap: Capability | None) -> bool:
    """The Gluon decode kernels (``mma.sync`` bf16, ``fma.rn.bf16x2``) need SM80 or newer; the
    interpreter runs only the ``tl.dot`` family."""
    return cap is not None and cap >= (8, 0) and not is_interpreter()


def supports_pdl(cap: Capability | None) -> bool:
    """Programmatic dependent launch (``griddepcontrol``: a kernel starts while the one before
    it in the stream finishes, and waits for it in-kernel) exists from SM90."""
    return cap is not None and cap >= (9, 0)


def supports_wgmma_prefill(cap: Capability | None) -> bool:
    """The Gluon prefill kernels (``warpgroup_mma``, Hopper's asynchronous warpgroup MMA) exist on
    SM90 only; the interpreter runs only the ``tl.dot`` family."""
    return cap is not None and cap[0] == 9 and not is_interpreter()


def supports_w4a4_prefill(cap: Capability | None) -> bool:
    """The W4A4 prefill kernels (``tl.dot_scaled`` on e2m1 with e4m3 scales) compile to the
    block-scaled FP4 MMA on SM100 and SM12x; the interpreter runs them with fp32 operands."""
    return is_interpreter() or has_native_fp4_mma(cap)


def arch_capability(arch: str) -> Capability:
    """``"sm_90"`` / ``"sm_120"`` -> (9, 0) / (12, 0)."""
    digits = arch.removeprefix("sm_").rstrip("a")
    return int(digits[:-1]), int(digits[-1])


def kernel_path(cap: Capability | None) -> str:
    """The fp4ext expert path a device of capability ``cap`` runs, in words."""
    if cap is None:
        return "torch reference (no CUDA GPU)"
    if not supports_triton_w4a16(cap):
        return f"unsupported (sm_{cap[0]}{cap[1]} < sm_80): torch reference"
    from sglang_fp4ext import envs

    arch = f"sm_{cap[0]}{cap[1]}"
    decode = f"decode W4A16 ({arch}: Gluon, FP4 decoded in registers, bf16 mma)"
    try:
        bf16 = envs.PREFILL_ACTIVATIONS.value() == "bf16"
    except ValueError:  # `fp4ext info` flags it in its settings section
        bf16 = False
    if has_native_fp4_mma(cap) and not bf16:
        prefill = (
            "prefill W4A4 (NVFP4 activations with the static input scales, block-scaled "
            "FP4 MMA; W4A16 with SGLANG_FP4EXT_PREFILL_ACTIVATIONS=bf16)"
        )
    elif supports_wgmma_prefill(cap):
        prefill = "prefill W4A16 (Gluon wgmma)"
    else:
        prefill = "prefill W4A16 (Triton tl.dot)"
    return f"{decode}; {prefill}"
