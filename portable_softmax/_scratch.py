"""Zero-filled scratch kept per (device, stream), and the lifetime of per-thread default streams.

Plans whose launches find their scratch zero leave it zero (``Plan.scratch_zeroed``), so a buffer
zeroed once serves every later call on its stream: a call launches its kernels alone, without a
fill ahead of them. One buffer a stream: launches on two streams may run at once, and must not
count in each other's scratch.

The per-thread default stream (cudaStreamPerThread, hipStreamPerThread) is one handle that names a
different stream in each host thread, so its key carries a token of the thread, never given to
another thread (a thread id is, once its thread ends). When a thread ends, its stream is drained on
each device it launched on and its buffers become idle: the next stream new to the pool takes one
instead of a fill.

>>> from portable_softmax._scratch import ScratchPool, PER_THREAD_DEFAULT_STREAM
>>> pool = ScratchPool()
>>> pool.stream_key(0x100)
256
>>> pool.stream_key(PER_THREAD_DEFAULT_STREAM)[0] == PER_THREAD_DEFAULT_STREAM
True
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any, Protocol

#: the handle of the per-thread default stream (cudaStreamPerThread, hipStreamPerThread): the same
#: number names a different stream in each host thread (cupy's Stream.ptds, or every default
#: stream under CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1)
PER_THREAD_DEFAULT_STREAM = 2

#: a kept buffer: (pointer, bytes, keep-alive object)
Buffer = tuple[int, int, Any]
#: what tells a stream from every other stream of its device (see ScratchPool.stream_key)
StreamKey = Any


class ScratchOwner(Protocol):
    """What the pool reads of a device array: where it lives and how it allocates scratch."""

    vendor: str
    device_index: int

    def scratch(self, nbytes: int, zeroed: bool = True) -> tuple[int, Any]: ...


class Drainer(Protocol):
    """What the pool asks of a runtime when a thread ends: wait for its per-thread stream."""

    def synchronize_stream(self, device: int, stream: int) -> None: ...


#: retire hooks get (vendor, device), the ended thread's stream key and whether it drained
RetireHook = Callable[[tuple[str, int], StreamKey, bool], None]

_tokens = itertools.count(1)


class _ThreadStream:
    """One host thread's per-thread default stream, as one pool tells it apart.

    Thread-local: its ``__del__`` runs on the ending thread (its handle still names its stream).
    """

    def __init__(self, pool: ScratchPool) -> None:
        self.pool = pool
        self.token = next(_tokens)
        #: (vendor, device) -> the runtime adapter that drains this thread's per-thread stream there
        self.drains: dict[tuple[str, int], Drainer] = {}

    def __del__(self) -> None:
        try:
            self.pool._retire(self)
        except Exception:  # noqa: BLE001 -- interpreter exit: the module or the runtime may be gone
            pass


class ScratchPool:
    """Zeroed scratch per (vendor, device, stream), grown on demand, reused across ended threads."""

    #: the smallest buffer the pool allocates: small plans then share one fill
    MIN_BYTES = 64 << 10

    def __init__(self) -> None:
        #: (vendor, device, stream key) -> the stream's buffer
        self._held: dict[tuple, Buffer] = {}
        #: buffers outgrown by a larger call, or of a stream that could not be drained: launches
        #: queued before may still use them, so they stay alive
        self._kept_alive: list[Any] = []
        #: (vendor, device) -> zeroed buffers no launch uses any more (an ended thread's, drained)
        self._idle: dict[tuple[str, int], list[Buffer]] = {}
        self._local = threading.local()
        #: called when a thread's per-thread stream retires (a launcher cache drops what it bound there)
        self.retire_hooks: list[RetireHook] = []

    # ---- streams --------------------------------------------------------------------------------
    def _thread_stream(self) -> _ThreadStream:
        state = getattr(self._local, "stream", None)
        if state is None:
            state = self._local.stream = _ThreadStream(self)
        return state

    def stream_key(self, stream: int) -> StreamKey:
        """What tells ``stream`` from every other stream of its device: the handle, and for the
        per-thread default stream also this host thread's token."""
        return (stream, self._thread_stream().token) if stream == PER_THREAD_DEFAULT_STREAM else stream

    def watch(self, owner: ScratchOwner, rt: Drainer) -> None:
        """Drain this thread's per-thread stream on ``owner``'s device when the thread ends (then its
        buffers there go idle and the retire hooks run)."""
        self._thread_stream().drains.setdefault((owner.vendor, owner.device_index), rt)

    def _retire(self, state: _ThreadStream) -> None:
        """An ended thread's buffers: idle once its per-thread stream has drained; where it cannot
        be drained (the runtime fails), kept alive, never reused."""
        key = (PER_THREAD_DEFAULT_STREAM, state.token)
        for device_key, rt in state.drains.items():
            try:
                rt.synchronize_stream(device_key[1], PER_THREAD_DEFAULT_STREAM)
                drained = True
            except Exception:  # noqa: BLE001 -- any failure: the buffers may still be in use
                drained = False
            held = self._held.pop((*device_key, key), None)
            if held is not None and drained:
                self._idle.setdefault(device_key, []).append(held)
            elif held is not None:
                self._kept_alive.append(held[2])
            for hook in list(self.retire_hooks):
                hook(device_key, key, drained)

    # ---- buffers --------------------------------------------------------------------------------
    def zeroed(self, owner: ScratchOwner, nbytes: int, stream: int, rt: Drainer) -> int:
        """The pointer of the zeroed scratch of ``owner``'s device and ``stream``, at least ``nbytes``
        long. A new buffer is an idle one where one is large enough, else a fill queued on the
        current stream; ``rt`` drains a per-thread default stream when its thread ends."""
        key = (owner.vendor, owner.device_index, self.stream_key(stream))
        held = self._held.get(key)
        if held is None or held[1] < nbytes:
            if held is not None:
                self._kept_alive.append(held[2])
            elif stream == PER_THREAD_DEFAULT_STREAM:
                self.watch(owner, rt)
            held = self._held[key] = self._take_idle(owner, nbytes) or self._fill(owner, nbytes, held)
        return held[0]

    def _take_idle(self, owner: ScratchOwner, nbytes: int) -> Buffer | None:
        idle = self._idle.get((owner.vendor, owner.device_index))
        for i, entry in enumerate(idle or ()):
            if entry[1] >= nbytes:
                return idle.pop(i)
        return None

    def _fill(self, owner: ScratchOwner, nbytes: int, held: Buffer | None) -> Buffer:
        size = max(nbytes, self.MIN_BYTES, 2 * held[1] if held else 0)
        pointer, keep = owner.scratch(size)  # the fill is queued on the current stream, ahead of the launches
        return pointer, size, keep

    def keep_alive(self, obj: Any) -> None:
        """Keep ``obj`` (a buffer launches may still use) alive as long as the pool."""
        self._kept_alive.append(obj)

    # ---- what the pool holds (tests, diagnostics) -----------------------------------------------
    def idle(self, vendor: str, device: int) -> list[Buffer]:
        """The drained buffers of ``device`` that the next new stream takes, oldest first."""
        return list(self._idle.get((vendor, device), ()))

    def held(self, vendor: str, device: int) -> dict[StreamKey, Buffer]:
        """The buffer each stream of ``device`` holds, by stream key."""
        return {k[2]: v for k, v in list(self._held.items()) if k[:2] == (vendor, device)}

    def held_streams(self) -> list[StreamKey]:
        """The stream keys that hold a buffer, on any device."""
        return [k[2] for k in list(self._held)]

    def kept_alive(self) -> int:
        """How many outgrown or undrained buffers the pool keeps alive."""
        return len(self._kept_alive)

    def clear(self) -> None:
        """Forget every buffer, outgrown ones too: only where no queued launch can use them (the
        device synchronized)."""
        self._held.clear()
        self._idle.clear()
        self._kept_alive.clear()
