"""One run per run folder at a time: an exclusive claim held for as long as the run's process lives.

Two runs started with the same ``run-name`` used to write into one folder (both exited 0; rounds.jsonl held
rounds 0, 0, 1, 1, 2, 2 and one log was lost), because the folder was claimed only when config.json was written,
after the server was built. The claim is now the first thing a run does: an exclusive ``flock`` on a lock file
in the folder, taken without waiting. The second run is refused with one line naming the folder and the pid
that holds it; nothing of the first run is touched.

Why ``flock`` and not a marker file: the kernel drops the lock when the process ends, however it ends (SIGKILL,
a crash, a lost machine), so a killed run never leaves a stale claim that blocks ``resume=true``. Two lock files,
because two processes hold a run: the launcher (``collapipe run`` and the sweeps, which write flwr.log and
status.json into the folder: :data:`LAUNCHER_LOCK`) and the ServerApp (which writes config.json, rounds.jsonl
and the checkpoint: :data:`SERVER_LOCK`), and the second is the first's child through Flower's processes. The
files stay in the folder (empty but for the holder's pid); removing them on exit would open a window in which
two later runs lock two different files of the same name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from collapipe_flwr.atomic_files import file_errors
from collapipe_flwr.errors import ConfigError

LAUNCHER_LOCK = ".launcher.lock"
SERVER_LOCK = ".server.lock"


class RunFolderBusy(ConfigError):
    """Another live run holds the folder."""


class FolderClaim:
    """The exclusive claim of this process on ``folder`` under lock file ``name`` (:func:`claim_folder`)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the folder up (the kernel does so too when the process ends)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_folder(folder: Path, name: str, who: str = "run") -> FolderClaim:
    """Claim ``folder`` (created if missing) for this process, or raise :class:`RunFolderBusy` at once."""
    folder = Path(folder)
    path = folder / name
    with file_errors(folder, "create the run folder"):
        folder.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunFolderBusy(
            f"run folder {folder} is in use by another {who}{holder}; wait for it to end or pick another run_name"
        ) from None
    except OSError as err:
        os.close(fd)
        with file_errors(path, "lock"):
            raise err from None
    with contextlib.suppress(OSError):  # the holder's pid, for the message another run gets
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return FolderClaim(path, fd)


def _open_lock(path: Path) -> int:
    """The lock file's descriptor (created if missing, mode 0o600, a symbolic link never followed); a lock file
    that is a link or not a regular file is a one-line ConfigError naming it, a disk error the usual one line."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        what = _not_a_lock_file(path)
        if what is None:
            with file_errors(path, "create the lock file"):
                raise err from None
        raise _unusable_lock(path, what) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device opens: it is no lock file either
        os.close(fd)
        raise _unusable_lock(path, "a special file")
    return fd


def _unusable_lock(path: Path, what: str | None) -> ConfigError:
    return ConfigError(
        f"the lock file {path} is {what}, not a regular file, and is not used; remove it (it holds nothing of the "
        "run) and start again"
    )


def _not_a_lock_file(path: Path) -> str | None:
    """What ``path`` is when it cannot be a lock file (a symbolic link, a directory, ...); None otherwise."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return None if stat.S_ISREG(mode) else "a special file"


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""
