"""Test and benchmark helpers shipped with the package (tiny checkpoints, comparisons)."""
