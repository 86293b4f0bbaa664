"""A GPU with no tuned table: the one log line per untabled shape (``moe/untabled.py``), where each
bucket's config comes from (``tables.table_source``, ``fp4ext info``), and tuning at a server's
first start (``start_tune.py``, ``capture_tune.py``, ``SGLANG_FP4EXT_TUNE_AT_START``).

CPU tier: the log line (once per shape, with a command that tunes exactly that shape), the
table-source column, the setting's validation, the start table's keying and read order, and the
whole first start at a tiny shape with the kernels under the Triton interpreter (a wall-clock timer
stands in for graph replay; winners checked against the torch twin; written, re-read, reused; a
second start tunes nothing), two processes racing on one config directory (one tunes, the other
waits and reuses), and the captured buckets read through SGLang's own resolution.

Only the GPU tier covers: the graph-replay timings the tuner ranks candidates by, the call from a
real server's weight loading (``sglang_weights.process_weights`` on a CUDA device), the wall time
of a first start at GLM-5 size and its table against the shipped one
(:func:`test_first_start_on_the_gpu_matches_the_shipped_table`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import pytest
import triton

from sglang_fp4ext import __version__, envs, start_tune, tune_cli
from sglang_fp4ext.capture_policy import policy_for
from sglang_fp4ext.capture_sizes import captured_token_buckets
from sglang_fp4ext.cli import info
from sglang_fp4ext.model_shapes import PRESETS
from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe import untabled
from sglang_fp4ext.moe.decode.config import DotDecodeConfig
from sglang_fp4ext.moe.prefill.config import DotPrefillConfig
from sglang_fp4ext.moe.shape import DEFAULT_TARGET, MoEShape, Target
from sglang_fp4ext.moe.tables import TableEntry
from sglang_fp4ext.tune_record import write_table
from tests.sglang_cpu import run_child, run_children

H200 = Target("sm_90", "NVIDIA H200", 132)
PRO6000 = Target("sm_120", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 188)
TEST_GPU = Target("sm_90", "Test GPU", 132)
TP8 = MoEShape(256, 6144, 256, 8)
EP8 = MoEShape(32, 6144, 2048, 8, ep=8)
TINY = MoEShape(8, 256, 128, 2)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(envs.TUNE_AT_START.name, raising=False)
    C.clear_table_cache()
    start_tune.reset()
    untabled.clear_notes()
    yield tmp_path
    C.clear_table_cache()
    start_tune.reset()
    untabled.clear_notes()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# ---- the one line ----


def test_an_untabled_shape_logs_one_line_naming_its_tune_command(user_dir, caplog):
    caplog.set_level(logging.INFO, logger="sglang_fp4ext")
    for T in (1, 2, 1, 64, 3000, 8192):  # every bucket, some twice: still one line
        C.select(T, EP8, PRO6000)
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert lines[0] == (
        "fp4ext: no tuned config table for MoE shape E=32,H=6144,I=2048,top_k=8 on NVIDIA RTX PRO "
        "6000 Blackwell Server Edition: its token buckets run the heuristic kernel configs "
        "(untuned). Tune them on this GPU (once, minutes): fp4ext tune --preset glm5-ep8, or "
        "start the server with SGLANG_FP4EXT_TUNE_AT_START=on"
    )
    C.select(1, TP8, PRO6000)  # another shape: its own line
    assert len(_warnings(caplog)) == 2 and "--preset glm5-tp8" in _warnings(caplog)[1]
    C.select(1, TP8, H200)  # a shipped table: nothing
    C.select(1, MoEShape(9, 256, 128, 2), DEFAULT_TARGET)  # no GPU: nothing to tune
    with C.override_config(DotDecodeConfig()):
        C.select(1, MoEShape(10, 256, 128, 2), PRO6000)  # forced config: no table involved
    C.select(1, MoEShape(11, 256, 128, 2), PRO6000, quiet=True)  # fp4ext info reports it
    assert len(_warnings(caplog)) == 2


def test_a_bucket_missing_from_a_table_names_the_table(user_dir, caplog, monkeypatch):
    monkeypatch.setenv(envs.TUNE_AT_START.name, "on")
    dot = TableEntry("decode", DotDecodeConfig(split_k1=2))
    write_table(user_dir / "Test_GPU.json", "Test GPU",
                {TINY.key(): {1: dot, 4: dot}, EP8.key(): {1: dot}})  # fmt: skip
    caplog.set_level(logging.INFO, logger="sglang_fp4ext")
    for T in (1, 3, 2, 8):  # a gap below the largest bucket (2) runs the heuristic
        C.select(T, TINY, TEST_GPU)
    C.select(16, EP8, TEST_GPU)  # beyond the largest: that bucket's entry
    C.select(4096, EP8, TEST_GPU)  # ... unless a decode entry stands where prefill would run
    lines = _warnings(caplog)
    assert len(lines) == 2, lines
    assert lines[0] == (
        f"fp4ext: the config table {user_dir / 'Test_GPU.json'} has no entry for bucket 2 of MoE "
        "shape E=8,H=256,I=128,top_k=2: it runs the heuristic kernel config (untuned). Tune the "
        "shape on this GPU: fp4ext tune --E 8 --H 256 --I 128 --top-k 2"
    )
    assert lines[1].endswith("--preset glm5-ep8") and "bucket 4096 " in lines[1]


@pytest.mark.parametrize(
    "shape",
    [
        TP8,
        EP8,
        MoEShape(257, 6144, 256, 9),
        MoEShape(385, 7168, 256, 9),
        MoEShape(20, 4096, 512, 6, ep=4),
        TINY,
    ],  # fmt: skip
    ids=["glm5-tp8", "glm5-ep8", "glm5-fused", "fused-385", "ep4", "tiny"],
)
def test_the_tune_command_tunes_exactly_the_shape_it_names(shape):
    import argparse

    cmd = untabled.tune_command(shape)
    parser = argparse.ArgumentParser()
    tune_cli.add_tune_parser(parser.add_subparsers())
    args = parser.parse_args(cmd.split()[1:])
    ms = tune_cli.model_shape(args.preset, E=args.E, H=args.H, I=args.I, top_k=args.top_k,
                              ep=args.ep)  # fmt: skip
    assert MoEShape(ms.E_local, ms.hidden, ms.I_local, ms.top_k_local, ms.ep) == shape
    assert untabled.rank_model_shape(shape) == ms
    # A fused shared expert is tuned as SGLang routes it: every token picks the last expert.
    assert ms.fuse_shared == shape.fused_shared
    if shape.fused_shared:
        assert cmd.startswith("fp4ext tune --preset") or "--top-k 9" in cmd


# ---- the setting ----


@pytest.mark.parametrize(
    "raw, value, budget",
    [(None, "off", None), ("off", "off", None), ("0", "off", None), ("ON", "on", 300.0),
     ("true", "on", 300.0), ("900", "900", 900.0), ("10", "10", 10.0), ("1e3", "1000", 1000.0)],
)  # fmt: skip
def test_tune_at_start_values(monkeypatch, raw, value, budget):
    if raw is None:
        monkeypatch.delenv(envs.TUNE_AT_START.name, raising=False)
    else:
        monkeypatch.setenv(envs.TUNE_AT_START.name, raw)
    assert envs.TUNE_AT_START.value() == value and envs.tune_budget_s() == budget
    assert envs.problems() == []


@pytest.mark.parametrize("raw", ["5", "-3", "soon", "on,600"])
def test_a_bad_tune_at_start_stops_register_with_one_line(monkeypatch, raw):
    from sglang_fp4ext import plugin

    monkeypatch.setenv(envs.TUNE_AT_START.name, raw)
    want = (
        f"SGLANG_FP4EXT_TUNE_AT_START must be on, off or a time budget in seconds (at least 10), "
        f"e.g. 900, got {raw!r}"
    )
    assert envs.problems() == [want]
    with pytest.raises(SystemExit, match="bad setting: " + want.replace("(", r"\(")[:60]):
        plugin.register()
    assert dict(info.settings_rows())[envs.TUNE_AT_START.name].startswith("BAD: must be on, off")


# ---- where a bucket's config comes from ----


def test_start_table_is_keyed_by_gpu_triton_and_fp4ext_and_read_between_shipped_and_user(
    user_dir,
):
    path = C.start_table_path("NVIDIA H200")
    assert path == (
        user_dir / "tuned-at-start" / f"triton-{triton.__version__}_fp4ext-{__version__}"
        / "NVIDIA_H200.json"
    )  # fmt: skip
    tuned = TableEntry("decode", DotDecodeConfig(split_k1=2))
    mine = TableEntry("decode", DotDecodeConfig(split_k1=4))
    write_table(path, "NVIDIA H200", {TINY.key(): {1: tuned}, TP8.key(): {1: tuned}})
    assert C.select(1, TINY, H200) == tuned
    assert C.table_source(1, TINY, H200) == ("tuned here", path)
    # A shape tuned at start replaces the shipped one (start tuning never writes such a shape;
    # the order still holds), and the user's own fp4ext tune table replaces both.
    assert C.select(64, TP8, H200) == tuned and C.table_source(64, TP8, H200)[0] == "tuned here"
    write_table(C.user_table_path("NVIDIA H200"), "NVIDIA H200", {TINY.key(): {1: mine}})
    assert C.select(1, TINY, H200) == mine
    assert C.table_source(1, TINY, H200) == ("tuned here", C.user_table_path("NVIDIA H200"))
    # Another Triton or fp4ext version reads another directory: an upgrade tunes again.
    assert path.parent.name in str(C.start_table_path("Test GPU"))


def test_info_shows_the_table_of_every_captured_bucket(user_dir, capsys):
    buckets = policy_for("glm5-ep8", prefill_budget_mb=400).token_buckets()
    assert buckets == tuple(1 << i for i in range(14))
    rows = info.config_table_rows(EP8, buckets, H200)
    assert {r["table"] for r in rows} == {"shipped"}
    assert rows[0]["file"] == str(C.table_path("NVIDIA H200"))
    # Buckets 1, 2 and 8192 tuned here; the gap between them runs the heuristics.
    write_table(C.user_table_path("Test GPU"), "Test GPU",
                {EP8.key(): {1: TableEntry("decode", DotDecodeConfig()),
                             2: TableEntry("decode", DotDecodeConfig(split_k1=2)),
                             8192: TableEntry("prefill", DotPrefillConfig())}})  # fmt: skip
    rows = info.config_table_rows(EP8, buckets, TEST_GPU)
    assert [r["table"] for r in rows] == ["tuned here"] * 2 + ["heuristic"] * 11 + ["tuned here"]
    assert [r["path"] for r in rows[:3]] == ["decode"] * 3 and rows[-1]["path"] == "prefill"
    info._print_config_tables(EP8, TEST_GPU, rows)
    out = capsys.readouterr().out.splitlines()
    head = "[config tables: Test GPU, MoE shape E=32,H=6144,I=2048,top_k=8, captured buckets]"
    assert out[0] == head
    assert out[1].split() == ["T=1", "decode", "(dot)", "tuned", "here"]
    assert out[3].split()[-1] == "heuristic" and out[14].split()[1:] == [
        "prefill",
        "(dot)",
        "tuned",
        "here",
    ]
    assert out[-2] == f"  file: {user_dir / 'Test_GPU.json'}"
    hint = "  heuristic buckets: tune them on this GPU with `fp4ext tune --preset glm5-ep8`"
    assert out[-1].startswith(hint)


def test_captured_token_buckets_count_decode_rows_per_request():
    assert captured_token_buckets([1, 2, 3, 24], [4, 768], tokens_per_req=1) == (1, 2, 4, 32, 1024)
    assert captured_token_buckets([1, 3], [], tokens_per_req=4) == (4, 16)
    policy = policy_for("glm5-tp8", decode_max_bs=64, tokens_per_req=4, prefill_budget_mb=40)
    assert policy.token_buckets()[:3] == (4, 8, 16)


# ---- first start (the kernels under the interpreter) ----


def _wall_timer(step, n):
    t = time.perf_counter()
    for i in range(n):
        step(i)
    return (time.perf_counter() - t) * 1e6 / n


def test_first_start_tunes_checks_writes_and_the_next_start_reuses(user_dir, caplog):
    caplog.set_level(logging.INFO, logger="sglang_fp4ext")
    kw = dict(device="cpu", target=TEST_GPU, budget_s=1.0, timer=_wall_timer, copies=1)
    C.select(1, TINY, TEST_GPU)
    assert len(_warnings(caplog)) == 1  # the untuned shape says so once, before the start tunes
    got = start_tune.tune_before_capture(TINY, [1, 2], **kw)
    path = C.start_table_path("Test GPU")
    assert got["tuned"] == [1, 2] and got["ok"] and got["file"] == str(path)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert ("fp4ext: tuning MoE shape E=8,H=256,I=128,top_k=2 on Test GPU before CUDA-graph "
            f"capture: buckets 1,2, budget 1 s, into {path}") in text  # fmt: skip
    assert "fp4ext start tuning: [tune 1/2] E8-H256-I128-k2 T=1: decode" in text
    assert "check rms_rel" in text and f"later starts read {path}" in text
    doc = json.loads(path.read_text())
    assert doc["meta"]["tuned_at_start"][TINY.key()]["buckets"] == [1, 2]
    assert doc["meta"]["versions"]["triton"] == triton.__version__
    assert C.table_source(2, TINY, TEST_GPU) == ("tuned here", path)
    assert C.select(1, TINY, TEST_GPU) == C.load_entries("Test GPU")[TINY.key()][1]
    # In this process: once per shape, however many layers have it.
    assert start_tune.tune_before_capture(TINY, [1, 2, 4], **kw) is None
    # The next start: the same buckets are reused, a new one is tuned alone.
    start_tune.reset()
    C.clear_table_cache()
    caplog.clear()
    assert start_tune.tune_before_capture(TINY, [2, 1], **kw) == {"tuned": [], "file": str(path)}
    assert "reusing the table tuned at an earlier start" in caplog.text
    start_tune.reset()
    assert start_tune.tune_before_capture(TINY, [1, 4], **kw)["tuned"] == [4]
    assert json.loads(path.read_text())["meta"]["tuned_at_start"][TINY.key()]["buckets"] == [
        1,
        2,
        4,
    ]


def test_first_start_leaves_tabled_shapes_alone_and_is_off_by_default(user_dir):
    write_table(C.user_table_path("Test GPU"), "Test GPU",
                {TINY.key(): {1: TableEntry("decode", DotDecodeConfig())}})  # fmt: skip
    kw = dict(device="cpu", target=TEST_GPU, timer=_wall_timer, copies=1)
    assert start_tune.tune_before_capture(TINY, [1, 2], budget_s=1.0, **kw) is None
    assert start_tune.tune_before_capture(TP8, [1], budget_s=1.0, device="cpu", target=H200) is None
    assert start_tune.tune_before_capture(MoEShape(9, 256, 128, 2), [1], **kw) is None  # off
    assert not C.start_table_path("Test GPU").exists()


_RACER = """
import json, logging, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from sglang_fp4ext import start_tune
from sglang_fp4ext.moe.shape import MoEShape, Target

