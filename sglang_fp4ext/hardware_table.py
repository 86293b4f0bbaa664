"""The hardware table's rows: the GPUs this project names, with every figure sourced and tagged
(types in ``gpu_spec.py``; lookup and formatting in ``hardware.py``).

GeForce parts run FP8/BF16 with FP32 accumulate at half the FP16-accumulate rate (RTX 5090:
209.5 vs 419 TFLOPS bf16); the RTX PRO 6000 figures are full rate (hardware-and-model.md §3).

``boost_clock_mhz`` is the clock the vendor's tensor peaks are computed at. For Hopper that is
1830 MHz, not the 1980 MHz maximum boost; the tests reproduce each dense peak as
``sms x boost_clock x flop_per_clk_per_sm`` to keep the table honest.

Reference-doc citations are to ``/work/shared/reference/hardware-and-model.md`` (``HM``).
"""

from __future__ import annotations

from sglang_fp4ext.gpu_spec import (
    DERIVED,
    MEASURED,
    NA,
    PRECISIONS,
    THIRD_PARTY,
    UNSOURCED,
    VENDOR,
    GPUSpec,
    Peaks,
    Source,
)

__all__ = ["SPECS"]

# ---- sources ----------------------------------------------------------------------------------

_HM = "hardware-and-model.md"
_CUDA_GUIDE = (
    "CUDA C++ Programming Guide, technical specifications per compute capability "
    "(https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html"
    "#features-and-technical-specifications)"
)
_SMEM_SM120 = Source(
    VENDOR,
    f"{_CUDA_GUIDE}: 99 KB/block for 12.0; {_HM} §1: 101,376 B reported by "
    "https://github.com/Dao-AILab/quack/pull/118 (RTX 5060) and "
    "https://github.com/flashinfer-ai/flashinfer/issues/2786",
)
_SMEM_227K = Source(VENDOR, f"{_CUDA_GUIDE}: 227 KB/block opt-in for 9.0 and 10.0")
_PRO6000_DIE = (
    f"{_HM} §1 (GB202, 188 of 192 SMs, 128 MB L2, 96 GB GDDR7 512-bit at 28 Gbps = 1,792 GB/s; "
    "https://www.purepc.pl/nvidia-rtx-pro-6000-rtx-pro-6000-max-q-rtx-pro-5000-rtx-pro-4500-oraz-"
    "rtx-pro-4000-profesjonalne-karty-graficzne-blackwell ; "
    "https://gpu.name/posts/nvidia-unveils-rtx-pro-6000-blackwell-gpu-with-24-064-cores-and-"
    "96gb-memory)"
)
_PRO6000_CC = Source(
    VENDOR,
    f"{_HM} §1: cc 12.0 (https://nvidia.github.io/TransformerEngine/support_matrix.html); "
    "Server Edition reports sm_120 (https://github.com/antirez/ds4/pull/256)",
)
_HMC_PRO6000 = (
    "https://hmc-tech.com/gpu/nvidia-rtx-pro-6000-blackwell-vs-amd-radeon-pro-duo-polaris "
    f"(site-computed at 2617 MHz), {_HM} §3"
)
_SM120_RATE = Source(
    DERIVED,
    f"{_HM} §3: PRO 6000 peaks = 188 SM x 2.617 GHz x {{4096, 2048, 1024, 512}} FLOP/clk/SM "
    "for FP4/FP8/BF16/TF32 (full-rate FP32 accumulate on the pro part)",
)
_MAINHORSE = "https://main-horse.github.io/posts/5090-mm-perf ('Spec' column, dense)"
_H_SPARSE = "NVIDIA lists Hopper tensor peaks 'with sparsity'; dense is half"
_HOPPER_WP = (
    "NVIDIA Hopper whitepaper via https://glennklockwood.com/garden/processors/h100 "
    "(132 SMs, 1.83 GHz tensor clock, BF16 989.4 / FP8 1978.9 dense)"
)
_HOPPER_RATE = Source(
    DERIVED,
    "dense vendor peak / (132 SM x 1.83 GHz) = {8192, 4096, 2048} FLOP/clk/SM for FP8/BF16/TF32",
)
_A100_PAGE = "https://www.nvidia.com/en-us/data-center/a100/ ('*' = with sparsity)"
_AMPERE_WP = (
    "NVIDIA Ampere architecture whitepaper (https://images.nvidia.com/aem-dam/en-zz/Solutions/"
    "data-center/nvidia-ampere-architecture-whitepaper.pdf)"
)
_B200_TABLE = (
    "NVIDIA GB200 NVL72 / HGX B200 specification table, per-GPU HGX B200 column, figures "
    "with sparsity, as quoted at https://zdszero.github.io/Computer/Artificial_Intelligence/"
    "Hardware.html ; same values at https://glennklockwood.com/garden/processors/B200"
)


