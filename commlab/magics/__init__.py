"""commlab's IPython magics (``%load_ext commlab``).

Imported only by ``commlab.load_ipython_extension``: workers never import IPython's
magic machinery. The world magics live in ``commlab.magics.dist``; other modules
(``observe``, ``bench``) add theirs through a ``register(ipython)`` function.
"""

from __future__ import annotations

import importlib

_EXTRA = ("commlab.magics.observe", "commlab.magics.bench")


def load_ipython_extension(ipython) -> None:
    from commlab.magics.dist import DistMagics

    ipython.register_magics(DistMagics)
    for name in _EXTRA:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # not written yet; a missing dependency inside still raises
                continue
            raise
        mod.register(ipython)


def unload_ipython_extension(ipython) -> None:
    """Stop the running world (its processes end); the magics stay defined."""
    from commlab.engine import _world

    if _world._CURRENT is not None:
        _world._CURRENT.stop()
