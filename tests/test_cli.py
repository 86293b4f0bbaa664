"""The ``fp4ext`` command's shell (``cli/``): fast help, one-line errors for user mistakes, one
set of preset names, and the settings section of ``info`` (CPU tier; nothing is served)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_fp4ext.cli import main
from sglang_fp4ext.model_shapes import PRESETS

HEAVY = ("torch", "triton", "sglang", "numpy", "transformers")


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_import_nothing_heavy(flag):
    code = (
        "import sys\nfrom sglang_fp4ext.cli import main\n"
        f"try:\n    main([{flag!r}])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY []"
    if flag == "--help":
        for cmd in ("info", "check", "bench", "tune", "patches"):
            assert cmd in proc.stdout


@pytest.mark.parametrize("cmd", ["info", "check", "bench", "tune"])
def test_every_command_help_lists_the_same_presets(cmd, capsys):
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    missing = [p for p in PRESETS if p not in out]
    assert not missing, f"fp4ext {cmd} --help does not list {missing}"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["info", "--tp", "0"], "tp must be a positive int, got 0"),
        (["info", "--ep", "3"], "ep=3 must divide tp=8"),
        (["info", "--preset", "glm5-tp8", "--ep", "3"], "ep=3 must divide tp=8"),
        (["info", "--model", "nosuch"], "unknown model 'nosuch'"),
        (["info", "--model-path", "nosuch"], "unknown model 'nosuch'"),
        (["info", "--preset", "glm5-tp8-fused-shared", "--ep", "8"], "shared expert and ep=1"),
        (["check", "--model-path", "/nonexistent"], "/nonexistent is not a directory"),
        (["check", "--model-path", "zai-org/GLM-5"], "download it first"),
        (["check", "--model-path", "glm5-tp8"], "a preset names a shape, not a checkpoint"),
    ],
)
def test_user_mistakes_end_in_one_line_and_exit_2(argv, says, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # so a repo id is no relative path here
    monkeypatch.delenv("SGLANG_FP4EXT_DEBUG", raising=False)
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    (line,) = cap.err.splitlines()
    assert line.startswith(f"fp4ext {argv[0]}: ") and says in line


def test_a_checkpoint_without_config_json_is_one_line(tmp_path, capsys):
    assert main(["check", "--model-path", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "no config.json" in line


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_stack(how, monkeypatch):
    monkeypatch.delenv("SGLANG_FP4EXT_DEBUG", raising=False)
    argv = ["info", "--tp", "0"]
    if how == "flag":
        argv = ["--debug", *argv]
    else:
        monkeypatch.setenv("SGLANG_FP4EXT_DEBUG", "1")
    with pytest.raises(Exception, match="tp must be a positive int") as exc:
        main(argv)
    assert exc.value.__cause__ is not None  # the original error, with its frames


def test_patches_alone_lists(capsys):
    assert main(["patches"]) == 0
    alone = capsys.readouterr().out
    assert main(["patches", "list"]) == 0
    assert alone == capsys.readouterr().out and alone.strip()


def test_info_settings_section_shows_every_variable_and_flags_bad_ones(monkeypatch):
    from sglang_fp4ext import envs
    from sglang_fp4ext.cli import info

    for var in envs.ALL:
        monkeypatch.delenv(var.name, raising=False)
    monkeypatch.setenv("SGLANG_FP4EXT_PREFILL_ACTIVATIONS", "fp8")
    monkeypatch.setenv("SGLANG_FP4EXT_SELFCHECK", "warn")
    rows = dict(info.settings_rows())
    assert set(rows) == {v.name for v in envs.ALL}
    assert rows["SGLANG_FP4EXT_SELFCHECK"] == "warn"
    assert rows["SGLANG_FP4EXT_DEBUG"] == "0 (default)"
    assert rows["SGLANG_FP4EXT_PREFILL_ACTIVATIONS"].startswith("BAD: must be auto or bf16")


def test_check_quiet_keeps_known_third_party_noise_off_the_terminal(tmp_path):
    """Importing ModelOpt (its untested-transformers warning) and torch, and printing a colour
    escape, under ``check.quiet``: nothing reaches the terminal, the log keeps the prints, and
    a logger torch set up inside writes to the terminal again afterwards."""
    log = tmp_path / "quantize.log"
    code = (
        "from pathlib import Path\nimport warnings\nfrom sglang_fp4ext.cli.check import quiet\n"
        f"with quiet(Path({str(log)!r})):\n"
        "    import modelopt.torch, torch\n"
        "    warnings.warn('old api', FutureWarning)\n"
        "    print('\\x1b[32mquantized\\x1b[0m')\n"
        "print('done')\n"
        "import logging\nlogging.getLogger('torch.utils.cpp_extension').warning('after')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n", proc.stdout
    # Only the warning logged after it, through a handler torch made inside: still working.
    assert proc.stderr.strip().endswith("after") and len(proc.stderr.splitlines()) == 1
    assert "quantized" in log.read_text()
