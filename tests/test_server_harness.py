"""The server harness fails fast and keeps servers apart (CPU tier).

``sglang_fp4ext.testing.server.SGLangServer`` must notice within seconds a server that cannot come
up (launcher exited, fatal log line, HTTP port taken, front end that never listens), kill its
whole process group, and raise an error naming the port with the log tail; a bind failure on
ports it chose is retried on fresh ones; two servers never share ports.

* Log classifier and port picking: plain unit tests, lines copied from real server logs.
* Start-up watch: a fake launcher (a small script standing in for ``python -m
  sglang.launch_server``) replays each failure, including the one seen in CI: the HTTP front end
  logs ``[Errno 98] ... address already in use`` and the launcher stays alive with a child.
* Real SGLang servers (marked ``sglang``) on a tiny bf16 model: one whose port is taken after
  the pick must fail in seconds; two started at once, the second on a taken port at first, both
  come up (~55 s on the 2-core CI machine: the one slow test here). The CPU servers fork their
  scheduler and detokenizer (``cpu_workarounds``), checked here too.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_fp4ext.target_info import has_cuda_gpu
from sglang_fp4ext.testing import cpu_workarounds, server_log, server_ports
from sglang_fp4ext.testing import server as harness

# ---- log classifier ----

# (line, previous line, expected kind or None, port named by the line)
REAL_LINES = [
    # The CI failure (uvicorn, SGLang 0.5.23 CPU server, 2026-12-01 log).
    (
        "[2026-12-01 12:23:49] ERROR:    [Errno 98] error while attempting to bind on address "
        "('127.0.0.1', 55789): address already in use",
        "",
        "bind",
        55789,
    ),
    (
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:10474')",
        "",
        "bind",
        10474,
    ),
    (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 10241, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use",
        "",
        "bind",
        10241,
    ),
    (
        "ValueError: nccl_port at 10241 is not available in 30 seconds. nccl_port is used by a "
        "process already.",
        "",
        "bind",
        10241,
    ),
    (
        "[2026-12-01 12:23:49] Port is already in use. dist_init_port=10473 port_base=10474",
        "",
        "bind",
        None,
    ),
    (
        "[2026-12-01 12:23:49 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "",
        "fatal",
        None,
    ),
    (
        "[2026-12-01 12:23:49] Received sigquit from a child process. It usually means the child "
        "failed.",
        "",
        "fatal",
        None,
    ),
    (
        '  File "/venv/lib/python3.11/site-packages/sglang/launch_server.py", line 80, in <module>',
        "Traceback (most recent call last):",
        "fatal",
        None,
    ),
    # Not fatal: warnings, recovered errors and tracebacks that do not escape the launcher.
    (
        "[W1201 12:00:00.000000000 socket.cpp:767] [c10d] The server socket has failed to bind to "
        "[::]:10241 (errno: 98 - Address already in use).",
        "",
        None,
        None,
    ),
    (
        "/venv/lib/python3.11/site-packages/x.py:12: UserWarning: address already in use",
        "",
        None,
        None,
    ),
    (
        "[2026-12-01 12:23:50] The port 10241 is in use, but we could not find the process that "
        "uses it.",
        "",
        None,
        None,
    ),
    (
        "[2026-12-01 12:22:10] Ignore import error when loading sglang.srt.models.mamba: cannot "
        "import name 'causal_conv1d_fn'",
        "",
        None,
        None,
    ),
    (
        "[2026-12-01 12:23:49] Failed to get yes/no token IDs dynamically: 'NoneType' object has "
        "no attribute 'encode'",
        "",
        None,
        None,
    ),
    (
        '  File "/venv/lib/python3.11/site-packages/sglang/srt/models/falcon.py", line 9, in f',
        "Traceback (most recent call last):",
        None,
        None,
    ),
    ("Traceback (most recent call last):", "", None, None),
    ("[2026-12-01 12:23:49] INFO:     Application startup complete.", "", None, None),
]


@pytest.mark.parametrize("line,previous,kind,port", REAL_LINES)
def test_classify_log_line(line, previous, kind, port):
    hit = server_log.classify_log_line(line, previous)
    assert (hit and hit.kind) == kind, (line, hit)
    if kind == "bind":
        assert hit.port == port


def test_log_watch_prefers_the_port_clash(tmp_path):
    """A scheduler that dies of a taken port logs a death notice first, the bind error later:
    the verdict is the bind error (a retry on fresh ports can fix that one)."""
    log = tmp_path / "s.log"
    log.write_text(
        "[t TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/managers/scheduler.py", line 1, in run\n'
        "ValueError: nccl_port at 10241 is not available in 30 seconds.\n"
        "[t] Load weight begin. avail mem=1 GB\n[t] INFO:     Appli"  # no newline yet
    )
    w = server_log.LogWatch(log)
    w.scan()
    assert w.verdict().kind == "bind" and w.verdict().port == 10241
    assert [f.kind for f in w.fatal] == ["fatal", "bind"]
    assert w.stage == "loading weights" and w.front_end_at is None
    with open(log, "a") as f:
        f.write("cation startup complete.\n")
    w.scan()  # the partial line completes on the next read
    assert w.stage == "HTTP front end binding" and w.front_end_at is not None


# ---- port picking ----


def test_blocks_are_disjoint_locked_and_hold_the_derived_ports():
    blocks = [server_ports.reserve_ports() for _ in range(4)]
    try:
        bases = [b.port for b in blocks]
        assert len(set(bases)) == 4
        lo, hi = server_ports.PORT_RANGE
        for b in blocks:
            assert lo <= b.port < hi and (b.port - lo) % server_ports.PORT_BLOCK == 0
            assert b.nccl_port == b.port + 1
        # Every port SGLang derives from --port (DP attention: port+233..+239) stays in the block.
        assert max(server_ports.PORT_OFFSETS) < server_ports.PORT_BLOCK
        gaps = sorted(abs(a - b) for a in bases for b in bases if a != b)
        assert gaps[0] >= server_ports.PORT_BLOCK
        # A held block is never handed out again, in this process or another.
        for _ in range(10):
            other = server_ports.reserve_ports()
            assert other.port not in bases
            other.release()
    finally:
        for b in blocks:
            b.release()


def _two_free_blocks() -> int:
    """Base of two adjacent blocks that are free on this machine now. The tests below narrow
    PORT_RANGE to two blocks; a fixed pair fails wherever one of them is held or busy (CI,
    2026-12-06: block 18176 was passed over; this process may hold a block itself, e.g.
    ``sglang_cpu``'s gloo ports, and an earlier test's server leaves ports in TIME_WAIT)."""
    lo, hi = server_ports._block_range()  # the checks reserve_ports makes, on two blocks
    bases = range(lo, hi - server_ports.PORT_BLOCK, server_ports.PORT_BLOCK)
    for base in random.Random(0).sample(list(bases), len(bases)):
        pair = (base, base + server_ports.PORT_BLOCK)
        locks = [server_ports._lock_block(b) for b in pair]
        try:
            if None not in locks and not any(server_ports._busy_port(b) for b in pair):
                return base
        finally:
            for lock in locks:
                if lock:
                    lock.close()
    pytest.fail(f"no two adjacent free blocks of {server_ports.PORT_BLOCK} ports in {lo}-{hi}")


def test_block_with_a_taken_derived_port_is_skipped(monkeypatch):
    lo = _two_free_blocks()
    monkeypatch.setattr(server_ports, "PORT_RANGE", (lo, lo + 2 * server_ports.PORT_BLOCK))
    with socket.socket() as s:
        s.bind(("127.0.0.1", lo + 233))  # the first block's DP-attention dist-init port
        for _ in range(5):
            b = server_ports.reserve_ports()
            assert b.port == lo + server_ports.PORT_BLOCK
            b.release()


def test_avoided_block_is_never_picked(monkeypatch):
    """A retry asks for fresh ports: the block that failed is free again once its server is gone
    and, without ``avoid``, one pick in 45 handed it back (CI, 2026-12-03: the retry bound the
    port that had just failed)."""
    lo = _two_free_blocks()
    monkeypatch.setattr(server_ports, "PORT_RANGE", (lo, lo + 2 * server_ports.PORT_BLOCK))
    for seed in range(20):
        b = server_ports.reserve_ports(rng=random.Random(seed), avoid={lo})
        assert b.port == lo + server_ports.PORT_BLOCK
        b.release()
    with pytest.raises(server_ports.PortInUse, match="no free block") as err:
        server_ports.reserve_ports(avoid={lo, lo + server_ports.PORT_BLOCK})
    assert f"{lo}: avoided" in str(err.value)  # the error says why each block was passed over


def test_no_free_block_names_the_busy_port(monkeypatch):
    lo = _two_free_blocks()
    monkeypatch.setattr(server_ports, "PORT_RANGE", (lo, lo + server_ports.PORT_BLOCK))
    with socket.socket() as s:
        s.bind(("127.0.0.1", lo + 1))  # the block's --nccl-port
        with pytest.raises(server_ports.PortInUse, match=f"{lo}: port {lo + 1} in use") as err:
            server_ports.reserve_ports()
    assert err.value.port == lo + 1


def test_explicit_port_taken_fails_at_once(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        server = harness.SGLangServer(
            tmp_path, ["--device", "cpu"], port=port, log_path=tmp_path / "s.log"
        )
        t0 = time.monotonic()
        with pytest.raises(harness.ServerStartError) as err:
            server.start()
        assert time.monotonic() - t0 < 1
    assert f"127.0.0.1:{port}" in str(err.value) and "already in use" in str(err.value)
    assert server.proc is None  # nothing was launched


def test_launch_args_carry_the_block(tmp_path):
    s = harness.SGLangServer("/m", ["--tp", "2"], launcher=["true"], log_path=tmp_path / "a.log")
    s.start()
    s.stop()
    a = s.args
    assert a[:3] == ["true", "--model-path", "/m"] and a[a.index("--host") + 1] == "127.0.0.1"
    assert a[a.index("--port") + 1] == str(s.port)
    assert a[a.index("--nccl-port") + 1] == str(s.port + 1)  # not SGLang's random pick
    assert a[-2:] == ["--tp", "2"] and s.max_attempts == 3
    # The caller's own flags win: its --nccl-port is kept, its --port is used and not retried.
    u = harness.SGLangServer(
        "/m", ["--nccl-port", "29999"], launcher=["true"], log_path=tmp_path / "b.log"
    )
    u.start()
    u.stop()
    assert u.args.count("--nccl-port") == 1
    v = harness.SGLangServer("/m", ["--port=12345"], log_path=tmp_path / "c.log")
    assert v.max_attempts == 1 and v._explicit == 12345
    assert harness.flag_value(["--port", "1", "--port=7"], "--port") == "7"


# ---- start-up watch, with a fake launcher ----

FAKE_LAUNCHER = textwrap.dedent('''
    """Stands in for ``python -m sglang.launch_server``; FAKE_MODE picks the failure."""
    import http.server, os, subprocess, sys, time

    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode, state = os.environ["FAKE_MODE"], os.environ["FAKE_STATE"]
    # A "scheduler": same session and group, outlives a launcher that dies.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(state + ".pids", "a") as f:
        f.write(f"{os.getpid()} {child.pid}\\n")
    print("[2026-12-01 12:23:46] Load weight begin. avail mem=19.27 GB", flush=True)
    if mode == "bind_once":
        mode = "serve" if os.path.exists(state + ".bound") else "bind"
        open(state + ".bound", "a").close()
    if mode == "serve":
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *a):
                pass

        print("[2026-12-01 12:23:49] INFO:     Application startup complete.", flush=True)
        http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    elif mode == "bind":  # the CI failure: front end dead, launcher and scheduler alive
        print("[2026-12-01 12:23:49] INFO:     Application startup complete.", flush=True)
        print("[2026-12-01 12:23:49] ERROR:    [Errno 98] error while attempting to bind on "
              f"address ('127.0.0.1', {port}): address already in use", flush=True)
        print("[2026-12-01 12:23:49] INFO:     Waiting for application shutdown.", flush=True)
    elif mode == "exit":
        print("[2026-12-01 12:23:47] something went wrong", flush=True)
        sys.exit(3)
    elif mode == "never_listen":
        print("[2026-12-01 12:23:49] INFO:     Application startup complete.", flush=True)
    elif mode == "launcher_traceback":
        print("Traceback (most recent call last):", flush=True)
        print('  File "/v/lib/python3.11/site-packages/sglang/launch_server.py", line 80, in '
              "<module>", flush=True)
        print("RuntimeError: boom", flush=True)
    time.sleep(300)  # "hang", and every mode that leaves the launcher alive
''')


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_launcher.py"
    script.write_text(FAKE_LAUNCHER)
    state = tmp_path / "state"

    def make(mode: str, **kwargs) -> harness.SGLangServer:
        return harness.SGLangServer(
            tmp_path / "model",
            [],
            launcher=[sys.executable, str(script)],
            env={"FAKE_MODE": mode, "FAKE_STATE": str(state)},
            log_path=tmp_path / "s.log",
            name="fake server",
            **kwargs,
        )

    make.pids = lambda: [
        int(p)
        for line in Path(f"{state}.pids").read_text().split("\n")
        if line
        for p in line.split()
    ]
    return make


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _fails(server: harness.SGLangServer) -> tuple[harness.ServerStartError, float]:
    t0 = time.monotonic()
    with pytest.raises(harness.ServerStartError) as err:
        with server:
            pass
    return err.value, time.monotonic() - t0


def _wait_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_bind_error_in_log_fails_in_seconds_and_kills_the_group(fake):
    server = fake("bind", max_attempts=1)
    err, elapsed = _fails(server)
    assert elapsed < 10, elapsed
    assert err.kind == "bind" and err.port == server.port
    msg = str(err)
    assert f"fake server on 127.0.0.1:{server.port} did not come up" in msg
    assert (
        f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {server.port})" in msg
    )
    assert "Waiting for application shutdown" in msg  # the log tail is quoted
    assert _wait_gone(fake.pids()) == []  # launcher and its "scheduler"


def test_bind_error_is_retried_on_fresh_ports(fake, tmp_path):
    heard = []
    server = fake("bind_once", max_attempts=2)
    t0 = time.monotonic()
    with harness.serving(server, progress=lambda kind, text: heard.append((kind, text))):
        assert server.attempt == 2 and len(server.failed_attempts) == 1
        first = int(server.failed_attempts[0].split(":")[1])
        assert abs(server.port - first) >= server_ports.PORT_BLOCK
        with urllib.request.urlopen(f"{server.url}/health") as r:
            assert r.status == 200
    assert time.monotonic() - t0 < 15
    assert "[Errno 98]" in (tmp_path / "s.attempt1.log").read_text()
    kinds = [k for k, _ in heard]
    assert kinds[0] == "start" and "retry" in kinds and kinds[-1] == "up", heard
    assert _wait_gone(fake.pids()) == []


def test_launcher_exit_fails_at_once(fake):
    err, elapsed = _fails(fake("exit"))
    assert elapsed < 10 and "the launcher exited with code 3" in str(err)
    assert "something went wrong" in str(err)
    assert _wait_gone(fake.pids()) == []  # the orphaned child too


def test_launcher_traceback_fails_fast(fake):
    err, elapsed = _fails(fake("launcher_traceback"))
    assert elapsed < 10 and err.kind == "fatal" and "RuntimeError: boom" in str(err)


def test_front_end_that_never_listens(fake):
    err, elapsed = _fails(fake("never_listen", listen_timeout=2))
    assert elapsed < 10 and f"port {err.port} was not listening after 2 s" in str(err)


def test_start_timeout_bounds_a_silent_server(fake):
    err, elapsed = _fails(fake("hang", start_timeout=2))
    assert elapsed < 10 and err.kind == "timeout" and "not healthy after 2 s" in str(err)


def test_port_taken_after_the_pick(fake):
    """The race of the CI failure: the port was free when picked, another process took it."""
    server = fake("hang", max_attempts=1)
    server.start()
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", server.port))
        thief.listen(1)
        t0 = time.monotonic()
        with pytest.raises(harness.ServerStartError) as err:
            while not server.poll():
                time.sleep(harness.POLL_S)
        elapsed = time.monotonic() - t0
    assert elapsed < 10 and err.value.kind == "bind"
    assert f"port {server.port} is held by a process outside the server" in str(err.value)
    assert _wait_gone(fake.pids()) == []


# ---- a real SGLang server ----


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    """A tiny bf16 GLM-4.5 checkpoint (no quantisation: the server below never loads it)."""
    from sglang_fp4ext.testing.checkpoint import build_tiny_model

    out = tmp_path_factory.mktemp("plain") / "model"
    build_tiny_model("glm4_moe", seed=0).save_pretrained(out)
    return out


def _real_args():
    args, env = cpu_workarounds.cpu_server_args()
    return [*args, "--dtype", "bfloat16"], env


@pytest.mark.sglang
def test_real_server_on_a_taken_port_fails_in_seconds(plain_model, tmp_path, monkeypatch):
    """``python -m sglang.launch_server`` handed a port someone else holds: the harness names
    the port within seconds (not after the 600 s start timeout) and kills the process tree."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        # The race: the pick found the port free; it was taken before SGLang could bind it.
        monkeypatch.setattr(
            harness, "reserve_ports", lambda explicit=None, **kw: server_ports.PortBlock(port, None)
        )
        args, env = _real_args()
        server = harness.SGLangServer(
            plain_model,
            args,
            env=env,
            log_path=tmp_path / "s.log",
            name="taken-port server",
            max_attempts=1,
        )
        err, elapsed = _fails(server)
    print(f"taken port {port}: failed in {elapsed:.1f} s")
    assert elapsed < 60, elapsed
    assert f"taken-port server on 127.0.0.1:{port} did not come up" in str(err)
    assert f"port {port} is held by a process outside the server" in str(err)
    assert not server_ports.session_pids(server.proc.pid, live=True)  # no scheduler left behind


