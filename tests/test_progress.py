"""Progress bars of ``fp4ext tune`` and ``fp4ext bench`` (``sglang_fp4ext/progress.py``), CPU tier.

The bars are tqdm on stderr, on only for a terminal: piped or captured output carries no bar and
stays byte-identical. The postfix helpers (what the bar says) are pure and tested directly; one
tiny interpreter tune run shows the bar on a stand-in terminal.
"""

from __future__ import annotations

import io

import pytest

from sglang_fp4ext import model_shapes
from sglang_fp4ext import tune as TU
from sglang_fp4ext import tune_record as TR
from sglang_fp4ext.bench.gpu_run import step_text
from sglang_fp4ext.moe.shape import Target
from sglang_fp4ext.progress import Progress, best_postfix


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_best_postfix():
    want = "best decode 12.3 us, prefill 45.6 us"
    assert best_postfix({"decode": 12.34, "prefill": 45.6}) == want
    assert best_postfix({"decode": None, "prefill": 7.0}) == "best prefill 7.0 us"
    assert best_postfix({"decode": None}) == ""


def test_tune_bar_postfix_counts_and_best_per_path():
    timings = [
        {"path": "decode", "us": 30.0},
        {"path": "decode", "us": 12.5},
        {"path": "prefill", "error": "CompilationError: ..."},  # failed: no time, not a best
    ]
    assert TR.bar_postfix(64, 3, 12, timings) == "T=64 3/12 best decode 12.5 us"
    assert TR.bar_postfix(64, 0, 12, []) == "T=64 0/12"


def test_bench_step_text_names_the_best_speedup_so_far():
    rows = [{"speedup_vs_torch_peer": 1.5}, {"speedup_vs_torch_peer": 2.25}]
    assert step_text(8, 41.04, rows) == "T=8 41.0 us, best 2.25x torch"
    assert step_text(8, 41.04, [{"speedup_vs_torch_peer": None}]) == "T=8 41.0 us"


def test_off_when_not_a_terminal_and_lines_unchanged():
    err, out = io.StringIO(), io.StringIO()
    bar = Progress(3, "tune x", err)
    assert not bar.enabled
    bar.postfix("T=1 1/4")
    bar.write("[tune 1/3] line", out)
    for _ in range(3):
        bar.step("T=1")
    assert err.getvalue() == "" and out.getvalue() == "[tune 1/3] line\n"


def test_on_a_terminal_shows_label_count_and_postfix():
    pytest.importorskip("tqdm")
    err = _Terminal()
    bar = Progress(2, "tune glm5-tp8", err, unit="bucket")
    assert bar.enabled
    bar.postfix("T=1 1/4")  # shown at once (tqdm throttles only the count's updates)
    assert "tune glm5-tp8" in err.getvalue() and "T=1 1/4" in err.getvalue()
    bar.step("T=1 best decode 9.0 us")
    bar.step("T=2 best decode 8.0 us")
    text = err.getvalue()
    assert bar._bar is None  # closed after the last step, which prints the final state
    assert "2/2" in text and "T=2 best decode 8.0 us" in text


def test_tune_run_shows_a_bar_per_shape_on_a_terminal(tmp_path, monkeypatch, seed):
    """A tiny interpreter run (the flow of tests/test_tune.py): the bar names the shape and the
    best time; the per-bucket lines on the output stream still come out whole."""
    pytest.importorskip("tqdm")
    from sglang_fp4ext.moe import tables as C

    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path))
    C.clear_table_cache()
    err, out = _Terminal(), io.StringIO()

    def wall_timer(step, n):
        for i in range(n):
            step(i)
        return 1.0  # the bar's text, not the time, is under test

    try:
        log = TU.tune(
            [model_shapes.ModelShape("tiny", 8, 2, 256, 128, 1)], [1, 2], budget_s=0.01, quick=True,
            copies=1, seed=seed, device="cpu", timer=wall_timer,
            target=Target("sm_90", "Test GPU", 132),
            ranges={"decode": (1, 2), "prefill": (4, 1 << 30)}, stream=out, bar_stream=err,
        )  # fmt: skip
    finally:
        C.clear_table_cache()
    assert log["ok"], out.getvalue()
    bar = err.getvalue()
    assert "tune tiny" in bar and "2/2" in bar and "best decode 1.0 us" in bar
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[tune 1/2] tiny T=1: decode 1.0 us -> decode")
    assert lines[1].startswith("[tune 2/2] tiny T=2")
