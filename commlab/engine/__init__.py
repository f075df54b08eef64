"""The notebook engine: a world of ranks as ipyparallel engines, driven by the magics.

    from commlab.engine import current_world, restart_world, start_world, stop_world
    w = start_world(4, backend="cpu")           # what %dist_start -n 4 does
    w.apply(lambda: __import__("commlab").get_communicator().rank)   # [0, 1, 2, 3]
    w.run_cell(numbered("print(rank)", 5))      # what %%distributed does in cell In[5]
    w.push({"lr": 0.1}); w.pull("lr")           # %dist_push lr, %dist_pull lr -> [0.1, ...]
    restart_world(); stop_world()               # %dist_restart, %dist_stop

This is the engine's whole public surface; the magics use nothing else.
"""

from commlab.engine._cell import numbered
from commlab.engine._report import DistributedError, HangError, RankDiedError
from commlab.engine._world import (
    RankInfo,
    World,
    current_world,
    restart_world,
    start_world,
    stop_world,
    world_or_none,
)

__all__ = ["DistributedError", "HangError", "RankDiedError", "RankInfo", "World",
           "current_world", "numbered", "restart_world", "start_world", "stop_world",
           "world_or_none"]
