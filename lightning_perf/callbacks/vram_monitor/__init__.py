"""VRAMMonitor: the hooks (``callback``), the device activity probe (``activity``) and the phases a user's hook opens
(``hook_phases``)."""

from lightning_perf.callbacks.vram_monitor.callback import VRAMMonitor

__all__ = ["VRAMMonitor"]
