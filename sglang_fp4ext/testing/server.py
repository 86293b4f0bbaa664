"""``SGLangServer``: ``python -m sglang.launch_server`` on 127.0.0.1 that comes up or fails fast.

On a block of ports no other harness server holds (``server_ports``), waited for on ``/health``,
failing within seconds when it cannot come up (launcher exited, fatal log line: ``server_log``,
port taken; a bind failure is retried on fresh ports); stopped with its process group.
``serving(a, b)`` starts several at once. Servers and requests stay on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from sglang_fp4ext.testing.server_log import LogWatch
from sglang_fp4ext.testing.server_ports import (
    PortBlock,
    PortInUse,
    port_holder,
    reserve_ports,
    session_pids,
)

__all__ = ["SGLangServer", "ServerStartError", "flag_value", "serving", "start_all"]

#: Seconds from the HTTP front end's start (uvicorn's "Application startup complete.") until its
#: port must listen; the model-loading time before that is bounded by ``start_timeout`` only.
LISTEN_TIMEOUT = 60.0
#: Consecutive start-up polls (POLL_S apart) that must see the HTTP port held by a process
#: outside the server's session before the start is called a bind failure (one poll can fall
#: between the server's own bind() and listen()).
FOREIGN_POLLS = 3
POLL_S = 0.5
_logger = logging.getLogger("sglang_fp4ext")


class ServerStartError(RuntimeError):
    """An SGLang server that did not come up: names the server, its port, why, and the log."""

    def __init__(
        self,
        name: str,
        port: int | None,
        reason: str,
        log_path,
        log_tail: str,
        *,
        kind: str = "fatal",
        attempts: list[str] | None = None,
    ):
        self.name, self.port, self.reason, self.kind = name, port, reason, kind
        self.log_path, self.attempts = Path(log_path), list(attempts or [])
        earlier = "".join(f"\n  earlier attempt: {a}" for a in self.attempts)
        super().__init__(
            f"{name} on 127.0.0.1:{port} did not come up: {reason}{earlier}\n"
            f"--- last lines of {log_path} ---\n{log_tail}"
        )


def flag_value(args: list[str], flag: str) -> str | None:
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
            return bool(session_pids(sid, live=True))
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
        for pid in session_pids(sid, live=True) if has_proc else ():
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

    def __init__(
        self,
        model_path,
        extra_args: list[str],
        *,
        env: dict | None = None,
        log_path=None,
        start_timeout: float = 600,
        listen_timeout: float = LISTEN_TIMEOUT,
        name: str = "SGLang server",
        port: int | None = None,
        max_attempts: int = 3,
        launcher: list[str] | None = None,
        progress: Progress | None = None,
    ):
        self.model_path, self.extra_args = str(model_path), list(extra_args)
        given = flag_value(self.extra_args, "--port")
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
        self._failed_bases: set[int] = set()
        self.started_at = self.ready_at = self.stopped_at = None  # time.monotonic()
        self._block: PortBlock | None = None
        self._log = None
        self._watch = LogWatch(self.log_path)
        self._listening, self._foreign = False, 0

    # ---- start-up ----

    def start(self) -> None:
        """Reserve ports and launch; returns at once (``poll`` then says when it is up)."""
        self.attempt += 1
        try:
            self._block = reserve_ports(self._explicit, avoid=self._failed_bases)
        except PortInUse as exc:
            raise ServerStartError(
                self.name,
                exc.port,
                str(exc),
                self.log_path,
                "(not started)",
                kind="bind",
                attempts=self.failed_attempts,
            ) from None
        self.port, self.url = self._block.port, f"http://127.0.0.1:{self._block.port}"
        self.args = [*self.launcher, "--model-path", self.model_path, "--host", "127.0.0.1"]
        if not self._port_in_args:
            self.args += ["--port", str(self.port)]
        if self._block.nccl_port and flag_value(self.extra_args, "--nccl-port") is None:
            self.args += ["--nccl-port", str(self._block.nccl_port)]
        self.args += ["--skip-tokenizer-init", *self.extra_args]
        self._log = open(self.log_path, "w")
        self._watch = LogWatch(self.log_path)
        self._foreign = 0
        self._listening = False
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
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
                self._failed_bases.add(self.port)  # never retried on the block that failed
                kept = self.log_path.with_name(
                    f"{self.log_path.stem}.attempt{self.attempt}{self.log_path.suffix}"
                )
                os.replace(self.log_path, kept)
                msg = (
                    f"{self.name} on 127.0.0.1:{self.port} could not bind ({f.reason}); "
                    f"retrying on fresh ports (attempt {self.attempt + 1}/{self.max_attempts},"
                    f" failed log: {kept})"
                )
                _logger.warning(msg)
                if self.progress:
                    self.progress("retry", msg)
                self.start()
                return False
            raise ServerStartError(
                self.name,
                self.port,
                f.reason,
                self.log_path,
                self.log_tail(),
                kind=f.kind,
                attempts=self.failed_attempts,
            ) from None

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
                raise _StartFailure(
                    "bind",
                    f"port {self.port} is held by a process outside the "
                    "server (its HTTP front end cannot bind it)",
                )
        if self._listening and self._healthy():
            self.ready_at = time.monotonic()
            return True
        now = time.monotonic()
        fe = self._watch.front_end_at
        if not self._listening and fe is not None and now - fe > self.listen_timeout:
            raise _StartFailure(
                "fatal",
                f"its HTTP front end started but port {self.port} was "
                f"not listening after {self.listen_timeout:.0f} s",
            )
        if now - self.started_at > self.start_timeout:
            raise _StartFailure(
                "timeout", f"not healthy after {self.start_timeout:.0f} s (stage: {self.stage})"
            )
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

    def __enter__(self) -> SGLangServer:
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
        running = self.proc is not None and self.proc.poll() is None
        if self.proc is not None:
            _kill_group(self.proc, grace)
        if self._log is not None:
            self._log.close()
            self._log = None
        if running:  # said once, where a user reading the log would otherwise see a crash
            with open(self.log_path, "a") as log:
                log.write(
                    "[fp4ext harness] stopped this server (SIGTERM to its process group): "
                    "shutdown lines above such as 'Subprocess ... crashed with exit code -15' "
                    "are that stop, not a failure\n"
                )
        if self._block is not None:
            self._block.release()
            self._block = None

    def summary(self) -> dict:
        """Port, attempts and start/ready/stop times (``time.monotonic()``) of this server."""
        return {
            "name": self.name,
            "port": self.port,
            "attempts": self.attempt,
            "failed_attempts": list(self.failed_attempts),
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "stopped_at": self.stopped_at,
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

    def choice_gaps(
        self, prompt: list[int], output: list[int], timeout: float = 300
    ) -> list[float]:
        """Teacher-forced: for each token of ``output``, the logprob gap to this server's best."""
        body = json.dumps(
            {
                "input_ids": prompt + output,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True,
                # SGLang gives no logprob for the first scored position: start one earlier and keep
                # the last len(output) entries.
                "logprob_start_len": len(prompt) - 1,
                "top_logprobs_num": 1,
            }
        ).encode()
        req = urllib.request.Request(
            f"{self.url}/generate", data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            meta = json.loads(r.read())["meta_info"]
        chosen = meta["input_token_logprobs"][-len(output) :]  # [logprob, token_id, text]
        tops = meta["input_top_logprobs"][-len(output) :]
        if len(chosen) != len(output) or [c[1] for c in chosen] != list(output):
            raise RuntimeError(f"SGLang scored {len(chosen)} tokens, expected {len(output)}")
        return [float(top[0][0]) - float(lp) for (lp, _, _), top in zip(chosen, tops)]

    def generate(
        self, input_ids: list[int], max_new_tokens: int, timeout: float = 300
    ) -> list[int]:
        body = json.dumps(
            {
                "input_ids": input_ids,
                "sampling_params": {
                    "max_new_tokens": max_new_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        ).encode()
        req = urllib.request.Request(
            f"{self.url}/generate", data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())["output_ids"]


def start_all(
    servers: list[SGLangServer], *, progress: Progress | None = None, report_every: float = 15.0
) -> None:
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
            progress(
                "start",
                "starting " + " and ".join(f"{s.name} on 127.0.0.1:{s.port}" for s in servers),
            )
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
