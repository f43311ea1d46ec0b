"""Labels that read right: every printed memory figure of 2^20 bytes says MiB (GiB for 2^30), as the summary's
``_mb`` fields hold them."""

import logging
import re

from helpers import fit
from lightning_perf import VRAMMonitor
from lightning_perf.callbacks.eval_no_grad_guard.callback import _fmt_bytes
from lightning_perf.measure.memory.phases import leak_warning, memory_verdict


def test_vram_monitors_console_line_says_mib(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        fit(tmp_path, [VRAMMonitor()], max_epochs=1)
    line = next(x for x in caplog.text.splitlines() if "VRAMMonitor (host RSS)" in x)
    assert re.search(r"train peak \d+ MiB", line), line
    assert " MB" not in line, line


def test_memory_lines_and_the_guards_sizes_are_mib():
    leaks = {"train": {"suspected": True, "rate_mb_per_100_iters": 8.0}}
    line = memory_verdict({"train": {"peak_allocated_mb": 512.0}}, leaks, True, lambda held: None)
    assert line == "VRAMMonitor (allocator): train peak 512 MiB; leak suspected in train (+8.0 MiB/100 it)"
    assert "8.0 MiB per 100 iterations so far" in leak_warning(8.0, "train")
    assert (_fmt_bytes(3 * 2**20), _fmt_bytes(2 * 2**30), _fmt_bytes(2048)) == ("3.0 MiB", "2.00 GiB", "2.0 KiB")
