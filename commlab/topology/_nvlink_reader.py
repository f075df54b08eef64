"""The process behind ``NvlinkSampler``: reads NVML's per-link NVLink counters.

    python -m commlab.topology._nvlink_reader '{"links": [[0, 0], [0, 1]], "interval": 0.1}'

Prints one JSON line per sample, ``{"t": monotonic seconds, "c": [[gpu, link, tx_kib,
rx_kib], ...]}``, and exits when its stdin reaches end of file or reads ``stop`` (the
sampler stopped, or the notebook kernel that started it died). NVML runs here rather
than in the notebook's kernel: on 2xH200 a sampling thread inside the kernel process
once died with "malloc(): corrupted top size" inside nvmlDeviceGetFieldValues, and a
crash in this process only ends the sampling (the sampler reports it).

``"source": "module:function"`` in the configuration replaces NVML with
``function(links) -> (read, close)`` (the tests drive the process plumbing this way).
"""

from __future__ import annotations

import importlib
import json
import select
import sys
import time

TX, RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX (KiB, cumulative)


def nvml_source(links: list[tuple[int, int]]):
    """(read, close) over NVML: read() -> [[gpu, link, tx_kib, rx_kib], ...]."""
    import pynvml

    pynvml.nvmlInit()
    by_gpu: dict[int, list[int]] = {}
    for g, lk in links:
        by_gpu.setdefault(g, []).append(lk)
    handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in by_gpu}

    def read() -> list[list[int]]:
        out = []
        for g, ids in by_gpu.items():
            fields = [(f, lk) for lk in ids for f in (TX, RX)]
            vals = pynvml.nvmlDeviceGetFieldValues(handles[g], fields)
            for k, lk in enumerate(ids):
                t, r = vals[2 * k], vals[2 * k + 1]
                if t.nvmlReturn == 0 and r.nvmlReturn == 0:
                    out.append([g, lk, int(t.value.ullVal), int(r.value.ullVal)])
        return out

    return read, pynvml.nvmlShutdown


def _source(spec: str | None):
    if not spec:
        return nvml_source
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    links = [tuple(x) for x in cfg["links"]]
    interval = float(cfg.get("interval", 0.1))
    try:
        read, close = _source(cfg.get("source"))(links)
    except Exception as e:
        print(f"cannot read NVLink counters: {e!r}", file=sys.stderr)
        return 2
    try:
        while True:
            sample = {"t": time.monotonic(), "c": read()}
            sys.stdout.write(json.dumps(sample) + "\n")
            sys.stdout.flush()
            ready, _, _ = select.select([sys.stdin], [], [], interval)
            if ready:
                line = sys.stdin.readline()
                if not line or line.strip() == "stop":
                    return 0
    except BrokenPipeError:  # the sampler went away: nothing to report to
        return 0
    finally:
        close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