def timer(step, n):
    t = time.perf_counter()
    for i in range(n):
        step(i)
    return (time.perf_counter() - t) * 1e6 / n

got = start_tune.tune_before_capture(MoEShape(8, 256, 128, 2), [1], device="cpu",
    target=Target("sm_90", "Test GPU", 132), budget_s=1.0, timer=timer, copies=1)
print(json.dumps(got))
"""


def test_two_processes_racing_on_one_config_dir_tune_once(tmp_path):
    env = {C.CONFIG_DIR_ENV: str(tmp_path), "TRITON_INTERPRET": "1"}
    a, b = run_children([_RACER, _RACER], env=env, timeout=300)
    tuned = sorted([a, b], key=lambda r: len(r["tuned"]))
    assert [r["tuned"] for r in tuned] == [[], [1]], (a["_stderr"], b["_stderr"])
    reuser, tuner = tuned
    assert "reusing the table tuned at an earlier start" in reuser["_stderr"]
    assert "[tune 1/1]" in tuner["_stderr"] and "[tune" not in reuser["_stderr"]
    path = C.start_table_path("Test GPU").relative_to(C.user_config_dir())
    meta = json.loads((tmp_path / path).read_text())["meta"]
    assert meta["tuned_at_start"]["E=8,H=256,I=128,top_k=2"]["buckets"] == [1]


# ---- the buckets a server captures, through SGLang's own resolution ----

_CAPTURED = """
import json, logging
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt import runtime_context
from sglang.srt.runtime_context import SpawnRanks
from sglang.srt.server_args import ServerArgs
from sglang_fp4ext import capture_hooks, capture_tune
logging.getLogger("sglang_fp4ext").setLevel(logging.WARNING)
out = {}
for name, kw in [("TP8 max 24", dict(max_running_requests=24)), ("EP8", dict(ep_size=8))]:
    sa = ServerArgs(model_path=MODEL, device="cuda", skip_tokenizer_init=True, tp_size=8,
                    moe_runner_backend="fp4ext", **kw)
    sa.resolve_once()
    runtime_context.publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0))
    policy = capture_hooks.policy_from_server_args(sa)[0]
    g = runtime_context.get_exec().graph.cuda_graph_config
    out[name] = [list(capture_tune.served_buckets()), list(policy.token_buckets()),
                 str(g.decode.backend), str(g.prefill.backend)]
