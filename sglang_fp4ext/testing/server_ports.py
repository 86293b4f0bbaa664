"""Ports for the harness's SGLang servers: one block of ports per server, and who holds a port.

``reserve_ports()`` hands out a ``PortBlock``: ``PORT_BLOCK`` ports in ``PORT_RANGE`` whose lock
no other harness server holds and whose ports SGLang binds (``PORT_OFFSETS``) are free.
``port_holder(port, sid)`` says whether a port is free, listened on by the server's own session
or held by another process (Linux /proc). Used by ``server.SGLangServer``.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
from pathlib import Path

__all__ = ["reserve_ports"]


# ---- port blocks ----
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


class PortInUse(OSError):
    """A port the harness needs is held by another socket."""

    def __init__(self, port: int, what: str = "port"):
        self.port = port
        super().__init__(98, f"{what} {port} on 127.0.0.1 is already in use")


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


def _block_range() -> tuple[int, int]:
    """Where block bases may lie: PORT_RANGE, kept one block below the ephemeral range."""
    lo, hi = PORT_RANGE
    return lo, min(hi, _ephemeral_low() - PORT_BLOCK)


def _busy_port(base: int) -> int | None:
    """The first port of block ``base`` that SGLang binds (``PORT_OFFSETS``) and that is not
    free, or None."""
    return next((base + off for off in PORT_OFFSETS if not _port_free(base + off)), None)


def reserve_ports(
    explicit: int | None = None,
    *,
    rng: random.Random | None = None,
    avoid: frozenset[int] | set[int] = frozenset(),
) -> PortBlock:
    """Ports for one server on 127.0.0.1.

    ``explicit``: that HTTP port (checked, not locked; SGLang picks its own nccl port); raises
    ``PortInUse`` when it is taken. Otherwise a block of ``PORT_BLOCK`` ports in ``PORT_RANGE``,
    chosen in random order, not one of the bases in ``avoid`` (blocks a start already failed to
    bind: their ports can look free again between the failure and the retry), whose lock this
    process got and whose ``PORT_OFFSETS`` ports are all free; raises ``PortInUse`` when no block
    qualifies.
    """
    if explicit is not None:
        if not _can_bind(explicit, "127.0.0.1", reuse=True):  # what uvicorn's bind needs
            raise PortInUse(explicit)
        return PortBlock(explicit, None)
    lo, hi = _block_range()
    bases = [b for b in range(lo, hi, PORT_BLOCK) if b not in avoid]
    (rng or random).shuffle(bases)
    why = {b: "avoided" for b in avoid if lo <= b < hi}  # base -> why it was passed over
    first_busy = None
    for base in bases:
        lock = _lock_block(base)
        if lock is None:
            why[base] = "locked by another harness server"
            continue
        busy = _busy_port(base)
        if busy is None:
            return PortBlock(base, base + 1, lock or None)
        why[base] = f"port {busy} in use"
        first_busy = first_busy or busy
        if lock:
            lock.close()
    items = sorted(why.items())
    detail = "; ".join(f"{b}: {w}" for b, w in items[:6]) + (
        f"; {len(items) - 6} more" if len(items) > 6 else ""
    )
    raise PortInUse(
        first_busy or lo, f"no free block of {PORT_BLOCK} ports in {lo}-{hi} ({detail}), e.g. port"
    )


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


def session_pids(sid: int, *, live: bool = False) -> list[int]:
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
    for pid in session_pids(sid):
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
