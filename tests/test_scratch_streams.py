"""The zeroed scratch kept per stream (api._zeroed_scratch), without a GPU: which calls share a
buffer. Launches that share one count arrivals in each other's scratch, so two streams that can
run at once must never share; calls on one stream must, or every call pays a fill again."""

from __future__ import annotations

import threading

import pytest

from portable_softmax import api


class FakeDevice:
    """The part of a DeviceArray that _zeroed_scratch uses; each scratch() a new zeroed buffer."""

    vendor, device_index = "cuda", 0

    def __init__(self):
        self.fills: list[int] = []

    def scratch(self, nbytes, zeroed=True):
        assert zeroed, "the kept scratch must start zeroed"
        self.fills.append(nbytes)
        buffer = bytearray(nbytes)
        return id(buffer), buffer


@pytest.fixture
def kept(monkeypatch):
    monkeypatch.setattr(api, "_zeroed", {})
    monkeypatch.setattr(api, "_outgrown", [])
    return FakeDevice()


def _pointer_in_new_thread(device, nbytes, stream):
    pointer = []
    worker = threading.Thread(target=lambda: pointer.append(api._zeroed_scratch(device, nbytes, stream)))
    worker.start()
    worker.join()
    return pointer[0]


def test_calls_on_one_stream_share_one_fill(kept):
    ordinary = 0x5A5A00
    first = api._zeroed_scratch(kept, 4096, ordinary)
    assert api._zeroed_scratch(kept, 1024, ordinary) == first
    # An ordinary handle names one stream in every host thread: its launches are ordered.
    assert _pointer_in_new_thread(kept, 4096, ordinary) == first
    assert len(kept.fills) == 1


def test_two_streams_never_share(kept):
    assert api._zeroed_scratch(kept, 4096, 0x100) != api._zeroed_scratch(kept, 4096, 0x200)
    assert len(kept.fills) == 2


def test_the_per_thread_default_stream_is_a_stream_a_thread(kept):
    """cudaStreamPerThread / hipStreamPerThread: one handle, a different stream in each thread,
    whose launches may run at the same time as this thread's."""
    per_thread = api.PER_THREAD_DEFAULT_STREAM
    here = api._zeroed_scratch(kept, 4096, per_thread)
    there = _pointer_in_new_thread(kept, 4096, per_thread)
    assert here != there
    assert api._zeroed_scratch(kept, 4096, per_thread) == here  # this thread's again: no new fill
    assert len(kept.fills) == 2
    assert api.stream_key(per_thread) != per_thread and api.stream_key(0x100) == 0x100


def test_a_larger_call_grows_the_buffer_and_keeps_the_outgrown_one(kept):
    small = api._zeroed_scratch(kept, 4096, 0x100)
    large = api._zeroed_scratch(kept, 1 << 20, 0x100)
    assert large != small and kept.fills[-1] >= 1 << 20
    # launches queued before the larger call may still use the smaller buffer: it stays alive
    assert len(api._outgrown) == 1
    assert api._zeroed_scratch(kept, 4096, 0x100) == large
