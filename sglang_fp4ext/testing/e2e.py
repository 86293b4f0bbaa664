"""End-to-end check: a real SGLang server with ``--moe-runner-backend fp4ext`` against an oracle.

Used by ``fp4ext check`` and the end-to-end tests. Three pieces:

* ``dequantized_copy(ckpt, out)``: the same model with every NVFP4 tensor dequantised
  (``e2m1 * block_scale * weight_scale_2``, ModelOpt's rule) into float32, written as a plain
  Hugging Face checkpoint; this is what ``transformers`` runs as the oracle.
* ``SGLangServer``: ``python -m sglang.launch_server`` in a subprocess on 127.0.0.1, on a block
  of ports no other harness server holds, waited for on ``/health`` and failing fast (seconds,
  not the start timeout) when it cannot come up: launcher exited, fatal log line, port taken;
  a bind failure is retried on fresh ports. Greedy ``/generate`` on token ids; stopped with its
  process group. ``serving(a, b)`` starts several at once and watches them together.
* ``hf_greedy``: ``transformers`` greedy decoding on token ids (no tokenizer needed).
* ``expected_moe_layers`` / ``served_moe_layers``: which layers of a model are MoE layers (SGLang's
  rule) and which ones the server log says fp4ext served.
* ``install_cpu_workarounds``: an SGLang plugin, active only in servers started with
  ``cpu_server_args()``, that works around an SGLang 0.5.23 CPU bug in DeepSeek-family (MLA)
  prefill attention (see its docstring).

The servers and requests stay on 127.0.0.1 and are bounded in count and time.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_fp4ext.nvfp4.format import dequantize_nvfp4

__all__ = [
    "dequantized_copy",
    "SGLangServer",
    "ServerStartError",
    "serving",
    "start_all",
    "reserve_ports",
    "classify_log_line",
    "hf_greedy",
    "hf_choice_gaps",
    "prompts_for",
    "expected_moe_layers",
    "served_moe_layers",
    "cpu_server_args",
    "install_cpu_workarounds",
]


def dequantized_copy(ckpt_dir, out_dir) -> Path:
    """Write ``ckpt_dir`` with NVFP4 tensors dequantised to float32 (no quantization config)."""
    from safetensors.torch import save_file

    from sglang_fp4ext.testing.checkpoint import read_checkpoint

    src, out = Path(ckpt_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = read_checkpoint(src)
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in t.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and tensor.dtype == torch.uint8:
            plain[name] = dequantize_nvfp4(
                tensor, t[f"{base}.weight_scale"], t[f"{base}.weight_scale_2"].float()
            )
        else:
            plain[name] = tensor.float() if tensor.is_floating_point() else tensor
    save_file(plain, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for extra in ("generation_config.json",):
        if (src / extra).exists():
            shutil.copy(src / extra, out / extra)
    return out


def prompts_for(vocab_size: int, n: int = 4, length: int = 8, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Skip the first ids: tiny configs use 0/1 as bos/eos.
    return [torch.randint(2, vocab_size, (length,), generator=g).tolist() for _ in range(n)]


def hf_greedy(model_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt with ``transformers`` in float32 on the CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


# ---- SGLang servers: ports, start-up watch, stop ----
#
# One server owns a *block* of PORT_BLOCK ports, base = its HTTP --port. SGLang 0.5.23 derives
# further ports from --port (``server_args.py`` ``PortArgs.init_new``): with DP attention on one
# node the zmq/dist-init ports port+233 .. port+239 (``ZMQ_TCP_PORT_DELTA = 233``: dist-init port,
# then port_base, detokenizer, rpc, metrics, scheduler input, load collector), and the torch
# TCPStore's ``nccl_port``, which without ``--nccl-port`` is a random free port in 22000-29999
# that nobody holds until the scheduler binds it. So the harness passes ``--nccl-port base+1``,
# keeps every block inside PORT_RANGE (below SGLang's own nccl pick and below the kernel's
# ephemeral range, where bind(0) and outgoing connections take ports), checks the ports SGLang
# will bind before it starts, and holds an flock on ``$TMPDIR/fp4ext-ports/<base>.lock`` while
# the server lives, so two harness servers (threads, processes, pytest-xdist) never share a
# block. A port taken by someone else between the check and SGLang's bind still fails; that
# failure is detected (log line or a foreign listener on the port) and the start retried on a
# fresh block (``max_attempts``).

#: Ports per server; the HTTP port is the block's first.
PORT_BLOCK = 256
#: Where blocks start: 45 blocks of 256 below 22000 (SGLang's own nccl range is 22000-29999).
PORT_RANGE = (10240, 21760)
#: Offsets in a block SGLang binds: HTTP, --nccl-port, DP-attention ports (port+233 .. +239).
PORT_OFFSETS = (0, 1, *range(233, 240))
#: Seconds from the HTTP front end's start (uvicorn's "Application startup complete.") until its
#: port must listen; the model-loading time before that is bounded by ``start_timeout`` only.
LISTEN_TIMEOUT = 60.0
#: Consecutive start-up polls (POLL_S apart) that must see the HTTP port held by a process
#: outside the server's session before the start is called a bind failure (one poll can fall
#: between the server's own bind() and listen()).
FOREIGN_POLLS = 3
POLL_S = 0.5


class PortInUse(OSError):
    """A port the harness needs is held by another socket."""

    def __init__(self, port: int, what: str = "port"):
        self.port = port
        super().__init__(98, f"{what} {port} on 127.0.0.1 is already in use")


class ServerStartError(RuntimeError):
    """An SGLang server that did not come up: names the server, its port, why, and the log."""

    def __init__(self, name: str, port: int | None, reason: str, log_path, log_tail: str,
                 *, kind: str = "fatal", attempts: list[str] | None = None):
        self.name, self.port, self.reason, self.kind = name, port, reason, kind
        self.log_path, self.attempts = Path(log_path), list(attempts or [])
        earlier = "".join(f"\n  earlier attempt: {a}" for a in self.attempts)
        super().__init__(
            f"{name} on 127.0.0.1:{port} did not come up: {reason}{earlier}\n"
            f"--- last lines of {log_path} ---\n{log_tail}"
        )


def _can_bind(port: int, host: str, *, reuse: bool) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _port_free(port: int) -> bool:
    """Strict check for a port a child binds later: IPv4 wildcard, no SO_REUSEADDR (a socket
    on 127.0.0.1, on 0.0.0.0, a dual-stack [::] one, or TIME_WAIT leftovers all count)."""
    return _can_bind(port, "0.0.0.0", reuse=False)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class PortBlock:
    """Ports reserved for one server: ``port`` (HTTP), ``nccl_port`` (None for an explicit port,
    where SGLang picks its own); ``release()`` drops the cross-process lock."""

    def __init__(self, port: int, nccl_port: int | None, lock_file=None):
        self.port, self.nccl_port, self._lock_file = port, nccl_port, lock_file

    def release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor drops its flock
            self._lock_file = None

    def __repr__(self) -> str:
        return f"PortBlock(port={self.port}, nccl_port={self.nccl_port})"


def _lock_block(base: int):
    """An open file holding an exclusive flock for block ``base``, or None when another process
    (or another server in this one) holds it. Without fcntl or a writable tempdir: no lock."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the free-port checks alone guard the block
        return False
    d = Path(tempfile.gettempdir()) / "fp4ext-ports"
    try:
        d.mkdir(exist_ok=True)
        f = open(d / f"{base}.lock", "a")
    except OSError:
        return False
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def reserve_ports(explicit: int | None = None, *, rng: random.Random | None = None) -> PortBlock:
    """Ports for one server on 127.0.0.1.

    ``explicit``: that HTTP port (checked, not locked; SGLang picks its own nccl port); raises
    ``PortInUse`` when it is taken. Otherwise a block of ``PORT_BLOCK`` ports in ``PORT_RANGE``,
    chosen in random order, whose lock this process got and whose ``PORT_OFFSETS`` ports are all
    free; raises ``PortInUse`` when no block qualifies.
    """
    if explicit is not None:
        if not _can_bind(explicit, "127.0.0.1", reuse=True):  # what uvicorn's bind needs
            raise PortInUse(explicit)
        return PortBlock(explicit, None)
    lo, hi = PORT_RANGE
    hi = min(hi, _ephemeral_low() - PORT_BLOCK)
    bases = list(range(lo, hi, PORT_BLOCK))
    (rng or random).shuffle(bases)
    for base in bases:
        lock = _lock_block(base)
        if lock is None:
            continue
        if all(_port_free(base + off) for off in PORT_OFFSETS):
            return PortBlock(base, base + 1, lock or None)
        if lock:
            lock.close()
    raise PortInUse(lo, f"no free block of {PORT_BLOCK} ports in {lo}-{hi}, e.g. port")


