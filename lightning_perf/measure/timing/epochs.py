"""Per-epoch training time and iterations, validation left out, carried across a mid-epoch resume."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

#: Epoch records kept (a run of more epochs keeps its first ones): bounded memory.
MAX_EPOCH_RECORDS = 10_000


class EpochRecords:
    """The epochs of a run: ``records`` (epoch, time_s, iterations, it_per_s, eval_time_s) and the epoch in progress.
    Times are read by the caller and given with the run's iterations and evaluation time so far."""

    def __init__(self) -> None:
        self.records: List[Dict[str, Any]] = []
        self.epoch: Optional[int] = None  # the epoch in progress
        self.start: Optional[float] = None
        self.eval_start = 0.0  # the evaluation time so far, at its start
        self.iter_start = 0
        self.prior_s = 0.0  # the part of it an earlier process ran (resumed mid-epoch)
        self.carried: Optional[Dict[str, Any]] = None  # a checkpoint's epoch in progress, until the fit starts
        self.resumed: Optional[int] = None  # the epoch a mid-epoch resume goes on with, until it starts again

    def resume(self, epoch: int, t: float, eval_s: float, iterations: int) -> None:
        """At train start: where a checkpoint carried this epoch in progress, its record goes on from there (Lightning
        starts no new epoch)."""
        carried, self.carried = self.carried, None
        if carried is not None and carried.get("epoch") == epoch:
            self.start, self.epoch, self.resumed = t, epoch, epoch
            self.eval_start = eval_s - float(carried.get("eval_time_s", 0.0))
            self.iter_start = iterations - int(carried.get("iterations", 0))
            self.prior_s = float(carried.get("time_s", 0.0))

    def begin(self, epoch: int, t: float, eval_s: float, iterations: int) -> bool:
        """An epoch starts; False where it is the one a mid-epoch resume goes on with (Lightning 2.2 starts it
        again)."""
        resumed, self.resumed = self.resumed, None
        if resumed == epoch:
            return False
        self.start, self.epoch, self.eval_start, self.iter_start, self.prior_s = t, epoch, eval_s, iterations, 0.0
        return True

    def end(self, epoch: int, t: float, eval_s: float, iterations: int) -> None:
        if self.start is None:
            return
        seconds = self.prior_s + t - self.start - (eval_s - self.eval_start)
        iters = iterations - self.iter_start
        if len(self.records) < MAX_EPOCH_RECORDS:
            self.records.append({"epoch": epoch, "time_s": seconds, "iterations": iters,
                                 "it_per_s": iters / seconds if seconds > 0 else None,
                                 "eval_time_s": eval_s - self.eval_start})
        self.start = None

    def open_record(self, t: float, eval_s: float, iterations: int) -> Optional[Dict[str, Any]]:
        """The epoch in progress when a checkpoint is saved mid-epoch: what a resume continues."""
        if self.start is None or self.epoch is None:
            return None
        spent_eval = eval_s - self.eval_start
        return {"epoch": self.epoch, "iterations": iterations - self.iter_start,
                "time_s": self.prior_s + t - self.start - spent_eval, "eval_time_s": spent_eval}

    def skip(self, seconds: float) -> None:
        """Work left out of the epoch's time (the FLOP count)."""
        if self.start is not None:
            self.start += seconds