print(json.dumps(out))
"""


@pytest.mark.sglang
def test_the_buckets_tuned_at_start_are_the_ones_the_server_runs(tmp_path):
    model = tmp_path / "glm-like"
    model.mkdir()
    from tests.test_capture_policy import _TINY_GLM_LIKE

    (model / "config.json").write_text(json.dumps(_TINY_GLM_LIKE))
    out = run_child(f"MODEL = {str(model)!r}\n" + _CAPTURED)
    for name in ("TP8 max 24", "EP8"):
        served, policy, decode, prefill = out[name]
        assert served == policy == [1 << i for i in range(len(served))], name
        # Prefill graphs are off by default here: those buckets run eagerly, and count too.
        assert (decode, prefill) == ("full", "disabled") and served[-1] == 4096, name


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.slow
def test_first_start_on_the_gpu_matches_the_shipped_table(tmp_path, monkeypatch):
    """GLM-5 TP8 on this GPU with its shipped table hidden (the target is renamed, so no table
    has the shape): the first start's wall time, a second start tuning nothing, and each captured
    bucket's start-tuned config against the shipped one, timed in one process (graph replay,
    best of 3 interleaved rounds): within 5%, and the start within 10% of its budget.
    ``FP4EXT_START_BUDGET_S`` sets the budget (300 s, the ``on`` default);
    ``FP4EXT_RESULTS_DIR`` receives ``first_start_<GPU>.json``."""
    from sglang_fp4ext.bench.layer import Layer
    from sglang_fp4ext.bench.report import environment
    from sglang_fp4ext.graph_timing import time_graph_replay
    from sglang_fp4ext.moe import paths
    from sglang_fp4ext.moe.shape import current_target

    monkeypatch.setenv(C.CONFIG_DIR_ENV, str(tmp_path))
    C.clear_table_cache()
    start_tune.reset()
    real = current_target()
    hidden = dataclasses.replace(real, device_name=f"{real.device_name} (shipped table hidden)")
    preset = PRESETS["glm5-tp8"]
    shape = MoEShape(preset.E_local, preset.hidden, preset.I_local, preset.top_k_local)
    if C.shape_table(real.device_name, shape.key()) != C.table_path(real.device_name):
        pytest.skip(f"no shipped table for {shape.key()} on {real.device_name} to compare with")
    buckets = policy_for("glm5-tp8").token_buckets()
    budget = float(os.environ.get("FP4EXT_START_BUDGET_S", "300"))
    t0 = time.monotonic()
    first = start_tune.tune_before_capture(shape, buckets, target=hidden, budget_s=budget)
    wall = time.monotonic() - t0
    assert first["tuned"] == list(buckets) and first["ok"]
    start_tune.reset()
    C.clear_table_cache()
    assert (
        start_tune.tune_before_capture(shape, buckets, target=hidden, budget_s=budget)["tuned"]
        == []
    )
    layer = Layer(preset, 4)
    rows = []
    for b in buckets:
        entries = {"shipped": C.select(b, shape, real), "start": C.select(b, shape, hidden)}
        xs, routes, outs = layer.inputs(b)
        us = {k: [] for k in entries}
        for _ in range(3):
            for k, e in entries.items():
                run = paths.get(e.path).launcher()

                def step(i, run=run, cfg=e.config):
                    ids, tw, _ = routes[i]
                    return run(xs[i], layer.prepared[i % 4], ids, tw, out=outs[i], config=cfg)

                us[k].append(time_graph_replay(step, len(xs), replays=10).us_per_call)
        rows.append({"bucket": b, **{k: min(v) for k, v in us.items()},
                     "configs": {k: e.to_dict() for k, e in entries.items()}})  # fmt: skip
    record = {"gpu": real.device_name, "env": environment(), "shape": shape.key(),
              "budget_s": budget, "wall_s": round(wall, 1), "buckets": rows}  # fmt: skip
    out_dir = os.environ.get("FP4EXT_RESULTS_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        name = real.device_name.replace(" ", "_")
        (Path(out_dir) / f"first_start_{name}.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    slow = [r for r in rows if r["start"] > 1.05 * r["shipped"]]
    assert not slow, f"start-tuned slower than shipped by > 5%: {slow}"
    # Each bucket's heuristics run whatever is left, so a start may pass its budget by those.
    assert wall <= 1.1 * budget, f"the start took {wall:.0f} s of a {budget:.0f} s budget"
