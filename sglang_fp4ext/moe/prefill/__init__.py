"""The prefill path: pair slots grouped by expert, grouped GEMMs (config, heuristic, launch plan
and its tl.dot, Gluon wgmma and W4A4 kernel modules)."""
