"""Triton-interpreter support: everything commlab does only when kernels run on the CPU.

Layer L0: imports Triton and numpy, never ``commlab.runtime`` or anything above it.

- ``choose``: turn the interpreter on at ``import commlab`` (``decide``, ``interpreting``)
- ``fastcall``: nested ``@triton.jit`` calls skip Triton's per-call re-patching
- ``memory``: the six memory-access builder methods, with an observer hook (racecheck)
- ``fastmem``: symbolic index blocks (``blocks``) and slice-copy loads/stores, checked
  against the stock builder (``selfcheck``, ``stock``) at install
- ``triton_lib``: re-wrap ``@jit`` helpers decorated before the interpreter was chosen
- ``observe``: launch and program hooks a checker registers with (no import upward)
- ``host``: host-side help for the device language's spin-waits (yield, poll a flag)
- ``compat``: what differs between Triton releases' interpreters (3.6's ``__index__``)

``install()`` replaces the access methods and turns on both speed-ups;
``commlab/__init__.py`` calls it right after ``decide()``, before any kernel is defined.
Env vars: ``COMMLAB_BACKEND`` (choose), ``COMMLAB_INTERPRETER_FASTCALL=0`` and
``COMMLAB_INTERPRETER_FASTMEM=0`` (off switches).
"""

from __future__ import annotations

from commlab._interpreter.choose import decide, interpreting


def install() -> None:
    """Speed up Triton's interpreter for every kernel (commlab's and the user's)."""
    from commlab._interpreter import compat, fastcall, fastmem, memory, observe

    memory.install()  # every load, store and atomic through one hookable function each
    fastcall.install()
    observe.install()  # launch and program hooks (racecheck), outside fastcall's launch
    compat.install()  # before fastmem, which takes it for the stock patches (and keeps
    fastmem.install()  # it when it puts them back); symbolic blocks, slice copies


__all__ = ["decide", "install", "interpreting"]