# ---- which processes hold a port (Linux /proc; elsewhere the log watch alone decides) ----


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes in LISTEN state on ``port`` (any address), or None without /proc."""
    found, seen = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(f[9])
    return found if seen else None


def _session_pids(sid: int, *, live: bool = False) -> list[int]:
    """Processes of session ``sid`` (the server runs in its own session: start_new_session);
    ``live``: without zombies (an orphan waits as one until init reaps it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 3 and int(fields[3]) == sid and not (live and fields[0] in "ZX"):
            pids.append(int(entry))
    return pids


def _session_socket_inodes(sid: int) -> set[str]:
    inodes = set()
    for pid in _session_pids(sid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def port_holder(port: int, sid: int) -> str:
    """Who holds 127.0.0.1:``port`` as seen by uvicorn's bind (SO_REUSEADDR): ``"free"``,
    ``"ours"`` (a listener of session ``sid``; also when /proc cannot tell) or ``"other"``.

    The probe binds with SO_REUSEADDR like uvicorn, so it neither blocks the server's own bind
    nor misses a socket that would make that bind fail.
    """
    if _can_bind(port, "127.0.0.1", reuse=True):
        return "free"
    listeners = _listening_inodes(port)
    if listeners is None:
        return "ours"
    return "ours" if listeners & _session_socket_inodes(sid) else "other"


# ---- reading a server's log during start-up ----

#: A port clash: uvicorn's "[Errno 98] error while attempting to bind on address (...)", zmq's
#: "Address already in use", the TCPStore's "EADDRINUSE", SGLang's own port checks
#: (``PortArgs.init_new``: "Port is already in use.", ``wait_port_available``: "... is not
#: available in 30 seconds").
_BIND_RE = re.compile(
    r"\[Errno 98\]|address already in use|\bEADDRINUSE\b|Port is already in use"
    r"|\bis not available in \d+ seconds",
    re.IGNORECASE,
)
#: Warnings never stop a start: c10d/glog lines ("[W1201 12:00:00 ...", "W1201 ..."), Python
#: warnings ("...: UserWarning: ..."), WARNING-level lines. E.g. torch logs
#: "[W... socket.cpp] The server socket has failed to bind to [::]:29500 (errno: 98 - Address
#: already in use)." when the IPv6 side is taken and then serves on IPv4.
_WARNING_RE = re.compile(
    r"^\s*(?:\[\d{4}-\d\d-\d\d [^\]]*\]\s*)?(?:\[?W\d{4} |\[W |WARNING\b)|\w*Warning: "
)
#: SGLang's own death notices: a subprocess's top-level handler ("Scheduler hit an exception:
#: ...", which then SIGQUITs the launcher) and the launcher's SIGQUIT handler.
_FATAL_RE = re.compile(
    r"\b(?:Scheduler|DetokenizerManager|TokenizerManager|DataParallelController"
    r"|MultiTokenizerRouter|MultiDetokenizerRouter) hit an exception"
    r"|Received sigquit from a child process"
)
_TRACEBACK = "Traceback (most recent call last):"
#: The first frame of an exception escaping the launcher's main module (``python -m
#: sglang.launch_server``): the launcher's main thread is dying. Tracebacks SGLang logs from
#: inside its code (``logger.exception``) start in the catching function, not here.
_LAUNCHER_FRAME_RE = re.compile(r'^\s*File ".*[/\\]sglang[/\\]launch_server\.py", line \d+')
_PORT_IN_LINE_RES = (
    re.compile(r"\('[^']*', (\d+)\)"),  # uvicorn: ('127.0.0.1', 41179)
    re.compile(r"\bport:? (\d+)", re.IGNORECASE),  # TCPStore: "port: 28111"
    re.compile(r"\bat (\d+) is not available"),  # SGLang wait_port_available
    re.compile(r"tcp://[^\s:']+:(\d+)"),  # zmq addr='tcp://127.0.0.1:5555'
)
#: Start-up milestones in SGLang 0.5.23's log (the last one seen names the stage in "waiting
#: for ..." lines; before the first: importing SGLang, ~17 s of a ~45 s CPU start); FRONT_END
#: is when LISTEN_TIMEOUT starts.
_FRONT_END = "Application startup complete."
_STAGES = (
    ("server_args=", "starting the scheduler"),
    ("Init parallel begin", "initialising the model runner"),
    ("Load weight begin", "loading weights"),
    ("Load weight end", "allocating KV cache"),
    ("Started server process", "HTTP front end starting"),
    (_FRONT_END, "HTTP front end binding"),
)


@dataclass(frozen=True)
class FatalLine:
    """A log line that means the server will not come up.

    ``kind``: ``"bind"`` (a port clash: worth a retry on fresh ports) or ``"fatal"``;
    ``port``: the port the line names, if any.
    """

    kind: str
    line: str
    port: int | None = None


def classify_log_line(line: str, previous: str = "") -> FatalLine | None:
    """Whether one server log line (``previous``: the line before it) is fatal at start-up."""
    text = line.strip()
    if not text or _WARNING_RE.search(line):
        return None
    if _BIND_RE.search(line):
        port = next((int(m.group(1)) for r in _PORT_IN_LINE_RES if (m := r.search(line))), None)
        return FatalLine("bind", text, port)
    if _FATAL_RE.search(line):
        return FatalLine("fatal", text)
    if previous.strip().endswith(_TRACEBACK) and _LAUNCHER_FRAME_RE.search(line):
        return FatalLine("fatal", f"{_TRACEBACK} {text} (the launcher's main thread)")
    return None


class _LogWatch:
    """Reads a growing log file line by line; keeps fatal lines and the start-up stage."""

    def __init__(self, path: Path):
        self.path, self._pos, self._rest, self._prev = path, 0, "", ""
        self.fatal: list[FatalLine] = []
        self.stage = "importing SGLang"
        self.front_end_at: float | None = None

    def scan(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return
        self._pos += len(data)
        *lines, self._rest = (self._rest + data.decode(errors="replace")).split("\n")
        for line in lines:
            hit = classify_log_line(line, self._prev)
            if hit is not None:
                self.fatal.append(hit)
            for marker, stage in _STAGES:
                if marker in line:
                    self.stage = stage
                    if marker == _FRONT_END and self.front_end_at is None:
                        self.front_end_at = time.monotonic()
            self._prev = line

    def verdict(self) -> FatalLine | None:
        """The fatal line to report: a port clash first (it is the cause a retry can fix)."""
        return next((f for f in self.fatal if f.kind == "bind"), None) or next(
            iter(self.fatal), None
        )


def _flag_value(args: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in argv-style ``args`` (``--flag v`` or ``--flag=v``)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the server's process group and session (children that left the group or
    outlived the launcher included), SIGKILL whatever is left after ``grace`` seconds."""
    sid = proc.pid  # start_new_session: the launcher leads its own session and group
    has_proc = os.path.isdir("/proc")

    def alive() -> bool:
        proc.poll()  # reap the launcher, or its zombie keeps the group "alive"
        if has_proc:  # orphans wait as zombies until init reaps them: those are gone already
            return bool(_session_pids(sid, live=True))
        try:
            os.killpg(sid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def send(sig) -> None:
        try:
            os.killpg(sid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in _session_pids(sid, live=True) if has_proc else ():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    if not alive():
        return
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive():
        send(signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class _StartFailure(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


#: ``progress(kind, text)``: kind "start", "wait", "retry" or "up"; see ``serving``.
Progress = Callable[[str, str], None]


class SGLangServer:
    """``python -m sglang.launch_server`` on 127.0.0.1 that comes up or fails fast.

    Use as a context manager (or several at once with ``serving``). While it starts, every
    ``POLL_S`` seconds the harness checks, in this order, and on a failure kills the server's
    whole process group and raises ``ServerStartError`` naming the port and quoting the log:

    * the launcher exited;
    * a fatal line in its log (``classify_log_line``: a bind error, SGLang's own death notices,
      a traceback escaping the launcher), caught within a poll of being written;
    * its HTTP port held by a process outside the server's session (uvicorn would fail to bind
      it), seen ``FOREIGN_POLLS`` times in a row;
    * an HTTP front end that started but does not listen within ``listen_timeout`` seconds;
    * not healthy (``/health`` 200) within ``start_timeout`` seconds (model loading included).

    A bind failure on ports the harness chose is retried on a fresh block, up to
    ``max_attempts`` starts (each retry logged; the failed attempt's log is kept as
    ``<log>.attempt<n>``). An explicit ``port`` (or ``--port`` in ``extra_args``) is used as
    given: checked before the start, never retried.
    """

    def __init__(self, model_path, extra_args: list[str], *, env: dict | None = None,
                 log_path=None, start_timeout: float = 600, listen_timeout: float = LISTEN_TIMEOUT,
                 name: str = "SGLang server", port: int | None = None, max_attempts: int = 3,
                 launcher: list[str] | None = None, progress: Progress | None = None):
        self.model_path, self.extra_args = str(model_path), list(extra_args)
        given = _flag_value(self.extra_args, "--port")
        self._port_in_args = given is not None
        self._explicit = port if port is not None else (int(given) if given else None)
        self.max_attempts = 1 if self._explicit is not None else max(1, max_attempts)
        # ``launcher`` replaces ``python -m sglang.launch_server`` (tests use a fake one).
        self.launcher = list(launcher or [sys.executable, "-m", "sglang.launch_server"])
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(suffix=".log")[1])
        self.start_timeout, self.listen_timeout = start_timeout, listen_timeout
        self.name, self.progress = name, progress
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.url: str | None = None
        self.args: list[str] = []
        self.attempt = 0
        self.failed_attempts: list[str] = []
        self.started_at = self.ready_at = self.stopped_at = None  # time.monotonic()
        self._block: PortBlock | None = None
        self._log = None
        self._watch = _LogWatch(self.log_path)
        self._listening, self._foreign = False, 0

    # ---- start-up ----

    def start(self) -> None:
        """Reserve ports and launch; returns at once (``poll`` then says when it is up)."""
        self.attempt += 1
        try:
            self._block = reserve_ports(self._explicit)
        except PortInUse as exc:
            raise ServerStartError(self.name, exc.port, str(exc), self.log_path, "(not started)",
                                   kind="bind", attempts=self.failed_attempts) from None
        self.port, self.url = self._block.port, f"http://127.0.0.1:{self._block.port}"
        self.args = [*self.launcher, "--model-path", self.model_path, "--host", "127.0.0.1"]
        if not self._port_in_args:
            self.args += ["--port", str(self.port)]
        if self._block.nccl_port and _flag_value(self.extra_args, "--nccl-port") is None:
            self.args += ["--nccl-port", str(self._block.nccl_port)]
        self.args += ["--skip-tokenizer-init", *self.extra_args]
        self._log = open(self.log_path, "w")
        self._watch = _LogWatch(self.log_path)
        self._foreign = 0
        self._listening = False
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True,
        )

    def poll(self) -> bool:
        """One start-up check: True once healthy, False while starting (a bind failure is
        retried here on fresh ports); raises ``ServerStartError`` when it cannot come up."""
        try:
            return self._check()
        except _StartFailure as f:
            self._stop(grace=5.0)
            if f.kind == "bind" and self.attempt < self.max_attempts:
                self.failed_attempts.append(f"127.0.0.1:{self.port}: {f.reason}")
                kept = self.log_path.with_name(
                    f"{self.log_path.stem}.attempt{self.attempt}{self.log_path.suffix}"
                )
                os.replace(self.log_path, kept)
                msg = (f"{self.name} on 127.0.0.1:{self.port} could not bind ({f.reason}); "
                       f"retrying on fresh ports (attempt {self.attempt + 1}/{self.max_attempts},"
                       f" failed log: {kept})")
                _logger.warning(msg)
                if self.progress:
                    self.progress("retry", msg)
                self.start()
                return False
            raise ServerStartError(self.name, self.port, f.reason, self.log_path, self.log_tail(),
                                   kind=f.kind, attempts=self.failed_attempts) from None

    def _check(self) -> bool:
        rc = self.proc.poll()
        self._watch.scan()
        if self._watch.fatal or rc is not None:
            if rc is None:  # let the rest of the traceback / error reach the log
                time.sleep(1.0)
            self._watch.scan()
            hit = self._watch.verdict()
            exited = "" if rc is None else f"the launcher exited with code {rc}; "
            if hit is None:
                raise _StartFailure("fatal", f"{exited}no fatal line recognised in its log")
            raise _StartFailure(hit.kind, f"{exited}log: {hit.line}")
        if not self._listening:
            holder = port_holder(self.port, self.proc.pid)
            self._listening = holder == "ours"
            self._foreign = self._foreign + 1 if holder == "other" else 0
            if self._foreign >= FOREIGN_POLLS:
                raise _StartFailure("bind", f"port {self.port} is held by a process outside the "
                                    "server (its HTTP front end cannot bind it)")
        if self._listening and self._healthy():
            self.ready_at = time.monotonic()
            return True
        now = time.monotonic()
        fe = self._watch.front_end_at
        if not self._listening and fe is not None and now - fe > self.listen_timeout:
            raise _StartFailure("fatal", f"its HTTP front end started but port {self.port} was "
                                f"not listening after {self.listen_timeout:.0f} s")
        if now - self.started_at > self.start_timeout:
            raise _StartFailure("timeout", f"not healthy after {self.start_timeout:.0f} s "
                                f"(stage: {self.stage})")
        return False

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    @property
    def stage(self) -> str:
        """What the start-up is waiting for, in words (for "waiting for ..." lines)."""
        if self.ready_at is not None:
            return "up"
        return "health" if self._listening else self._watch.stage

    def __enter__(self) -> "SGLangServer":
        start_all([self], progress=self.progress)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def terminate(self) -> None:
        """SIGTERM the server's process group without waiting (``stop`` waits)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, grace: float = 30.0) -> None:
        """Stop the whole process group (SIGTERM, SIGKILL after ``grace`` s); free its ports."""
        self._stop(grace)
        self.stopped_at = time.monotonic()

    def _stop(self, grace: float) -> None:
        if self.proc is not None:
            _kill_group(self.proc, grace)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._block is not None:
            self._block.release()
            self._block = None

    def summary(self) -> dict:
        """Port, attempts and start/ready/stop times (``time.monotonic()``) of this server."""
        return {
            "name": self.name, "port": self.port, "attempts": self.attempt,
            "failed_attempts": list(self.failed_attempts), "started_at": self.started_at,
            "ready_at": self.ready_at, "stopped_at": self.stopped_at,
        }

    def log(self, tail: int = 12000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        # Progress bars redraw with \r: keep their last state per line.
        out = [ln.rsplit("\r", 1)[-1] for ln in text.splitlines()[-lines:]]
        return "\n".join(out)[-8000:]

    def choice_gaps(self, prompt: list[int], output: list[int], timeout: float = 300) -> list[float]:
        """Teacher-forced: for each token of ``output``, the logprob gap to this server's best."""
        body = json.dumps({
            "input_ids": prompt + output,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            # SGLang gives no logprob for the first scored position: start one earlier and keep
            # the last len(output) entries.
            "logprob_start_len": len(prompt) - 1,
            "top_logprobs_num": 1,
        }).encode()
        req = urllib.request.Request(f"{self.url}/generate", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            meta = json.loads(r.read())["meta_info"]
        chosen = meta["input_token_logprobs"][-len(output):]  # [logprob, token_id, text]
        tops = meta["input_top_logprobs"][-len(output):]
        if len(chosen) != len(output) or [c[1] for c in chosen] != list(output):
            raise RuntimeError(f"SGLang scored {len(chosen)} tokens, expected {len(output)}")
        return [float(top[0][0]) - float(lp) for (lp, _, _), top in zip(chosen, tops)]

    def generate(self, input_ids: list[int], max_new_tokens: int, timeout: float = 300) -> list[int]:
        body = json.dumps({
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                "ignore_eos": True},
        }).encode()
        req = urllib.request.Request(f"{self.url}/generate", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())["output_ids"]


def start_all(servers: list[SGLangServer], *, progress: Progress | None = None,
              report_every: float = 15.0) -> None:
    """Start ``servers`` at once and wait until every one is healthy, polling them together (one
    that fails is caught while another still loads); on any failure stop them all and raise.

    ``progress(kind, text)``, if given, hears "start" (the ports), a "wait" line every
    ``report_every`` seconds ("waiting for fp4ext server on 127.0.0.1:P (health) ... 23 s"),
    "retry" lines and "up".
    """
    t0 = time.monotonic()
    for s in servers:
        s.progress = s.progress or progress
    try:
        for s in servers:
            s.start()
        if progress:
            progress("start", "starting " + " and ".join(
                f"{s.name} on 127.0.0.1:{s.port}" for s in servers))
        pending, next_report = list(servers), t0 + report_every
        while pending:
            pending = [s for s in pending if not s.poll()]
            if not pending:
                break
            now = time.monotonic()
            if progress and now >= next_report:
                what = ", ".join(f"{s.name} on 127.0.0.1:{s.port} ({s.stage})" for s in pending)
                progress("wait", f"waiting for {what} ... {now - t0:.0f} s")
                next_report += report_every
            time.sleep(POLL_S)
    except BaseException:
        for s in servers:
            s.terminate()
        for s in servers:
            s.stop(grace=5.0)
        raise
    if progress:
        names = " and ".join(s.name for s in servers)
        progress("up", f"{names} up after {time.monotonic() - t0:.1f} s")


@contextlib.contextmanager
def serving(*servers: SGLangServer, progress: Progress | None = None):
    """``with serving(a, b): ...``: ``start_all([a, b])``, then stop both however the block ends."""
    try:
        start_all(list(servers), progress=progress)
        yield servers
    finally:
        for s in servers:  # all shut down in parallel, then each is waited for
            s.terminate()
        for s in servers:
            s.stop()


def hf_choice_gaps(model_dir, prompts: list[list[int]], outputs: list[list[int]]):
    """Teacher-forced oracle: for each generated token, how far its logit is below the best one.

    Runs ``transformers`` in float32 on ``prompt + output`` in one pass and returns, per prompt,
    ``max(logits_i) - logits_i[output_i]`` for every generated position ``i`` (0 means the served
    token is the oracle's argmax), together with the oracle's own top-1/top-2 margin there. A
    served token that is not the argmax is acceptable only at a near-tie, where bf16 rounding on
    the served side may legitimately flip the choice.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    result = []
    with torch.no_grad():
        for p, out in zip(prompts, outputs):
            ids = torch.tensor([p + out])
            logits = model(ids).logits[0, len(p) - 1 : len(p) - 1 + len(out)].float()
            best = logits.max(dim=-1).values
            chosen = logits.gather(1, torch.tensor(out).unsqueeze(1)).squeeze(1)
            top2 = logits.topk(2, dim=-1).values
            result.append(
                {
                    "gaps": (best - chosen).tolist(),
                    "margins": (top2[:, 0] - top2[:, 1]).tolist(),
                    "logit_scale": float(logits.std()),
                }
            )
    return result


# ---- the checks behind `fp4ext check` ----

#: A served token may sit this far (in logits) below the oracle's best token: bf16 activations and
#: a different MoE summation order flip near-ties. Measured 2026-11-29 on two tiny GLM-4.5
#: checkpoints (4 prompts x 16 tokens each, logit std ~1.0) against transformers in float32:
#: SGLang serving the *dequantised* weights with its own bf16 MoE picked tokens up to 0.22 below
#: the best; fp4ext on the NVFP4 checkpoint up to 0.14. With the routed scaling applied twice
#: (SGLang's GLM-4.5 CPU path, see README) fp4ext missed by 1.9-2.6. Tiny DeepSeek-V3 (fused
#: NVFP4 shared expert, grouped routing; 2026-11-30): fp4ext 0.03 below SGLang's own MoE and 0.11
#: below transformers; with the fused shared expert dropped 2.35, with gate/up swapped 2.28,
#: without ``install_cpu_workarounds`` 3.5 (4.4 against transformers).
GAP_TOLERANCE = 0.5


# ---- which MoE layers fp4ext served ----

# The line sglang_backend.Fp4ExtRunnerCore logs once per layer (tests/test_sglang_layer.py parses
# a real one with this).
_SERVED_RE = re.compile(
    r"fp4ext served MoE layer (\d+): (triton|reference) path, (\d+) local experts"
)


def expected_moe_layers(config: dict) -> list[int]:
    """Layer ids SGLang builds as MoE layers for a DeepSeek-V2/V3 or GLM-4.5 style ``config``.

    SGLang 0.5.23's rule: ``layer_id >= first_k_dense_replace`` and, in the DeepSeek-V2 code
    that DeepSeek-V3 and GLM-5 run (``deepseek_v2.py`` ``_is_layer_sparse``),
    ``layer_id % moe_layer_freq == 0``; GLM-4.5 (``glm4_moe.py``) ignores ``moe_layer_freq``.
    MTP layers are not served without speculation.
    """
    if not config.get("n_routed_experts"):
        return []
    freq = 1 if config.get("model_type") == "glm4_moe" else config.get("moe_layer_freq", 1)
    first = config.get("first_k_dense_replace", 0)
    return [i for i in range(config["num_hidden_layers"]) if i >= first and i % freq == 0]


def served_moe_layers(log: str) -> dict[int, set[tuple[str, int]]]:
    """``{layer id: {(path, local experts), ...}}`` from fp4ext's per-layer lines in a server log
    (one line per layer and process; TP/EP ranks each log their own)."""
    served: dict[int, set[tuple[str, int]]] = {}
    for m in _SERVED_RE.finditer(log):
        served.setdefault(int(m.group(1)), set()).add((m.group(2), int(m.group(3))))
    return served


# ---- SGLang on the CPU ----

#: The entry-point name of ``install_cpu_workarounds`` in the servers ``cpu_server_args`` starts.
CPU_WORKAROUND_PLUGIN = "fp4ext_e2e_cpu"
CPU_WORKAROUND_LOG = (
    "fp4ext e2e CPU workaround: torch_native MLA prefill runs SGLang's absorbed-MLA path"
)
_MLA_HANDLER_MODULE = "sglang.srt.models.deepseek_common.attention_backend_handler"
_logger = logging.getLogger("sglang_fp4ext")


def _absorbed_mla(attn, forward_batch):
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        _dispatch_mla_subtype,
    )

    return _dispatch_mla_subtype(attn, forward_batch)


def _register_mla_handler(module) -> None:
    module.AttentionBackendRegistry.register("torch_native", _absorbed_mla)
    _logger.warning(CPU_WORKAROUND_LOG)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_register_mla_handler`` right after the handler module is first imported, so the
    processes that never build a DeepSeek model do not pay its ~7 s import."""

    def find_spec(self, name, path=None, target=None):
        if name != _MLA_HANDLER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:  # moved in a later SGLang: nothing to fix here
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_mla_handler(module)

        spec.loader.exec_module = exec_then_register
        return spec


def install_cpu_workarounds() -> None:
    """SGLang plugin for the CPU test servers: fixes DeepSeek-family prefill attention.

    SGLang 0.5.23 bug (CPU, ``--attention-backend torch_native``): DeepSeek's MLA attention
    has no torch_native handler, so ``AttentionBackendRegistry.get_handler`` falls back to the
    triton one (``models/deepseek_common/attention_backend_handler.py:54-55``), which sends every
    prefix-free prefill down the MHA path (same file, 247-251). That path calls
    ``attn_mha(q, k, v, save_kv_cache=False)`` with per-head K/V expanded from the latent
    (``attention_forward_methods/forward_mha.py:305``), but
    ``TorchNativeAttnBackend.forward_extend`` ignores the ``k``/``v`` it is given and attends
    over the KV pool, which for MLA holds the compressed latent
    (``layers/attention/torch_native_backend.py:313-316``). With DeepSeek's real dims (q 192
    wide, latent 576) the shapes would not even match; with a tiny model where ``kv_lora_rank ==
    qk_nope_head_dim == v_head_dim`` it silently attends over the latent. Decode takes the
    absorbed-MLA path and is right, so prefill and decode of the same tokens disagree. Measured
    on the tiny DeepSeek-V3 (2026-11-30): at the first prefill position, where attention is a
    copy of V, SGLang's log-probabilities differed from transformers' by up to 4.9 (max over the
    vocabulary); with this workaround its top-5 tokens there equal transformers' to 0.01.

    The workaround registers a torch_native handler that always takes the absorbed-MLA path
    (the one decode uses): only attention changes, identically in the fp4ext and oracle servers.
    """
    if _MLA_HANDLER_MODULE in sys.modules:
        _register_mla_handler(sys.modules[_MLA_HANDLER_MODULE])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


_PLUGIN_DIR: Path | None = None


def _cpu_workaround_plugin_dir() -> Path:
    """A directory holding a dist-info that declares ``install_cpu_workarounds`` as an SGLang
    plugin (SGLang finds plugins by entry point); put on ``PYTHONPATH`` of the CPU servers."""
    global _PLUGIN_DIR
    if _PLUGIN_DIR is None:
        d = Path(tempfile.mkdtemp(prefix="fp4ext-e2e-plugin-"))
        info = d / f"{CPU_WORKAROUND_PLUGIN}-0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {CPU_WORKAROUND_PLUGIN}\nVersion: 0\n"
        )
        (info / "entry_points.txt").write_text(
            f"[sglang.srt.plugins]\n{CPU_WORKAROUND_PLUGIN} = "
            f"{__name__}:{install_cpu_workarounds.__name__}\n"
        )
        _PLUGIN_DIR = d
    return _PLUGIN_DIR


def cpu_server_args() -> tuple[list[str], dict[str, str]]:
    """SGLang flags and environment for serving on a CPU-only machine (with the CPU workaround
    plugin, see ``install_cpu_workarounds``)."""
    env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(_cpu_workaround_plugin_dir()), os.environ.get("PYTHONPATH")) if p
        ),
    }
    if os.environ.get("SGLANG_PLUGINS"):  # a whitelist: keep ours on it
        env["SGLANG_PLUGINS"] = f"{os.environ['SGLANG_PLUGINS']},{CPU_WORKAROUND_PLUGIN}"
    return (
        ["--device", "cpu", "--attention-backend", "torch_native", "--mem-fraction-static", "0.1"],
        env,
    )


