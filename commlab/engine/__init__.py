"""The notebook engine: a world of ranks as ipyparallel engines, driven by the magics.

    from commlab.engine import start_world, current_world
    w = start_world(4, backend="cpu")           # what %dist_start -n 4 does
    w.apply(lambda: __import__("commlab").get_communicator().rank)   # [0, 1, 2, 3]
    w.run_cell("print(rank)")                   # what %%distributed does
    w.stop()
"""

from commlab.engine._report import DistributedError, HangError, RankDiedError
from commlab.engine._world import World, current_world, start_world

__all__ = ["DistributedError", "HangError", "RankDiedError", "World", "current_world",
           "start_world"]
