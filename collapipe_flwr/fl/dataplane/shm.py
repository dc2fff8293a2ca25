"""Same-host shortcut of the data plane: step frames through shared memory, only a pointer over gRPC.

When a CU reaches the decoder host on a loopback address (a simulation, or a CU on the server's own box), the
frames themselves need not cross the TCP stack: the CU writes its encoded step request into a shared-memory
segment it owns (:class:`ClientSegment`, one per stream, ``multiprocessing.shared_memory``: a file in
``/dev/shm`` readable by the same user only) and sends a small pointer frame ``{"kind": "shm", "name",
"size"}`` on its authenticated gRPC stream. The host reads the frame from the segment, serves it exactly as
an inline frame (the key in the frame is checked, the step is validated, the head runs), writes the reply
frame back into the same segment when it fits, and answers with a pointer frame of its own (else inline).

What stays the same: the stream is opened with the CU's per-round key (checked from its metadata before any
frame is read) and every frame read from a segment passes the same key, round, sequence and content checks as
an inline one; a pointer naming a segment that is not a collapipe data-plane segment is refused. Cleanup: the
CU unlinks its segment when the stream is dropped or the client closes; if the CU process dies, Python's
resource tracker (a separate process) unlinks it. When the tracker dies with it (its whole process group killed,
as ``kill -- -PGID`` or a container's stop does), the segment would stay in ``/dev/shm`` until reboot: a segment's
name carries its creator's pid (``cpdp-<pid>-<hex>``), and :func:`remove_stale`, which the decoder host runs when
it starts (``collapipe run`` too, once it stopped a run), unlinks those whose creator is gone
(``shm_leftovers.py``). The host only attaches (and detaches at the stream's end). A segment that cannot be
made (a small ``/dev/shm`` in a container) or read by the host turns the shortcut off for that client, which then
sends inline frames.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from collapipe_flwr import shm_leftovers
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.wire import Frame, decode_header, encode_frame

KIND = "shm"
PREFIX = shm_leftovers.SEGMENT_PREFIX  # every segment this data plane makes; a pointer to any other name is refused
SHM_DIR = shm_leftovers.SHM_DIR  # where Linux keeps POSIX shared-memory segments (segment N is the file SHM_DIR/N)
_MADE_HERE: set[str] = set()  # segments this process created (a host in the same process must not unregister them)


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` (or ``[v6]:port``) names this machine by a loopback address or ``localhost``."""
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shm_room_for(size: int, where: str = "/dev/shm") -> bool:
    """Whether ``where`` has room for a ``size``-byte segment with a margin (a segment larger than the free
    space is created sparse and faults with SIGBUS when written, so this is checked first)."""
    try:
        stat = os.statvfs(where)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize >= 2 * size


def segment_name(pid: int | None = None) -> str:
    """A fresh segment name, ``cpdp-<creator pid>-<16 hex>``: the pid lets :func:`remove_stale` find the segments
    of processes that are gone, the random part keeps names unguessable and distinct within a process."""
    return f"{PREFIX}{os.getpid() if pid is None else int(pid)}-{secrets.token_hex(8)}"


def remove_stale(where: Path = SHM_DIR) -> list[str]:
    """Unlink the data-plane segments whose creator process is no longer running; returns their names
    (``shm_leftovers.remove_stale``: a reused pid keeps its segment, names without a pid and other files are left
    alone; a live CU in another pid namespace sharing this /dev/shm falls back to inline frames)."""
    return [path.name for path in shm_leftovers.remove_stale(PREFIX, where)]


def pointer_frame(name: str, size: int) -> bytes:
    """The small frame that stands for ``size`` bytes of a frame held in segment ``name``."""
    return encode_frame({"kind": KIND, "name": name, "size": int(size)}, [])


def read_pointer(frame: bytes | bytearray) -> tuple[str, int] | None:
    """(segment name, size) when ``frame`` is a pointer frame, else None; a malformed pointer is refused."""
    if len(frame) > 4096:  # pointer frames are tiny; anything larger is an inline step frame
        return None
    try:
        meta = decode_header(frame)
    except DataPlaneError:
        return None
    if meta.get("kind") != KIND:
        return None
    name, size = meta.get("name"), meta.get("size")
    if not isinstance(name, str) or not name.startswith(PREFIX) or not isinstance(size, int) or size <= 0:
        raise DataPlaneError(f"malformed shared-memory pointer {meta!r}; the CU runs another data-plane version")
    return name, size


