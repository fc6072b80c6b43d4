"""This machine's speed at the suite's kind of work, for make test's phase table (scripts/test.sh).

The project's machines are shared virtual machines, and their speed moves: on 2026-12-07 the same
2-core Xeon ran the same jobs at about half speed for at least an hour and a half (`make train`
4,864 and 5,106 images/s at 13:20 UTC against 9,124 to 9,273 that morning; a PyTorch fp16 digits
job 56 and 61 core-seconds against 38), with no steal time in /proc/stat. A run's minutes say
little without its machine's speed, so `make test` measures it before its tiers and after them,
on the idle machine (docs/development.md).

The measure is A8's bare loop (bench/trainer_overhead.py, bench/programs/bare_loop.py): the digits
CNN trained by the plainest PyTorch loop on DALI's pipeline, one process pinned to one core,
training images/s, the median over epochs 2..``--epochs``. About 10 s, mostly its imports.

Prints one JSON line: ``{"bare_loop_images_per_s": float, "epochs": int, "seconds": float}``.
Exits 1 with the reason on stderr when the loop cannot run (no DALI or torch in this Python), 2
on a bad flag.

Usage: ``python bench/machine_speed.py [--epochs 4]``.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import trainer_overhead


def measure(epochs: int) -> dict:
    """The bare loop's training images/s on the digits CNN (median over epochs 2..``epochs``),
    with ``epochs`` and the wall-clock seconds the measurement took.

    Raises:
        RuntimeError: the loop failed or printed fewer epochs than asked (trainer_overhead.run).
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dtc-speed-") as work:
        rate = trainer_overhead.run(Path(work), "digits-cnn", "bare-loop", epochs)
    return {"bare_loop_images_per_s": round(rate, 1), "epochs": epochs,
            "seconds": round(time.monotonic() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4, help="epochs of the loop; the median is over 2..N")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch (DALI's pipeline build) is not measured")
    try:
        print(json.dumps(measure(args.epochs)))
    except (RuntimeError, ImportError) as error:
        print(f"machine_speed: the bare loop did not run: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
