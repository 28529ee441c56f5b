"""A second process for the tests: an engine that registers a buffer filled
with a known pattern, exports it, and answers commands on stdin.

Prints "ready ADDRESS HANDLE LENGTH", then per line of stdin:
  sum         -> "sum <sha256 of the buffer>"
  notes       -> "notes <count> <first message, or ->"
  stop        -> SIGSTOPs itself (the test continues it)
  quit        -> closes the engine and exits
"""
import hashlib
import os
import signal
import sys

import numpy as np

import baton


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 131 + seed) & 0xFF).astype(np.uint8)


def main():
    n = int(sys.argv[1])
    buf = pattern(n, 7)
    with baton.Engine() as engine:
        region = engine.register(buf)
        engine.export(region)
        print(f"ready {engine.address} {region.handle} {region.length}", flush=True)
        notes = []
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "sum":
                print("sum " + hashlib.sha256(buf.tobytes()).hexdigest(), flush=True)
            elif cmd == "notes":
                notes += engine.take_notifications()
                first = notes[0][1].decode() if notes else "-"
                print(f"notes {len(notes)} {first}", flush=True)
            elif cmd == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif cmd == "quit":
                break


if __name__ == "__main__":
    main()
