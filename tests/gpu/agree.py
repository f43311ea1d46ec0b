"""The VRAM checks in a fresh process against the same checks after every other GPU check (make gpu-check).

    python tests/gpu/agree.py runs/gpu_check/vram_first.json runs/gpu_check/checks.json

Each row in MB of the first file must be in the second with both figures (ours and the independent measure) within
1 MB: a peak that moves with what ran before it in the process is measuring the process, not the fit. NVML's process
figure is printed, not held to 1 MB: it holds the CUDA context, which grows as the process loads more kernels. Exit 1
and a line per row that disagrees or is missing; exit 2 when a file holds no MB row.
"""

import json
import sys


def mb_rows(path):
    with open(path) as fh:
        return {row["check"]: row for row in json.load(fh) if row["unit"] in ("MB", "MB/100 it")}


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    first, after = mb_rows(argv[0]), mb_rows(argv[1])
    if not first or not after:
        print(f"no MB rows in {argv[0] if not first else argv[1]}", file=sys.stderr)
        return 2
    bad = 0
    for check, row in first.items():
        other = after.get(check)
        if other is None:
            print(f"MISSING after the rest: {check}")
            bad += 1
            continue
        held = "NVML" not in check
        for key in ("ours", "independent"):
            diff = abs(float(row[key]) - float(other[key]))
            verdict = ("agree" if diff <= 1.0 else "DISAGREE") if held else "(not held: the CUDA context)"
            bad += held and diff > 1.0
            print(f"{verdict}: {check} ({key}): {row[key]:.3f} first, {other[key]:.3f} after the rest ({diff:.3f} MB)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
