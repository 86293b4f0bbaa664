"""Settings (``envs.py``): every ``SGLANG_FP4EXT_*`` variable is declared with its allowed values,
checked once when SGLang loads the plugin, and shown by ``fp4ext info`` (CPU tier)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fp4ext import envs

PKG_DIR = Path(__file__).resolve().parent.parent / "sglang_fp4ext"

#: One bad value per validated variable, and what its error line must name.
BAD = {
    "SGLANG_FP4EXT_SELFCHECK": ("bogus", "on, off or warn"),
    "SGLANG_FP4EXT_PREFILL_ACTIVATIONS": ("fp8", "auto or bf16"),
    "SGLANG_FP4EXT_LOG_LEVEL": ("verbose", "debug, info, warning, error or critical"),
    "SGLANG_FP4EXT_FAULT_INJECT": ("decode", "<path>:<family>"),
    "SGLANG_FP4EXT_DEBUG": ("maybe", "0 or 1"),
    "SGLANG_FP4EXT_SGLANG_VERSION": ("not-a-version", "a version such as 0.5.23"),
    "SGLANG_FP4EXT_TUNE_AT_START": ("soon", "on, off or a time budget in seconds"),
}


@pytest.fixture
def clean_env(monkeypatch):
    for var in envs.ALL:
        monkeypatch.delenv(var.name, raising=False)
    return monkeypatch


def test_every_variable_the_package_reads_is_declared():
    """A name spelled anywhere in the package is one ``envs.ALL`` declares."""
    spelled = set()
    for f in PKG_DIR.rglob("*.py"):
        spelled |= set(re.findall(r"SGLANG_FP4EXT_[A-Z_]*[A-Z]", f.read_text()))
    declared = {v.name for v in envs.ALL}
    assert spelled - declared == set(), "read but not declared in envs.py"
    assert set(BAD) <= declared


def test_unset_variables_are_their_defaults_and_valid(clean_env):
    assert envs.problems() == []
    assert envs.SELFCHECK.value() is None
    assert envs.PREFILL_ACTIVATIONS.value() == "auto"
    assert envs.DEBUG.value() == "0"


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_one_line_naming_variable_value_and_allowed(clean_env, name):
    value, allowed = BAD[name]
    clean_env.setenv(name, value)
    (line,) = envs.problems()
    assert "\n" not in line
    assert name in line and repr(value) in line and allowed in line
    var = next(v for v in envs.ALL if v.name == name)
    with pytest.raises(ValueError, match=re.escape(line)):
        var.value()


def test_values_are_normalised(clean_env):
    clean_env.setenv("SGLANG_FP4EXT_SELFCHECK", " TRUE ")
    clean_env.setenv("SGLANG_FP4EXT_PREFILL_ACTIVATIONS", "BF16")
    clean_env.setenv("SGLANG_FP4EXT_LOG_LEVEL", "Debug")
    assert envs.SELFCHECK.value() == "on"
    assert envs.PREFILL_ACTIVATIONS.value() == "bf16"
    assert envs.LOG_LEVEL.value() == "DEBUG"
    assert envs.problems() == []


def test_config_dir_that_is_a_file_is_refused(clean_env, tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("")
    clean_env.setenv("SGLANG_FP4EXT_CONFIG_DIR", str(f))
    (line,) = envs.problems()
    assert "SGLANG_FP4EXT_CONFIG_DIR" in line and "a directory" in line


def test_register_stops_on_a_bad_setting_before_anything_else(clean_env):
    """``register()`` raises SystemExit with the one line: SGLang's loader catches Exception
    only, so this is what still stops the server (the child below shows it)."""
    from sglang_fp4ext import plugin

    clean_env.setenv("SGLANG_FP4EXT_SELFCHECK", "bogus")
    with pytest.raises(SystemExit) as exc:
        plugin.register()
    assert str(exc.value.code).startswith("sglang_fp4ext: bad setting: SGLANG_FP4EXT_SELFCHECK")


@pytest.mark.sglang
def test_launch_server_stops_at_plugin_load_on_bad_settings(tmp_path):
    """SGLang's real launcher with two bad settings: it stops at plugin loading (before it even
    parses the server arguments, so before any weight could load), exit 1, and its stderr ends
    in one line naming both variables, their values and the allowed values."""
    from tests.sglang_cpu import tiny_model_dir

    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SGLANG_FP4EXT")}
    env.pop("SGLANG_PLUGINS", None)
    env.update(SGLANG_FP4EXT_SELFCHECK="bogus", SGLANG_FP4EXT_LOG_LEVEL="verbose")
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(tiny_model_dir(tmp_path)),
        ]
        + ["--device", "cpu", "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang_fp4ext: bad setting:"), proc.stderr[-4000:]
    for part in ("SGLANG_FP4EXT_SELFCHECK must be on, off or warn, got 'bogus'", "'verbose'"):
        assert part in last
    assert "Traceback" not in proc.stderr
