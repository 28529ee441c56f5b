#!/usr/bin/env python3
"""Raw host <-> GPU copies in slices, as the CUDA transport posts them.

Pinned host memory <-> device, one event per copy, over 1, 2 or 4 streams:
what the copy engine gives each slice size without Baton, a single idle
256 KiB copy's latency, and whether a copy on its own stream overtakes
copies queued on another. Needs PyTorch with CUDA (the GPU machine's
python3). Usage: scripts/gpu-copy-engine.py (or .gpu/gpu-copy-engine.py).
Slices below 1 MiB are limited by Python's call rate (~20 us a copy), not
by the copy engine.
"""
import argparse
import time

TOTAL = 1 << 30


def rate(slice_bytes, nstreams, events=True, direction="h2d"):
    streams = [torch.cuda.Stream() for _ in range(nstreams)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    keep = []
    for i in range(TOTAL // slice_bytes):
        s = streams[i % nstreams]
        a, b = i * slice_bytes, (i + 1) * slice_bytes
        with torch.cuda.stream(s):
            if direction == "h2d":
                dev[a:b].copy_(host[a:b], non_blocking=True)
            else:
                host[a:b].copy_(dev[a:b], non_blocking=True)
            if events:
                e = torch.cuda.Event()
                e.record(s)
                keep.append(e)
    torch.cuda.synchronize()
    return TOTAL / (time.perf_counter() - t) / 1e9


def percentiles(samples, *ps):
    samples = sorted(samples)
    return [samples[int(p / 100 * len(samples))] for p in ps]


def main():
    for direction in ("h2d", "d2h"):
        for kib in (64, 256, 512, 1024, 2048, 4096):
            sb = kib << 10
            row = " ".join(f"{rate(sb, n, direction=direction):6.1f}" for n in (1, 2, 4))
            print(f"{direction} slice {kib:5d} KiB  streams 1/2/4: {row} GB/s"
                  f"  (no events, 1 stream: {rate(sb, 1, False, direction):.1f})", flush=True)

    small = 256 << 10
    s = torch.cuda.Stream()
    lat = []
    for _ in range(2000):
        t = time.perf_counter()
        with torch.cuda.stream(s):
            dev[:small].copy_(host[:small], non_blocking=True)
        s.synchronize()
        lat.append((time.perf_counter() - t) * 1e6)
    p50, p95, p99 = percentiles(lat, 50, 95, 99)
    print(f"one 256 KiB h2d + synchronize: p50 {p50:.1f} us  p95 {p95:.1f} us  p99 {p99:.1f} us")

    bulk, urgent = torch.cuda.Stream(), torch.cuda.Stream()
    lat = []
    for _ in range(200):
        with torch.cuda.stream(bulk):
            for k in range(1, 9):
                dev[k << 21:(k + 1) << 21].copy_(host[k << 21:(k + 1) << 21], non_blocking=True)
        time.sleep(0.00002)
        t = time.perf_counter()
        with torch.cuda.stream(urgent):
            dev[:small].copy_(host[:small], non_blocking=True)
        urgent.synchronize()
        lat.append((time.perf_counter() - t) * 1e6)
        bulk.synchronize()
    p50, p95 = percentiles(lat, 50, 95)
    print(f"256 KiB on its own stream behind 16 MiB of queued bulk: p50 {p50:.1f} us  p95 {p95:.1f} us")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    # After the arguments: --help needs neither PyTorch nor a GPU.
    import torch
    host = torch.empty(TOTAL, dtype=torch.uint8).pin_memory()
    dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda")
    main()
