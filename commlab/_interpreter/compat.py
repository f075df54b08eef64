"""Differences between Triton releases' interpreters that would change results, mended.

Triton 3.6's interpreter turns a one-element block into a Python int with
``int(handle.data)``; numpy 2 refuses that for an array of shape (1,) (what ``tl.load``
of one address gives), so ``for i in range(1, world)`` over a loaded ``world`` raises.
Triton 3.9 squeezes first. ``install`` makes every release's ``__index__`` take the one
element; a block of several still raises, as in Triton.
"""

from __future__ import annotations


def _index(self) -> int:
    data = self.handle.data
    if getattr(data, "size", 0) == 1:
        return int(data.reshape(-1)[0])
    return int(data)  # several elements: the interpreter's own error


def install() -> None:
    """Wrap the interpreter's per-launch tensor patches; before ``fastmem``, which then
    takes this wrapper for Triton's own (its patch calls it, its uninstall restores it)."""
    import triton.runtime.interpreter as ti

    if getattr(ti._patch_lang_tensor, "_commlab_compat", False):
        return
    patch = ti._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patched._commlab_compat = True  # type: ignore[attr-defined]
    ti._patch_lang_tensor = patched
