"""Fused NVFP4 mixture-of-experts: reference, weight layout, kernels and configs."""
