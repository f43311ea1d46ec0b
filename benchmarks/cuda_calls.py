"""The price list behind the suite's CUDA cost: µs a call of each host operation the callbacks make in the step path.

The in-hook figures of ``overhead.py --device cuda`` say how much the suite costs on a host-bound CUDA step; this says
what that time buys. Each operation is called in a tight loop and the median over repeats of the loop's mean is
printed (event records: a small kernel queued before each loop, so the events have work to pass; the events exist
already, so a fresh event's first record, which creates it in the driver, costs more). The first rows need no GPU
and measure the host itself (a Python call, a clock read), so that two machines' figures can be compared: the same
callbacks cost more on a host whose Python runs slower.

    python benchmarks/cuda_calls.py             # ~20 s; without CUDA, the host rows alone
"""

import functools
import itertools
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

CALLS = 2000
REPEATS = 7


def per_call_us(fn: Callable[[], object], calls: int = CALLS) -> float:
    """Median over REPEATS of the mean µs a call of ``fn`` over ``calls`` calls, the loop's own cost included (the
    first row gives it: an empty call)."""
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append(1e6 * (time.perf_counter() - start) / calls)
    return statistics.median(runs)


def cycling(calls: List[Callable[[], object]]) -> Callable[[], object]:
    """One call of the next of ``calls`` each time (bound methods of different events), round and round."""
    it = itertools.cycle(calls)
    return lambda: next(it)()


def host_rows() -> Dict[str, float]:
    data = list(range(64))
    return {
        "an empty Python call (the loop's own cost, in every row)": per_call_us(lambda: None),
        "Python: sum of 64 ints (host speed)": per_call_us(lambda: sum(data)),
        "time.perf_counter()": per_call_us(time.perf_counter),
        "time.thread_time()": per_call_us(time.thread_time),
        "time.process_time()": per_call_us(time.process_time),
    }


def cuda_rows() -> Dict[str, float]:
    x = torch.randn(256, 256, device="cuda")
    stream = torch.cuda.current_stream()
    rows: Dict[str, float] = {}

    def queue() -> None:  # a small kernel between calls: the events mark real work
        torch.mm(x, x)

    rows["torch.cuda.current_stream()"] = per_call_us(torch.cuda.current_stream)
    rows["torch.cuda.Event(enable_timing=True) (the Python object)"] = per_call_us(lambda: torch.cuda.Event(enable_timing=True))
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(CALLS)]

    def record_each(with_stream: bool) -> Callable[[], None]:
        it = iter(pool)
        return (lambda: next(it).record(stream)) if with_stream else (lambda: next(it).record())

    def timed(make: Callable[[], Callable[[], None]]) -> float:
        runs = []
        for _ in range(REPEATS):
            f = make()
            queue()
            start = time.perf_counter()
            for _ in range(CALLS):
                f()
            runs.append(1e6 * (time.perf_counter() - start) / CALLS)
            torch.cuda.synchronize()
        return statistics.median(runs)

    rows["Event.record(stream)"] = timed(lambda: record_each(True))
    rows["Event.record() (asks for the stream)"] = timed(lambda: record_each(False))
    for e in pool:
        e.record(stream)
        queue()
    torch.cuda.synchronize()
    rows["Event.query() (passed)"] = per_call_us(cycling([e.query for e in pool]))
    rows["Event.elapsed_time(other)"] = per_call_us(
        cycling([functools.partial(a.elapsed_time, b) for a, b in zip(pool[:-1], pool[1:])]))
    rows["torch.cuda.memory_stats_as_nested_dict()"] = per_call_us(torch.cuda.memory_stats_as_nested_dict,
                                                                    calls=200)
    rows["torch.cuda.memory_allocated()"] = per_call_us(torch.cuda.memory_allocated, calls=200)
    rows["torch.cuda.max_memory_allocated()"] = per_call_us(torch.cuda.max_memory_allocated, calls=200)
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        rows["pynvml utilisation (sampler thread, off the step path)"] = per_call_us(
            lambda: pynvml.nvmlDeviceGetUtilizationRates(handle), calls=200)
    except Exception as exc:  # NVML absent: the row is left out, and says why
        print(f"NVML row left out: {exc}", file=sys.stderr)
    return rows


def main() -> int:
    rows = host_rows()
    where = "no CUDA device: host rows only"
    if torch.cuda.is_available():
        rows.update(cuda_rows())
        where = torch.cuda.get_device_name(0)
    print(f"µs a call, median of {REPEATS} repeats ({where}; torch {torch.__version__}, Python"
          f" {sys.version.split()[0]})")
    for name, us in rows.items():
        print(f"  {name:<58}{us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
