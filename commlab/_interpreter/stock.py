"""The stock Triton-interpreter functions commlab replaces, captured once, before any patch.

``fastmem`` (index blocks) and ``memory`` (the six memory-access methods) both call
through here, so neither imports the other for it and ``uninstall`` can always put the
stock builder back.
"""

from __future__ import annotations

STOCK: dict = {}  # builder method (or module function) name -> the stock function


def base():
    """Triton's ``TensorHandle`` (the class every block handle is)."""
    from triton.runtime.interpreter import TensorHandle

    return TensorHandle


def capture(owner, name: str, module: bool = False):
    """The stock ``owner.name``, remembered the first time it is asked for."""
    if name not in STOCK:
        STOCK[name] = getattr(owner, name) if module else owner.__dict__[name]
    return STOCK[name]