def serve_greedy(model_path, extra_args, env, prompts, max_new_tokens, log_path=None, *,
                 name="SGLang server", progress: Progress | None = None):
    """Start SGLang, greedy-generate every prompt, stop it; returns (outputs, full server log)."""
    server = SGLangServer(model_path, extra_args, env=env, log_path=log_path, name=name)
    with serving(server, progress=progress):
        if progress:
            progress("phase", f"generating {len(prompts)} prompts x {max_new_tokens} tokens "
                     f"on the {name}")
        outs = [server.generate(p, max_new_tokens) for p in prompts]
        log = server.log(tail=10**8)
    return outs, log


def check_checkpoint_against_oracle(
    ckpt_dir, *, n_prompts: int = 4, max_new_tokens: int = 16, extra_args=(), env=None,
    work_dir=None, seed: int = 0, hf_oracle: bool = False, fp4ext_args=(),
    progress: Progress | None = None,
) -> dict:
    """Serve an NVFP4 checkpoint with fp4ext; judge every served token with an oracle.

    The oracle is the same SGLang server code on the *dequantised* checkpoint with SGLang's own
    bf16 MoE (same attention, so only the expert path differs): each fp4ext token is scored
    teacher-forced there, and its logprob must be within ``GAP_TOLERANCE`` of the oracle's best.
    ``extra_args`` go to both servers, ``fp4ext_args`` to the fp4ext one only (e.g.
    ``--enforce-shared-experts-fusion``, which the bf16 oracle does not need).
    ``hf_oracle=True`` also scores the tokens with ``transformers`` in float32 (an independent
    model implementation: it checks the SGLang oracle itself). ``fp4ext_layers_logged`` is true
    when the server log shows fp4ext serving exactly the model's MoE layers.
    ``progress(kind, text)`` hears each phase ("phase") and the servers' start-up ("start",
    "wait", "retry", "up"). The two servers run one after the other. Measured together on the
    2-core CPU machine (2026-12-01): both up in 76.5 s against 42.6 + 40.1 s one after the
    other, but 16 tokens took 17.4 s next to the idle oracle against 2.9 s alone, and the
    glm45 e2e fixture 221 s against 89 s.
    """
    ckpt_dir = Path(ckpt_dir)
    work = Path(work_dir or tempfile.mkdtemp(prefix="fp4ext-check-"))
    work.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda kind, text: None)
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    prompts = prompts_for(cfg["vocab_size"], n_prompts, seed=seed)
    say("phase", "dequantising the checkpoint for the oracle (SGLang's own bf16 MoE)")
    deq = dequantized_copy(ckpt_dir, work / "dequantized")
    fp4ext = SGLangServer(
        ckpt_dir,
        [*extra_args, *fp4ext_args, "--quantization", "modelopt_fp4", "--moe-runner-backend",
         "fp4ext"],
        env=env, log_path=work / "server.log", name="fp4ext server",
    )
    oracle = SGLangServer(deq, [*extra_args, "--dtype", "bfloat16"], env=env,
                          log_path=work / "oracle-server.log", name="oracle server")

    def generate():
        say("phase", f"generating {len(prompts)} prompts x {max_new_tokens} tokens on the "
            "fp4ext server")
        return [fp4ext.generate(p, max_new_tokens) for p in prompts], fp4ext.log(tail=10**8)

    def score(outs):
        say("phase", "scoring every served token on the oracle server")
        return ([oracle.generate(p, max_new_tokens) for p in prompts],
                [oracle.choice_gaps(p, o) for p, o in zip(prompts, outs)])

    with serving(fp4ext, progress=progress):
        outs, log = generate()
    with serving(oracle, progress=progress):
        oracle_outs, gaps = score(outs)
    max_gap = max(max(g) for g in gaps)
    expected, served = expected_moe_layers(cfg), served_moe_layers(log)
    all_served = bool(expected) and sorted(served) == expected
    result = {
        "prompts": prompts,
        "served": outs,
        "oracle": oracle_outs,
        "exact_prompts": sum(a == b for a, b in zip(outs, oracle_outs)),
        "gaps": gaps,
        "max_gap": max_gap,
        "moe_layers_expected": expected,
        "moe_layers_served": {k: sorted(v) for k, v in sorted(served.items())},
        "fp4ext_layers_logged": all_served,
        "cpu_workaround_logged": CPU_WORKAROUND_LOG in log,
        "ok": max_gap <= GAP_TOLERANCE and all_served,
        "server_log": str(work / "server.log"),
    }
    if hf_oracle:
        say("phase", "scoring every served token with transformers in float32")
        hf = hf_choice_gaps(deq, prompts, outs)
        result["hf_gaps"] = [j["gaps"] for j in hf]
        result["hf_max_gap"] = max(max(j["gaps"]) for j in hf)
    return result


