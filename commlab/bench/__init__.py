"""commlab's benchmark: every collective, commlab's algorithms next to NCCL (gloo on
CPU) and PyTorch's symmetric-memory ops, verified before timed.

From a shell (one process per GPU, or per CPU rank)::

    torchrun --nproc-per-node 2 -m commlab.bench --ops all_reduce --min 8 --max 1GiB \\
        --mode both --out bench/results

From Python, on every rank of a running world::

    from commlab import bench
    result = bench.run(ops=["all_reduce"], sizes=[8, 1 << 20], modes=("eager",))
    print(bench.format_table(result.records))

In a notebook: ``%commbench`` (commlab.magics.bench) draws the curves.

The overlapped GEMMs against NCCL + cuBLAS and PyTorch's fused ops (GPUs)::

    torchrun --nproc-per-node 2 -m commlab.bench.overlap --out bench/results
"""

from commlab.bench._impls import Impl, Prepared, implementations
from commlab.bench._plot import figure
from commlab.bench._records import (
    OPS,
    Record,
    bus_factor,
    device_name,
    fmt_bytes,
    format_table,
    git_commit,
    link_peak_gbps,
    load_records,
    machine_tag,
    parse_size,
    results_path,
    size_range,
    write_records,
)
from commlab.bench._runner import BenchResult, Failure, check, run
from commlab.bench._timing import (
    QUEUE_SLEEP_CYCLES,
    capture,
    time_back_to_back,
    time_per_call,
)

__all__ = [
    "OPS", "BenchResult", "Failure", "Impl", "Prepared", "Record", "bus_factor", "check",
    "figure", "format_table", "implementations", "link_peak_gbps", "load_records", "parse_size",
    "results_path", "run", "size_range", "write_records",
    # for device scripts (bench/): records' metadata, per-call device timing
    "QUEUE_SLEEP_CYCLES", "capture", "device_name", "fmt_bytes", "git_commit", "machine_tag",
    "time_back_to_back", "time_per_call",
]
