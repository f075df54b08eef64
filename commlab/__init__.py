"""commlab: GPU communication you can write, run, debug and see from a notebook.

    import commlab
    comm = commlab.init()                       # under torchrun, or in a %%distributed cell
    y = commlab.all_reduce(x)                   # Triton kernels over a symmetric heap
"""

from commlab import _interpreter

if _interpreter.decide():  # before any kernel is defined: CPU backend = Triton's interpreter
    _interpreter.install()  # its speed-ups, for every kernel (commlab's and the user's)

from commlab import elastic, trace, tuning  # noqa: E402,F401 (tuning: auto's measured tables)
from commlab import torch_backend as _torch_backend  # noqa: E402
from commlab.collectives import _hier as _hier  # noqa: E402 (registers the paths across hosts)
from commlab.collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    reduce_scatter,
)
from commlab.errors import (  # noqa: E402
    CollectiveTimeoutError,
    CommlabError,
    CommlabUsageError,
    DataRaceError,
    HeapFullError,
    RankLostError,
    RankMismatchError,
    WaitTimeoutError,
)
from commlab.racecheck import racecheck  # noqa: E402
from commlab.runtime import (  # noqa: E402
    Communicator,
    finalize,
    get_communicator,
    grow,
    init,
    shrink,
    symmetric_empty,
    symmetric_zeros,
    synchronize,
)

_torch_backend.register()  # dist.init_process_group("commlab"): nothing is built yet

__version__ = "0.1.0"

__all__ = [
    "CollectiveTimeoutError", "CommlabError", "CommlabUsageError", "Communicator",
    "DataRaceError", "WaitTimeoutError", "racecheck",
    "HeapFullError", "RankLostError", "RankMismatchError", "all_gather", "all_reduce", "all_to_all",
    "barrier", "broadcast", "elastic", "finalize", "get_communicator", "grow", "init",
    "reduce_scatter", "shrink", "symmetric_empty", "symmetric_zeros", "synchronize", "trace",
]


_LAZY = {  # heavier parts, imported on first use
    "ag_gemm": ("commlab.overlap", "ag_gemm"),
    "gemm_rs": ("commlab.overlap", "gemm_rs"),
    "tune": ("commlab.tuning", "tune"),
    "watch": ("commlab.torch_backend.watch", "watch"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'commlab' has no attribute {name!r}")


def load_ipython_extension(ipython):  # %load_ext commlab
    """Register commlab's magics (imported lazily: workers never need IPython)."""
    from commlab.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython):
    from commlab.magics import unload_ipython_extension as _unload

    _unload(ipython)
