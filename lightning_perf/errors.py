"""The two errors a user of lightning_perf catches: a check that failed, and a setting that is wrong."""


class PerfCheckFailed(RuntimeError):
    """A check the user asked to fail on has failed. The only error a lightning_perf hook lets through."""


class PerfConfigError(PerfCheckFailed, ValueError):
    """A setting that can only be checked once training runs (outputs, logged names) is wrong; raised at once."""
