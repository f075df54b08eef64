"""commlab's IPython magics (``%load_ext commlab``).

This folder (``magics/`` beside ``commlab/``) installs as ``commlab.magics``
(setuptools ``package-dir`` in pyproject.toml). Imported only by
``commlab.load_ipython_extension``: ranks never import IPython's magic machinery.
The world magics live in ``commlab.magics.dist``; other modules (``observe``,
``bench``) add theirs through a ``register(ipython)`` function. They use only the
public surface of ``commlab.engine``, ``commlab.topology``, ``commlab.bench`` and
``commlab.widgets``.
"""

from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from . import bench, observe
    from .dist import DistMagics

    ipython.register_magics(DistMagics)
    observe.register(ipython)  # %topology, %linkbench
    bench.register(ipython)  # %commbench


def unload_ipython_extension(ipython) -> None:
    """Stop the running world (its processes end); the magics stay defined."""
    from commlab.engine import stop_world

    stop_world()