def _na(why: str) -> Source:
    return Source(NA, why)


def _spec(*, src: dict[str, Source], **kw) -> GPUSpec:
    return GPUSpec(sources=tuple(sorted(src.items())), **kw)


def _same(prefix: str, source: Source) -> dict[str, Source]:
    return {f"{prefix}.{p}": source for p in PRECISIONS}


# ---- the table --------------------------------------------------------------------------------


def _pro6000(
    key: str,
    name: str,
    match: str,
    clock: float | None,
    clock_src: Source,
    dense: Peaks,
    sparse: Peaks,
    dense_src: dict,
    sparse_src: dict,
) -> GPUSpec:
    return _spec(
        key=key,
        name=name,
        match_names=(match,),
        capability=(12, 0),
        sms=188,
        boost_clock_mhz=clock,
        mem_bandwidth_gbs=1792.0,
        l2_mb=128.0,
        smem_per_block_optin=101_376,
        memory_gb=96.0,
        dense_tflops=dense,
        sparse_tflops=sparse,
        flop_per_clk_per_sm=Peaks(4096, 2048, 1024, 512),
        src={
            "capability": _PRO6000_CC,
            "sms": Source(THIRD_PARTY, _PRO6000_DIE),
            "boost_clock_mhz": clock_src,
            "mem_bandwidth_gbs": Source(THIRD_PARTY, _PRO6000_DIE),
            "l2_mb": Source(THIRD_PARTY, _PRO6000_DIE),
            "smem_per_block_optin": _SMEM_SM120,
            "memory_gb": Source(THIRD_PARTY, _PRO6000_DIE),
            "flop_per_clk_per_sm": _SM120_RATE,
            **dense_src,
            **sparse_src,
        },
    )