def _buf(shm: shared_memory.SharedMemory) -> memoryview:
    buf = shm.buf
    if buf is None:  # closed
        raise DataPlaneError(f"shared-memory segment {shm.name} is closed")
    return buf


def _write(buf: memoryview, frame: bytes | Frame) -> None:
    if isinstance(frame, Frame):
        frame.write_into(buf)
    else:
        buf[: len(frame)] = frame


class ClientSegment:
    """The CU's segment for one stream: request frames in, reply frames out (same bytes, in turn)."""

    def __init__(self, size: int) -> None:
        self.shm = shared_memory.SharedMemory(name=segment_name(), create=True, size=int(size))
        self.name = self.shm.name
        _MADE_HERE.add(self.name)

    @property
    def size(self) -> int:
        return self.shm.size

    def write(self, frame: bytes | Frame) -> bytes:
        """Put ``frame`` in the segment (a :class:`~.wire.Frame`'s pieces written in place: one copy of its
        tensors); return the pointer frame to send instead."""
        if len(frame) > self.shm.size:
            raise DataPlaneError(f"a {len(frame)}-byte frame does not fit the {self.shm.size}-byte segment")
        _write(_buf(self.shm), frame)
        return pointer_frame(self.name, len(frame))

    def read(self, size: int) -> bytearray:
        """The reply frame the host left in the segment, copied out once into a private buffer (the next request
        overwrites the segment) that :func:`~.wire.decode_frame` then views in place."""
        if not 0 < size <= self.shm.size:
            raise DataPlaneError(f"the host's reply pointer names {size} bytes of a {self.shm.size}-byte segment")
        return bytearray(_buf(self.shm)[:size])

    def close(self) -> None:
        """Detach and remove the segment (idempotent)."""
        if self.shm is None:
            return
        shm, self.shm = self.shm, None  # type: ignore[assignment]
        shm.close()
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


class HostSegments:
    """The host's attachments to the segments of one stream (attached on first use, detached at the end)."""

    def __init__(self, max_bytes: int = 0) -> None:
        self._open: dict[str, shared_memory.SharedMemory] = {}
        self.max_bytes = int(max_bytes)  # the largest frame a pointer may name (the host's message cap; 0 = any)

    def _get(self, name: str) -> shared_memory.SharedMemory:
        if name not in self._open:
            try:
                shm = shared_memory.SharedMemory(name=name, create=False)
            except (FileNotFoundError, OSError) as err:
                raise DataPlaneError(
                    f"cannot open the CU's shared-memory segment {name} ({err.__class__.__name__}); the CU is not on "
                    "this host: set dataplane.shared_memory=off there"
                ) from None
            # attaching registers the segment with this process's resource tracker, which would unlink the
            # CU's segment when the host exits: the CU owns it (unless the CU is this very process)
            if name not in _MADE_HERE:
                resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
            self._open[name] = shm
        return self._open[name]

    def read(self, name: str, size: int) -> bytearray:
        """The frame a CU's pointer names, copied out after its size is checked against the host's message
        cap (the same cap gRPC applies to an inline frame) and before the segment is even attached."""
        if self.max_bytes and not 0 < size <= self.max_bytes:
            raise DataPlaneError(
                f"shared-memory pointer names a {size}-byte frame; the data plane takes at most {self.max_bytes} "
                "bytes a step (dataplane.max_message_mb)"
            )
        shm = self._get(name)
        if size > shm.size:
            raise DataPlaneError(f"shared-memory pointer names {size} bytes of a {shm.size}-byte segment")
        # one private copy, before any byte is parsed: the CU may rewrite its segment at any time, so the key,
        # round and cluster checked are those of the frame that is served
        return bytearray(_buf(shm)[:size])

    def reply(self, name: str, frame: Frame) -> bytes:
        """The reply to send: a pointer when ``frame`` fits the segment (written there), else ``frame`` itself."""
        shm = self._get(name)
        if len(frame) > shm.size:
            return frame.tobytes()
        frame.write_into(_buf(shm))
        return pointer_frame(name, len(frame))

    def close(self) -> None:
        for shm in self._open.values():
            shm.close()
        self._open.clear()
