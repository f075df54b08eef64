"""commlab's IPython magics (``%load_ext commlab``).

Imported only by ``commlab.load_ipython_extension``: workers never import IPython's
magic machinery. The world magics live in ``commlab.magics.dist``; other modules
(``observe``, ``bench``) add theirs through a ``register(ipython)`` function.
"""

from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from commlab.magics import bench, observe
    from commlab.magics.dist import DistMagics

    ipython.register_magics(DistMagics)
    observe.register(ipython)  # %topology, %linkbench
    bench.register(ipython)  # %commbench


def unload_ipython_extension(ipython) -> None:
    """Stop the running world (its processes end); the magics stay defined."""
    from commlab.engine import _world

    if _world._CURRENT is not None:
        _world._CURRENT.stop()