def check_against_default_backend(
    model_path, launch_args, *, prompts: list[list[int]], max_new_tokens: int = 16,
    progress: Progress | None = None,
) -> dict:
    """Greedy tokens of fp4ext vs SGLang's default NVFP4 MoE backend on the same model/flags
    (one server after the other: a real model fills the GPUs)."""
    base = [a for a in launch_args]
    outs_default, _ = serve_greedy(model_path, base, None, prompts, max_new_tokens,
                                   name="default-backend server", progress=progress)
    outs_fp4ext, log = serve_greedy(
        model_path, [*base, "--moe-runner-backend", "fp4ext"], None, prompts, max_new_tokens,
        name="fp4ext server", progress=progress,
    )
    first_diff = []
    for a, b in zip(outs_default, outs_fp4ext):
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        first_diff.append(d)
    expected = expected_moe_layers(json.loads((Path(model_path) / "config.json").read_text()))
    served = served_moe_layers(log)
    return {
        "default": outs_default,
        "fp4ext": outs_fp4ext,
        "identical_prompts": sum(d is None for d in first_diff),
        "first_divergence": first_diff,
        "moe_layers_expected": expected,
        "moe_layers_served": {k: sorted(v) for k, v in sorted(served.items())},
        "fp4ext_layers_logged": bool(expected) and sorted(served) == expected,
    }