@pytest.mark.sglang
@pytest.mark.slow
def test_two_real_servers_at_once_one_on_a_taken_port(plain_model, tmp_path, monkeypatch):
    """Two servers started at once on one machine both come up, on ports apart. The second one's
    first port is taken after the pick (the CI race): that attempt fails within seconds and the
    start is retried on fresh ports."""
    real_reserve, picks = server_ports.reserve_ports, []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]

        def reserve(explicit=None, **kw):
            picks.append(explicit)
            return (
                server_ports.PortBlock(port, None)
                if len(picks) == 2
                else real_reserve(explicit, **kw)
            )

        monkeypatch.setattr(harness, "reserve_ports", reserve)
        args, env = _real_args()
        a, b = (
            harness.SGLangServer(
                plain_model,
                args,
                env=env,
                log_path=tmp_path / f"{n}.log",
                name=f"server {n}",
                max_attempts=2,
            )
            for n in "ab"
        )
        heard, t0 = [], time.monotonic()
        with harness.serving(
            a, b, progress=lambda kind, text: heard.append((time.monotonic() - t0, kind, text))
        ):
            up = time.monotonic() - t0
            outs = [s.generate([3, 4, 5, 6], 1) for s in (a, b)]
    retry_at = next(t for t, kind, _ in heard if kind == "retry")
    print(
        f"two servers at once: up after {up:.1f} s; taken port {port} retried after "
        f"{retry_at:.1f} s; ports {a.port}, {b.port}"
    )
    assert a.attempt == 1 and b.attempt == 2, (a.summary(), b.summary())
    assert f"127.0.0.1:{port}: port {port} is held by a process outside" in b.failed_attempts[0]
    assert retry_at < 30, heard
    assert b.port != port and abs(a.port - b.port) >= server_ports.PORT_BLOCK
    assert max(a.started_at, b.started_at) < min(a.ready_at, b.ready_at)  # both up together
    assert all(len(o) == 1 for o in outs), outs
    for s in (a, b):
        assert not server_ports.session_pids(s.proc.pid, live=True)  # stopped, whole tree


