"""What a GPU check of an out-of-memory snapshot asserts: its largest live allocation and its failed request against
the tensors the check allocated, each at the line that allocated it."""

import os

MB = 1024.0 * 1024.0


def line_of(path, marker):
    """The number of the line of ``path`` that ends with ``marker``."""
    with open(path) as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(marker))


def check_oom_snapshot(record, what, dump, kept, failed):
    """``kept`` and ``failed``: ``(bytes, path, marker, function)`` of the tensor kept and of the request that failed;
    ``dump``: the snapshot's entry (``top_allocations``, ``failed_request``, ``path``, ``html``)."""
    top, request = dump["top_allocations"][0], dump["failed_request"]
    kept_mb, failed_mb = kept[0] / MB, failed[0] / MB
    record(f"{what}: largest live allocation", top["size_mb"], kept_mb, "MB", "within 1%")
    record(f"{what}: failed request", request["size_mb"], failed_mb, "MB", "within 2 MB")
    assert abs(top["size_mb"] - kept_mb) <= 0.01 * kept_mb
    assert top["frame"] == f"{kept[1]}:{line_of(kept[1], kept[2])} in {kept[3]}"
    assert abs(request["size_mb"] - failed_mb) <= 2.0
    assert request["frame"] == f"{failed[1]}:{line_of(failed[1], failed[2])} in {failed[3]}"
    for view, html in dump["html"].items():
        assert os.path.getsize(html) > os.path.getsize(dump["path"]), view  # the pickle, base64, in the page
