"""Processes this project starts and tracks: is one alive, its log's last lines, how to stop one."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import DEVNULL, STDOUT, Popen

_PRCTL: Callable[..., int] | None
try:  # resolved before any fork: a child then only calls it
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (AttributeError, OSError):  # not Linux
    _PRCTL = None
PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """True when the process runs (a zombie left by our own Popen does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # the state field of /proc/<pid>/stat, after the command name in parentheses
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts connections at host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def pid_of(pid_file: Path, *markers: str) -> int | None:
    """The pid in `pid_file` if that process runs and is ours: its command line holds every one
    of `markers` (a pid reused by another program is not)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):  # no pid file, or not a pid
        return None
    if not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return pid
    return pid if all(m in cmdline for m in markers) else None


def process_start(pid: int) -> str | None:
    """When a process started (clock ticks since boot), None if it is gone; with its pid, it
    names the process even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def die_with_parent() -> None:
    """Run in a child before its program starts: SIGTERM it when the thread that started it ends,
    however its process died (SIGKILL included). Linux only; elsewhere nothing."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log file, or a note that it is missing."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} is missing)"


def _reap(pid: int, *, block: bool = False) -> int | None:
    """Our own child's exit code once it has ended (collected: no zombie stays), else None."""
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:  # not our child, or collected already
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def terminate(
    pid: int, *, group: bool, grace_s: float, on_kill: Callable[[], None] | None = None
) -> int | None:
    """SIGTERM the process (or its group), SIGKILL it if it still runs after `grace_s`; returns
    our own child's exit code (reaped here, so a Popen would only see 0), else None."""
    kill = os.killpg if group else os.kill
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if sig == signal.SIGKILL and on_kill:
            on_kill()
        try:
            kill(pid, sig)
        except ProcessLookupError:
            return _reap(pid)
        deadline = time.monotonic() + wait_s
        while pid_alive(pid) and time.monotonic() < deadline:
            if (code := _reap(pid)) is not None:
                return code
            time.sleep(0.1)
        if not pid_alive(pid):
            # a dying JVM's main thread is a zombie before its other threads are gone: wait for them
            return _reap(pid, block=True)
    return None


def start_service(
    cmd: list[str],
    *,
    what: str,
    log: Path,
    pid_file: Path,
    ready: Callable[[], bool],
    timeout_s: float,
    error: type[Exception],
) -> None:
    """Start a service that outlives this command (its own session, output to `log`, pid to
    `pid_file`) and return once `ready()`; else stop it and raise `error` naming `what`, with
    the last lines of its log."""
    with open(log, "ab") as out:
        proc = Popen(cmd, stdout=out, stderr=STDOUT, stdin=DEVNULL, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(
                f"{what} exited during start-up (code {proc.returncode}); "
                f"last lines of {log}:\n{tail(log)}"
            )
        if ready():
            return
        time.sleep(0.2)
    terminate(proc.pid, group=False, grace_s=5)
    raise error(f"{what} was not ready within {timeout_s:g}s; last lines of {log}:\n{tail(log)}")


def stop_service(name: str, pid: int | None, pid_file: Path) -> str:
    """Stop a service `start_service` started (SIGTERM, SIGKILL if it hangs) and forget its pid;
    returns what happened, for the command line."""
    if pid is None:
        return f"{name}: not running"
    terminate(pid, group=False, grace_s=15)
    pid_file.unlink(missing_ok=True)
    return f"{name}: stopped (pid {pid})"
