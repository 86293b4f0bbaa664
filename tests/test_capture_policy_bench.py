"""CPU tier of ``benchmarks/run_capture_policy.py``: its pure parts and its SGLang data.

* The bucket mapping (real batch -> captured graph, padded rows), the predicted bytes saving and
  the saving arithmetic, against hand-worked values and properties.
* ``SGLANG_DEFAULT_DECODE_BS`` equals what SGLang's own ``ServerArgs`` resolution gives for a
  GLM-5-like model at TP8 on an H200 without fp4ext (fresh interpreter, plugins off), so the
  measured comparison cannot drift from SGLang's defaults.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import run_capture_policy as rcp
from sglang_fp4ext import capture_policy as cp
from tests.sglang_cpu import run_child
from tests.test_capture_policy import _TINY_GLM_LIKE


def test_next_bucket_and_errors():
    d = rcp.SGLANG_DEFAULT_DECODE_BS
    assert [rcp.next_bucket(d, t) for t in (1, 2, 3, 5, 9, 13, 17, 25, 33, 64, 65, 257)] == [
        1, 2, 4, 8, 12, 16, 24, 32, 40, 64, 72, 272,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no captured bucket holds T=513"):
        rcp.next_bucket(d, 513)
    with pytest.raises(ValueError, match="T=0"):
        rcp.next_bucket(d, 0)


def test_plan_maps_each_batch_to_both_graphs():
    policy = cp.policy_for("glm-5", 8, 1)
    rows = rcp.plan(range(1, 65), rcp.SGLANG_DEFAULT_DECODE_BS, policy.decode_bs)
    by_t = {r["T"]: r for r in rows}
    # Hand-worked: SGLang pads 5 -> 8 and 33 -> 40; the policy captures 1..32 exactly and pads
    # 33 -> 40 too (but masks the padding).
    assert (by_t[5]["default_bs"], by_t[5]["policy_bs"]) == (8, 5)
    assert (by_t[33]["default_bs"], by_t[33]["policy_bs"]) == (40, 40)
    assert by_t[33]["policy_padded_rows"] == 7 and by_t[5]["policy_padded_rows"] == 0
    for r in rows:
        T = r["T"]
        assert r["default_bs"] in rcp.SGLANG_DEFAULT_DECODE_BS and r["default_bs"] >= T
        assert r["policy_bs"] in policy.decode_bs and r["policy_bs"] >= T
        assert r["default_padded_rows"] == r["default_bs"] - T
        # Default buckets are a subset of the policy's here, so the policy never pads more.
        assert r["policy_bs"] <= r["default_bs"]
        assert (r["predicted_bytes_saving"] == 0) == (r["default_bs"] == T)
        assert 0 <= r["predicted_bytes_saving"] < 1
    # 52 of 64 sizes are padded by SGLang's default list (12 are buckets).
    assert sum(r["default_padded_rows"] > 0 for r in rows) == 52


def test_expected_experts_and_bytes_saving_arithmetic():
    # One row reads its 8 routed experts + the shared one; many rows approach all 257.
    assert rcp.expected_experts_read(1) == pytest.approx(9.0)
    assert rcp.expected_experts_read(2) == pytest.approx(1 + 8 + 8 * (1 - 8 / 256))
    assert rcp.expected_experts_read(4096) == pytest.approx(257.0)
    (r,) = rcp.plan([5], rcp.SGLANG_DEFAULT_DECODE_BS, range(1, 9))
    d = lambda n: 1 + 256 * (1 - (1 - 8 / 256) ** n)  # noqa: E731
    assert r["predicted_bytes_saving"] == pytest.approx(1 - d(5) / d(8))
    assert r["predicted_bytes_saving"] == pytest.approx(0.340, abs=1e-3)


def test_saving_arithmetic():
    s = rcp.saving(80.0, 60.0)
    assert s == {"saved_us": 20.0, "saved_fraction": 0.25}
    assert rcp.saving(50.0, 55.0)["saved_fraction"] == pytest.approx(-0.1)  # a loss shows
    with pytest.raises(ValueError, match="default time must be > 0"):
        rcp.saving(0.0, 1.0)


def test_table_lists_every_row():
    rows = rcp.plan([3, 4], rcp.SGLANG_DEFAULT_DECODE_BS, range(1, 9))
    for r, (du, pu) in zip(rows, [(40.0, 30.0), (35.0, 35.0)]):
        r.update(default_us=du, policy_us=pu, **rcp.saving(du, pu))
    lines = rcp.table(rows).splitlines()
    assert len(lines) == 3 and "25.0%" in lines[1] and "0.0%" in lines[2]


_RESOLVE_DEFAULTS = """
import json, sys, tempfile, pathlib
d = pathlib.Path(tempfile.mkdtemp())
(d / "config.json").write_text({CONFIG!r})
# The one hardware fact this machine lacks: an H200's memory as nvidia-smi reports it (MiB).
import sglang.srt.arg_groups.memory_hook as memory_hook
memory_hook.get_device_memory_capacity = lambda device=None: 143771.0
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolved_view
sa = prepare_server_args(["--model-path", str(d), "--device", "cuda", "--skip-tokenizer-init",
                          "--tp-size", "8"])
sa.resolve_once()
v = resolved_view(sa)
print(json.dumps({{"bs": v.cuda_graph_config.decode.bs,
                  "max_bs": v.cuda_graph_config.decode.max_bs,
                  "backend": str(v.moe_runner_backend)}}))
"""


@pytest.mark.sglang
def test_default_bucket_constant_is_what_sglang_resolves():
    code = _RESOLVE_DEFAULTS.format(CONFIG=json.dumps(_TINY_GLM_LIKE))
    r = run_child(code, env={"SGLANG_PLUGINS": "no_such_plugin"})  # fp4ext not loaded
    assert "fp4ext" not in r["backend"]
    assert r["max_bs"] == 512 == cp.policy_for("glm-5", 8, 1).decode_bs[-1]
    assert tuple(r["bs"]) == rcp.SGLANG_DEFAULT_DECODE_BS, (
        "SGLang's default decode buckets changed; set SGLANG_DEFAULT_DECODE_BS in "
        f"benchmarks/run_capture_policy.py to {tuple(r['bs'])}"
    )