def test_stop_explains_the_shutdown_lines_it_causes_once(fake):
    """SGLang logs its children's SIGTERM as "Subprocess ... crashed with exit code -15"; the
    log a check points users at ends in one line saying the harness stopped the server."""
    server = fake("serve")
    with server:
        pass
    lines = server.log_path.read_text().splitlines()
    assert lines[-1].startswith("[fp4ext harness] stopped this server") and "-15" in lines[-1]
    assert sum(ln.startswith("[fp4ext harness]") for ln in lines) == 1


@pytest.mark.parametrize("cpu_engine", ["1", ""])
def test_cpu_servers_fork_their_children_instead_of_spawning(cpu_engine):
    """The CPU workaround plugin turns SGLang's ``mp.set_start_method("spawn", force=True)`` into
    fork in a CPU server (``SGLANG_USE_CPU_ENGINE=1``, no GPU), so its scheduler and detokenizer
    inherit the launcher's imports; elsewhere spawn stays spawn. In a child: the patch is
    process-wide."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        from sglang_fp4ext.testing.cpu_workarounds import install_cpu_workarounds
        install_cpu_workarounds()
        install_cpu_workarounds()  # SGLang loads plugins again in places: one patch
        mp.set_start_method("spawn", force=True)
        print(mp.get_start_method())
        """
    )
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": cpu_engine}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    want = "fork" if cpu_engine and not has_cuda_gpu() else "spawn"
    assert out.stdout.split()[-1] == want, out.stdout
