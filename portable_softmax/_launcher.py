"""Launchers kept for repeat calls, keyed by each array adapter's cheap key.

A model calls softmax on arrays of the same layout again and again. The first call of a key
classifies, plans, takes its scratch and builds a launcher (``Runtime.prepare``); it and every
later call replay that launcher, so a repeat call reads a few attributes, allocates its output
and launches. An entry is a tuple ``(launcher, contiguous, bound_to, keep, device)``:

- ``launcher(*pointers, stream)``: the plan's launches with this call's array pointers;
- ``contiguous``: whether the input is C-contiguous (its ``empty_like`` is the planned output);
- ``bound_to``: the stream key whose launches own the entry's scratch (None: no scratch);
- ``keep``: the scratch's keep-alive object;
- ``device``: the (vendor, device index) the launcher launches on;
- ``windows``: where a call writes out=, each input's ``_arrays.write_window`` against it: a repeat
  call whose out shares bytes with an input without being it takes the full path instead.

Plans with scratch get their own, zeroed once where the launches leave it zero, and replay only on
the stream the entry was built on. Entries bound to an ended thread's per-thread stream are
dropped when the pool retires that stream.

>>> from portable_softmax._launcher import LauncherCache
>>> from portable_softmax._scratch import ScratchPool
>>> cache = LauncherCache(ScratchPool())
>>> len(cache), cache.get(("no", "such", "key"))
(0, None)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from ._scratch import PER_THREAD_DEFAULT_STREAM, ScratchPool, StreamKey

if TYPE_CHECKING:
    from ._arrays import DeviceArray
    from ._runtime import Runtime
    from .planner import Plan

#: (launcher, contiguous, bound_to, keep, (vendor, device), windows)
Entry = tuple[Callable[..., None], bool, Any, Any, tuple[str, int], tuple]


class LauncherCache:
    """The prepared launchers of repeat calls, with the scratch they own."""

    #: entries kept at most: past it the cache starts again (a workload of ever-new shapes)
    LIMIT = 4096

    def __init__(self, pool: ScratchPool) -> None:
        self.pool = pool
        #: key -> Entry; the repeat paths read it directly (one dict probe a call)
        self.entries: dict[Hashable, Entry] = {}
        pool.retire_hooks.append(self._retired)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries

    def get(self, key: Hashable) -> Entry | None:
        return self.entries.get(key)

    def build(self, key: Hashable, rt: Runtime, src: DeviceArray, the_plan: Plan, stream: int,
              pointers: Sequence[str] = ("x", "y"), contiguous: bool = True, windows: tuple = ()) -> Entry | None:
        """Build and keep the entry of ``key``: ``the_plan``'s launcher on ``src``'s device with its
        own scratch, replayed as ``launcher(*pointers, stream)``. None where none can be kept: the key
        has an entry bound to another stream, or the stream is capturing a graph (a fill captured
        zeroes nothing until the graph runs)."""
        keep, bound_to, buffers = None, None, None
        if the_plan.scratch:
            if key in self.entries or src.capturing():
                return None
            nbytes, offsets = the_plan.scratch_layout()
            base, keep = src.scratch(nbytes, zeroed=the_plan.scratch_zeroed)
            buffers = {name: base + offset for name, offset in offsets.items()}
            bound_to = self.pool.stream_key(stream)
            if stream == PER_THREAD_DEFAULT_STREAM:
                self.pool.watch(src, rt)
        launcher = rt.prepare(the_plan, src.dtype, src.device_index, buffers, pointers=tuple(pointers))
        if len(self.entries) >= self.LIMIT:
            self.entries.clear()
        entry = self.entries[key] = (launcher, contiguous, bound_to, keep, (src.vendor, src.device_index), windows)
        return entry

    def bound_to(self, stream_key: StreamKey) -> list[Hashable]:
        """The keys whose entries replay only on ``stream_key``'s stream."""
        return [k for k, v in list(self.entries.items()) if v[2] == stream_key]

    def clear(self) -> None:
        """Forget every entry (a stream-ordered allocator reuses their scratch after queued launches)."""
        self.entries.clear()

    def _retired(self, device_key: tuple[str, int], stream_key: StreamKey, drained: bool) -> None:
        """An ended thread's entries on a device never run again (their key names its stream): they
        go, and their scratch with them once drained, else it is kept alive."""
        for key in [k for k, v in list(self.entries.items()) if v[2] == stream_key and v[4] == device_key]:
            entry = self.entries.pop(key, None)
            if entry is not None and not drained:
                self.pool.keep_alive(entry[3])

