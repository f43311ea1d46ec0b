"""SectionProfiler's device side on CUDA: events at the ledger's switches in the iterations timed on the device, read
once the device has passed them, each interval labelled with the section and the iteration its host piece belongs
to, and the user sections' event pairs."""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, Optional, Tuple

from lightning_perf.measure.sections import user_sections
from lightning_perf.measure.sections.ledger import SectionLedger
from lightning_perf.measure.timing.clock import DeviceIntervalClock, device_timed

#: What a device interval belongs to: (section, iteration 0-based in the run, counted). A plain tuple: a NamedTuple
#: cost ~0.5 µs more to build (timeit), ~4 µs a step at device_timing_every_n_iterations=1 (about 8 marks a step).
DeviceLabel = Tuple[str, int, bool]


class SectionDevice:
    """The device clock of one fit and what it owes the ledger. Iterations timed: the first
    ``every_n`` after the warm-up, then one in ``every_n`` (``measure.timing.clock.device_timed``)."""

    def __init__(self, ledger: SectionLedger, clock: DeviceIntervalClock, warmup_steps: int, every_n: int) -> None:
        self.ledger, self.clock = ledger, clock
        self.warmup_steps, self.every_n = warmup_steps, every_n
        self.pending_user: Deque[user_sections.UserSectionEvents] = deque()
        self.pieces: Dict[str, float] = {}  # device ms per section of the iteration being read
        self.iteration: Optional[int] = None

    def timed(self, fit_iteration: int) -> bool:
        """Whether this iteration of the fit (0-based) is timed on the device."""
        return device_timed(fit_iteration, self.warmup_steps, self.every_n)

    def near_timed(self) -> bool:
        """Whether a switch can end or start a piece timed on the device: every piece belongs to this iteration or
        the next, so one of the two is timed. Elsewhere the ledger calls no marker."""
        fit = self.ledger.fit_iterations
        return self.timed(fit) or self.timed(fit + 1)

    def mark(self, current: Optional[str], section: Optional[str], end_next: bool, start_next: bool) -> None:
        """The device side of a switch: a CUDA event at the same boundary as the host pieces."""
        fit = self.ledger.fit_iterations
        if current is not None and self.timed(fit + end_next):  # a timed piece ends here
            # labelled with the iteration the piece belongs to: device time is summed per iteration, like host
            self.clock.mark(label=(current, self.ledger.iterations + end_next, fit + end_next >= self.warmup_steps))
            if section is not None and not self.timed(fit + start_next):
                self.clock.break_chain()  # the next iterations are not timed: no interval spans them
        elif section is not None and self.timed(fit + start_next):
            self.clock.mark(counted=False)  # a timed piece starts here (after validation, an untimed one)

    def section_started(self) -> Any:
        """A user section starts: its first event on a timed iteration, else None."""
        return self.clock.stamp() if self.timed(self.ledger.fit_iterations) else None

    def section_ended(self, name: str, token: Any) -> None:
        """A user section that started on a timed iteration ends: its event pair, read later."""
        self.pending_user.append(user_sections.UserSectionEvents(name, token, self.clock.stamp(), self.ledger.counted))

    def poll(self, flush: bool = False) -> None:
        """The device intervals the device has passed (all of them with ``flush``, at the train end) into the ledger;
        the user sections' event pairs that completed into their sections."""
        for label, ms in (self.clock.flush_labeled() if flush else self.clock.poll_labeled()):
            if label is not None:
                self._interval(label, ms)
        if flush:  # every interval read: the last closed iteration's go in; the open one's not (nor its host pieces)
            if self.iteration is not None and self.iteration < self.ledger.iterations:
                self._close_iteration()
            self.pieces = {}
        pending = self.pending_user
        while pending and (flush or pending[0].end.query()):
            events = pending.popleft()
            if flush:
                events.end.synchronize()
            if events.counted:
                self.ledger.section(events.name, "user").device.add(float(events.start.elapsed_time(events.end)))

    def _interval(self, label: DeviceLabel, ms: float) -> None:
        """A device interval read, labelled by the mark. One device time per section per iteration: the sum of its
        pieces (optimizer_step and other run twice in an iteration)."""
        section, iteration, counted = label
        if iteration != self.iteration:  # every piece of the previous iteration has been read
            self._close_iteration()
            self.iteration = iteration
        if counted:
            self.pieces[section] = self.pieces.get(section, 0.0) + ms

    def _close_iteration(self) -> None:
        sections = self.ledger.sections
        for name, ms in self.pieces.items():
            if name in sections:
                sections[name].device.add(ms)
        self.pieces = {}