SPECS: tuple[GPUSpec, ...] = (
    _pro6000(
        "rtx-pro-6000-ws",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "rtx pro 6000 blackwell workstation edition",
        2617.0,
        Source(THIRD_PARTY, f"{_HM} §1 table: 2617 MHz boost ({_HMC_PRO6000})"),
        Peaks(2015, 1008, 504, 252),
        Peaks(4030, 2015, 1008, 504),
        _same("dense", Source(THIRD_PARTY, _HMC_PRO6000)),
        {
            **_same("sparse", Source(THIRD_PARTY, _HMC_PRO6000)),
            "sparse.fp4": Source(
                THIRD_PARTY,
                f"{_HMC_PRO6000}: 4.03 PFLOPS; NVIDIA's '4000 AI TOPS' (via press, {_HM} §1) is "
                "this figure rounded",
            ),
        },
    ),
    _pro6000(
        "rtx-pro-6000-maxq",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "rtx pro 6000 blackwell max-q workstation edition",
        2288.0,
        Source(
            THIRD_PARTY,
            f"{_HM} §1 table: 2288 MHz (https://technical.city/en/video/"
            "RTX-4000-SFF-Ada-Generation-vs-RTX-PRO-6000-Blackwell-Max-Q); one site says 2617",
        ),
        Peaks(1762, 881, 440, 220),
        Peaks(3524, 1762, 881, 440),
        _same("dense", Source(DERIVED, f"{_HM} §3 Max-Q column: the WS per-SM rates at 2288 MHz")),
        _same("sparse", Source(DERIVED, "2 x dense (2:4 sparsity); no vendor figure found")),
    ),
    _pro6000(
        "rtx-pro-6000-server",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "rtx pro 6000 blackwell server edition",
        None,
        Source(UNSOURCED, f"{_HM} §1/§11: Server Edition boost clock not found"),
        Peaks(),
        Peaks(),
        _same(
            "dense",
            Source(
                UNSOURCED,
                f"{_HM} §3: no NVIDIA figure for the Server Edition; needs its boost clock "
                "(the circulating '3.7 PFLOPS FP4' could not be traced)",
            ),
        ),
        _same("sparse", Source(UNSOURCED, f"{_HM} §3: no figure found")),
    ),
    _spec(
        key="rtx-5090",
        name="NVIDIA GeForce RTX 5090",
        match_names=("geforce rtx 5090",),
        capability=(12, 0),
        sms=170,
        boost_clock_mhz=2407.0,
        mem_bandwidth_gbs=1792.0,
        l2_mb=96.0,
        smem_per_block_optin=101_376,
        memory_gb=32.0,
        dense_tflops=Peaks(1676, 419, 209.5, 104.8),
        sparse_tflops=Peaks(3352, 838, 419, 209.5),
        flop_per_clk_per_sm=Peaks(4096, 1024, 512, 256),
        src={
            "capability": Source(
                MEASURED, f"{_MAINHORSE}: mmapeak prints 'Compute capability 12.0'"
            ),
            "sms": Source(MEASURED, f"{_MAINHORSE}: 'Multiprocessor count: 170'"),
            "boost_clock_mhz": Source(
                THIRD_PARTY,
                f"{_HM} §3 (170 x 2.407 GHz x 4096 = 1676); "
                "https://pocketmags.com/linux-format-magazine/may-2025/articles/"
                "nvidia-geforce-rtx-5090",
            ),
            "mem_bandwidth_gbs": Source(
                THIRD_PARTY, "https://www.spheron.network/blog/nvidia-rtx-5090-specs/"
            ),
            "l2_mb": Source(THIRD_PARTY, f"{_HM} §1: 96 MB L2"),
            "smem_per_block_optin": _SMEM_SM120,
            "memory_gb": Source(
                THIRD_PARTY, "https://www.spheron.network/blog/nvidia-rtx-5090-specs/"
            ),
            "flop_per_clk_per_sm": Source(
                DERIVED,
                f"{_MAINHORSE} spec / (170 SM x 2.407 GHz): FP4 4096; FP8 and BF16 with FP32 "
                "accumulate run at half the FP16-accumulate rate on GeForce (1024, 512); TF32 256",
            ),
            **_same("dense", Source(THIRD_PARTY, _MAINHORSE + " (FP32-accumulate rows)")),
            "dense.fp4": Source(DERIVED, f"{_HM} §3: 3352 sparse / 2 = 170 x 2.407 GHz x 4096"),
            **_same("sparse", Source(DERIVED, "2 x dense (2:4 sparsity)")),
            "sparse.fp4": Source(
                VENDOR,
                "'3352 AI TOPS', https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/ "
                "(via https://analysis.castromedia.org/analysis/compute/entities/rtx-5090.html; "
                f"{_HM} §3)",
            ),
        },
    ),
    _spec(
        key="b200",
        name="NVIDIA B200 (HGX)",
        match_names=("b200",),
        capability=(10, 0),
        sms=148,
        boost_clock_mhz=None,
        mem_bandwidth_gbs=7700.0,
        l2_mb=None,
        smem_per_block_optin=232_448,
        memory_gb=180.0,
        dense_tflops=Peaks(9000, 4500, 2250, 1100),
        sparse_tflops=Peaks(18000, 9000, 4500, 2200),
        flop_per_clk_per_sm=Peaks(),
        src={
            "capability": Source(VENDOR, "https://developer.nvidia.com/cuda-gpus (B200: 10.0)"),
            "sms": Source(
                THIRD_PARTY, "https://hmc-tech.com/gpus/nvidia-b200-vs-nvidia-b100 (148 SMs)"
            ),
            "boost_clock_mhz": Source(
                UNSOURCED,
                "NVIDIA publishes no tensor clock for B200 (hmc-tech lists 1.98 GHz boost, "
                "1.86 GHz tensor; not used), so per-SM rates are not reproduced",
            ),
            "mem_bandwidth_gbs": Source(
                VENDOR,
                f"{_B200_TABLE}: 180 GB HBM3E, 7.7 TB/s (DGX B200 quotes 64 TB/s per 8 GPUs)",
            ),
            "l2_mb": Source(UNSOURCED, "no NVIDIA L2 figure for B200 found"),
            "smem_per_block_optin": _SMEM_227K,
            "memory_gb": Source(VENDOR, _B200_TABLE),
            "flop_per_clk_per_sm": Source(UNSOURCED, "needs the tensor clock, which is unsourced"),
            **_same("sparse", Source(VENDOR, _B200_TABLE)),
            **_same("dense", Source(DERIVED, "vendor sparse / 2")),
        },
    ),
    _spec(
        key="h200",
        name="NVIDIA H200 (SXM)",
        match_names=("h200",),
        capability=(9, 0),
        sms=132,
        boost_clock_mhz=1830.0,
        mem_bandwidth_gbs=4800.0,
        l2_mb=60.0,
        smem_per_block_optin=232_448,
        memory_gb=141.0,
        dense_tflops=Peaks(None, 1979, 989, 494),
        sparse_tflops=Peaks(None, 3958, 1979, 989),
        flop_per_clk_per_sm=Peaks(None, 8192, 4096, 2048),
        src={
            "capability": Source(VENDOR, "https://developer.nvidia.com/cuda-gpus (H200: 9.0)"),
            "sms": Source(
                THIRD_PARTY,
                f"{_HM} §2 (https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html)",
            ),
            "boost_clock_mhz": Source(
                DERIVED,
                f"H200 is the H100 SXM's GH100 part with HBM3e ({_HM} §2) and has identical tensor "
                f"peaks, so the H100 SXM's 1830 MHz peak clock applies ({_HOPPER_WP}); "
                "nvidia-smi on the project's H200 reports a 1980 MHz max SM clock",
            ),
            "mem_bandwidth_gbs": Source(
                VENDOR, f"https://www.nvidia.com/en-us/data-center/h200/ ({_HM} §2)"
            ),
            "l2_mb": Source(
                MEASURED,
                "torch.cuda.get_device_properties().L2_cache_size = 62,914,560 B (60 MiB) on the "
                f"project's H200; {_HM} §2 assumed the H100 SXM's 50 MB, which "
                "the driver does not report for this part",
            ),
            "smem_per_block_optin": _SMEM_227K,
            "memory_gb": Source(VENDOR, "https://www.nvidia.com/en-us/data-center/h200/"),
            "flop_per_clk_per_sm": _HOPPER_RATE,
            **_same(
                "sparse",
                Source(VENDOR, f"https://www.nvidia.com/en-us/data-center/h200/ ({_HM} §3)"),
            ),
            **_same("dense", Source(DERIVED, f"{_H_SPARSE} ({_HM} §3; also itkb.uw.cz)")),
            "dense.fp4": _na(f"Hopper has no FP4 tensor mode ({_HM} §2)"),
            "sparse.fp4": _na(f"Hopper has no FP4 tensor mode ({_HM} §2)"),
        },
    ),
    _spec(
        key="h100-sxm",
        name="NVIDIA H100 SXM5 80GB",
        match_names=("h100 80gb hbm3",),
        capability=(9, 0),
        sms=132,
        boost_clock_mhz=1830.0,
        mem_bandwidth_gbs=3350.0,
        l2_mb=50.0,
        smem_per_block_optin=232_448,
        memory_gb=80.0,
        dense_tflops=Peaks(None, 1979, 989, 494),
        sparse_tflops=Peaks(None, 3958, 1979, 989),
        flop_per_clk_per_sm=Peaks(None, 8192, 4096, 2048),
        src={
            "capability": Source(VENDOR, "https://developer.nvidia.com/cuda-gpus (H100: 9.0)"),
            "sms": Source(THIRD_PARTY, _HOPPER_WP),
            "boost_clock_mhz": Source(
                THIRD_PARTY, _HOPPER_WP + "; 1.98 GHz is the non-tensor boost"
            ),
            "mem_bandwidth_gbs": Source(
                VENDOR, "https://www.nvidia.com/en-us/data-center/h100/ (3.35 TB/s)"
            ),
            "l2_mb": Source(
                THIRD_PARTY,
                "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html (NVIDIA partner "
                f"table, 50 MB); {_HM} §2",
            ),
            "smem_per_block_optin": _SMEM_227K,
            "memory_gb": Source(VENDOR, "https://www.nvidia.com/en-us/data-center/h100/"),
            "flop_per_clk_per_sm": _HOPPER_RATE,
            **_same(
                "sparse",
                Source(VENDOR, "https://www.nvidia.com/en-us/data-center/h100/ (with sparsity)"),
            ),
            **_same("dense", Source(DERIVED, _H_SPARSE)),
            "dense.fp4": _na("Hopper has no FP4 tensor mode"),
            "sparse.fp4": _na("Hopper has no FP4 tensor mode"),
        },
    ),
    _spec(
        key="a100-sxm4-80gb",
        name="NVIDIA A100 SXM4 80GB",
        match_names=("a100-sxm4-80gb",),
        capability=(8, 0),
        sms=108,
        boost_clock_mhz=1410.0,
        mem_bandwidth_gbs=2039.0,
        l2_mb=40.0,
        smem_per_block_optin=166_912,
        memory_gb=80.0,
        dense_tflops=Peaks(None, None, 312, 156),
        sparse_tflops=Peaks(None, None, 624, 312),
        flop_per_clk_per_sm=Peaks(None, None, 2048, 1024),
        src={
            "capability": Source(VENDOR, "https://developer.nvidia.com/cuda-gpus (A100: 8.0)"),
            "sms": Source(VENDOR, _AMPERE_WP),
            "boost_clock_mhz": Source(VENDOR, _AMPERE_WP),
            "mem_bandwidth_gbs": Source(VENDOR, f"{_A100_PAGE}: 80GB SXM 2,039 GB/s"),
            "l2_mb": Source(VENDOR, _AMPERE_WP),
            "smem_per_block_optin": Source(VENDOR, f"{_CUDA_GUIDE}: 163 KB/block opt-in for 8.0"),
            "memory_gb": Source(VENDOR, _A100_PAGE),
            "flop_per_clk_per_sm": Source(DERIVED, "dense vendor peak / (108 SM x 1.41 GHz)"),
            "dense.bf16": Source(VENDOR, _A100_PAGE),
            "dense.tf32": Source(VENDOR, _A100_PAGE),
            "sparse.bf16": Source(VENDOR, _A100_PAGE),
            "sparse.tf32": Source(VENDOR, _A100_PAGE),
            "dense.fp8": _na("Ampere has no FP8 tensor mode"),
            "sparse.fp8": _na("Ampere has no FP8 tensor mode"),
            "dense.fp4": _na("Ampere has no FP4 tensor mode"),
            "sparse.fp4": _na("Ampere has no FP4 tensor mode"),
        },
    ),
)
