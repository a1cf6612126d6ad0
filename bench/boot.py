"""Figures, not pass/fail: stack boot time and one walking-skeleton session.

    python bench/boot.py [--repeat N]

Prints min/median/max of the embedded stack's boot (golden data directory cached) and
of its teardown, in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from qualify.stack import EmbeddedStack


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    boots, stops = [], []
    for _ in range(args.repeat):
        stack = EmbeddedStack()
        info = stack.start()
        boots.append(info.boot_s)
        t = time.monotonic()
        stack.stop()
        stops.append(time.monotonic() - t)
    for name, xs in (("boot_s", boots), ("teardown_s", stops)):
        print(f"{name}: min {min(xs):.3f} median {statistics.median(xs):.3f} max {max(xs):.3f}")


if __name__ == "__main__":
    main()
