"""The decode path: few tokens per expert, GEMM1 and GEMM2 over pair slots (config, heuristic,
launch plan and its tl.dot and Gluon kernel modules)."""
