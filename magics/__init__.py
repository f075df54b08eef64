"""commlab's IPython magics (``%load_ext commlab``).

This folder (``magics/`` beside ``commlab/``) installs as ``commlab.magics``
(setuptools ``package-dir`` in pyproject.toml). Imported only by
``commlab.load_ipython_extension``: ranks never import IPython's magic machinery.
The world magics live in ``commlab.magics.dist``; other modules (``observe``,
``bench``, ``watch``) add theirs through a ``register(ipython)`` function. They use only the
public surface of ``commlab.engine``, ``commlab.topology``, ``commlab.bench`` and
``commlab.widgets``.
"""

from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from commlab.errors import install_notebook_tracebacks

    from . import bench, observe, watch
    from .dist import DistMagics

    ipython.register_magics(DistMagics)
    observe.register(ipython)  # %topology, %linkbench
    bench.register(ipython)  # %commbench
    watch.register(ipython)  # %dist_watch
    install_notebook_tracebacks(ipython)  # commlab's errors: the user's frames + the message
    _warm_up_plotly()


def _warm_up_plotly() -> None:
    """Import plotly's widget in the background: the first figure of a kernel otherwise
    waits ~8 s for that import (the import lock makes a later import wait for this one)."""
    import threading

    def load() -> None:
        try:
            import plotly.graph_objects  # noqa: F401
        except Exception:  # no plotly: the widgets say so when used
            pass

    threading.Thread(target=load, daemon=True, name="commlab-plotly-import").start()


def unload_ipython_extension(ipython) -> None:
    """Stop the running world (its processes end); the magics stay defined."""
    from commlab.engine import stop_world

    from . import watch

    watch.stop()
    stop_world()
