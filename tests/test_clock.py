"""DeviceIntervalClock with simulated CUDA events: only the hardware is simulated, the logic is the real one."""

import pytest

from lightning_perf.measure.timing.clock import DeviceIntervalClock


class FakeStream:
    """A device that completes work when told, recording a device timestamp per event."""

    def __init__(self):
        self.device_ms = 0.0
        self.queued = []
        self.syncs = 0

    def advance(self, ms):
        """The device finishes the oldest queued event after ``ms`` of work."""
        self.device_ms += ms
        event = self.queued.pop(0)
        event.time = self.device_ms


class FakeEvent:
    def __init__(self, stream):
        self.stream, self.time = stream, None

    def record(self, stream=None):
        self.recorded_on = stream
        self.time = None
        self.stream.queued.append(self)

    def query(self):
        return self.time is not None

    def synchronize(self):
        self.stream.syncs += 1
        while self.time is None:
            self.stream.advance(1.0)

    def elapsed_time(self, other):
        assert self.time is not None and other.time is not None, "read before completion would stall"
        return other.time - self.time


def make():
    stream = FakeStream()
    return stream, DeviceIntervalClock(event_factory=lambda: FakeEvent(stream), max_pending=8)


def test_poll_reads_only_completed_intervals_and_never_waits():
    stream, clock = make()
    clock.mark()  # starts the chain: no interval ends here
    clock.mark()
    clock.mark()
    assert clock.poll() == []  # nothing completed yet
    stream.advance(5.0)
    stream.advance(7.0)
    assert clock.poll() == [7.0]
    stream.advance(3.0)
    assert clock.poll() == [3.0]
    assert stream.syncs == 0


def test_uncounted_intervals_are_skipped_and_flush_syncs_once():
    stream, clock = make()
    clock.mark()
    clock.mark(counted=False)  # e.g. warm-up
    clock.mark()
    assert clock.flush() == [1.0]
    assert stream.syncs == 1


def test_break_chain_leaves_the_spanning_interval_out():
    stream, clock = make()
    clock.mark()
    clock.break_chain()  # validation ran here
    clock.mark()
    clock.mark()
    assert clock.flush() == [1.0]


def test_events_are_reused_and_pending_is_bounded():
    stream, clock = make()
    created = []

    def factory():
        created.append(FakeEvent(stream))
        return created[-1]

    clock._factory = factory
    for _ in range(20):  # the device never catches up
        clock.mark()
    assert len(created) == 8 and clock.dropped == 12
    clock.flush()
    for _ in range(5):
        clock.mark()
        clock.poll()
        stream.advance(1.0)
    assert len(created) == 8  # back from the pool, not new


def test_the_stream_is_asked_once_per_chain_and_every_event_is_recorded_on_it():
    """current_stream() costs ~8 us on a GPU host: asked at the first mark after a boundary, not at every mark."""
    stream = FakeStream()
    asked, events = [], []

    def factory():
        events.append(FakeEvent(stream))
        return events[-1]

    def current_stream():
        asked.append(f"stream{len(asked)}")
        return asked[-1]

    clock = DeviceIntervalClock(event_factory=factory, max_pending=64, current_stream=current_stream)
    for _ in range(5):
        clock.mark()
    clock.break_chain()  # a phase boundary: the stream may have changed
    clock.mark()
    clock.mark()
    assert asked == ["stream0", "stream1"]
    assert [e.recorded_on for e in events] == ["stream0"] * 5 + ["stream1"] * 2
    for _ in range(7):
        stream.advance(1.0)
    assert clock.poll() == [1.0] * 5  # 4 in the first chain, 1 in the second
