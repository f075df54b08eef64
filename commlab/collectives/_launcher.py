"""Launch a compiled Triton kernel with integer arguments, below ``kernel[grid]``.

A launch plan knows every argument of its kernel but the input's address, so it can skip
what ``CompiledKernel[grid](...)`` redoes on every call: the launch-metadata hook check,
``torch.cuda.current_stream()`` (4.2 us on the H200 host, against 0.09 us for
``torch._C._cuda_getCurrentRawStream``) and the launcher's Python wrapper. Measured on one
H200 (triton 3.6): ``kernel[grid]`` 11.0 us, ``CompiledKernel.run`` with integer pointers
3.9, Triton's C launcher called directly 3.3.

``bind`` returns ``fire(stream, *args)`` in one of two tiers, chosen once per kernel:

- "c": the C launcher itself, with the constant arguments of Triton's own call bound
  (read from the source of the launcher's ``__call__``: every argument must be a name
  this module knows or an attribute of the launcher, else this tier is not used);
- "run": ``CompiledKernel.run(grid, stream, function, metadata, None, None, None, *args)``,
  the launcher's stable Python signature (triton 3.2 to 3.9);

and None when neither shape is recognised (the caller keeps ``kernel[grid]``). ``fire.parts``
is (launcher, before, middle, after): ``fire(stream, *args)`` calls
``launcher(*before, stream, *middle, *args, *after)`` (the C fast path builds that tuple
itself), or None when the launcher takes the arguments as one tuple. While a
launch hook is installed (Proton, ``knobs.runtime.launch_enter_hook``) callers must use
the ordinary path: ``hooked()`` says so.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import warnings
from collections.abc import Callable

import torch

# names in the launcher's ``self.launch(...)`` call -> how ``fire`` fills them
_RUN_PARAMS = ("gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata",
               "launch_metadata", "launch_enter_hook", "launch_exit_hook")
_NONE_NAMES = {"launch_metadata", "launch_enter_hook", "launch_exit_hook", "global_scratch",
               "profile_scratch"}
_NOTED: set[str] = set()
TIERS: dict[str, int] = {"c": 0, "run": 0, "none": 0}  # plans bound per tier (tests, bench)
ALLOW = ["c", "run"]  # the tiers ``bind`` may use (the GPU check compares them)


def raw_stream(device_index: int) -> int:
    """The current CUDA stream of ``device_index`` as an integer handle (0.09 us)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


try:
    from triton import knobs as _knobs
except ImportError:  # triton before knobs (3.3): its hooks live on CompiledKernel
    _knobs = None


def hooked() -> bool:
    """Whether Triton has a launch hook installed (profiling): launch through kernel[grid]."""
    if _knobs is not None:
        hook = _knobs.runtime.launch_enter_hook  # None, a function, or (3.9) a HookChain
        return hook is not None and bool(getattr(hook, "calls", True))
    from triton.compiler import CompiledKernel

    return getattr(CompiledKernel, "launch_enter_hook", None) is not None


def _note(what: str) -> None:
    if what not in _NOTED:
        _NOTED.add(what)
        warnings.warn(f"commlab: {what}; eager calls take Triton's ordinary launch path "
                      f"(a few microseconds more per call)", RuntimeWarning, stacklevel=3)


def _runner(compiled) -> object | None:
    """The compiled kernel's launcher object (loads the module on first use)."""
    try:
        return compiled.run
    except Exception as e:  # noqa: BLE001 - any failure means: no fast path
        _note(f"CompiledKernel.run unavailable ({type(e).__name__}: {e})")
        return None


def _call_params(runner) -> int | None:
    """How many of ``_RUN_PARAMS`` the launcher's ``__call__`` names before its ``*args``
    (the rest travel inside ``*args``); None for any other signature."""
    try:
        params = list(inspect.signature(type(runner).__call__).parameters.values())
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params[1:]]
    if not params[1:] or params[-1].kind is not inspect.Parameter.VAR_POSITIONAL:
        return None
    named = names[:-1]
    if tuple(named) != _RUN_PARAMS[:len(named)] or len(named) < 5:
        return None
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[1:-1]):
        return None
    return len(named)


def _c_template(runner, star: str) -> list | None:
    """The arguments of the launcher's ``self.launch(...)`` call as a template: ("grid",
    i), ("stream",), ("function",), ("meta",), ("const", value), or ("args", starred)
    for ``*{star}`` (starred) / ``kernel_args`` (a tuple); None for anything else."""
    if (getattr(runner, "global_scratch_size", 0) or getattr(runner, "profile_scratch_size", 0)
            or getattr(runner, "gsan_enabled", False)):
        return None  # the launcher allocates or rewrites arguments per launch
    launch = getattr(runner, "launch", None)
    if launch is None or inspect.isfunction(launch) or inspect.ismethod(launch):
        return None  # absent, or wrapped in Python (tensor descriptors)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(runner).__call__)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "launch"
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]
    if len(calls) != 1 or calls[0].keywords:
        return None
    template: list = []
    for a in calls[0].args:
        if isinstance(a, ast.Starred) and isinstance(a.value, ast.Name) and a.value.id == star:
            template.append(("args", True))
        elif isinstance(a, ast.Name) and a.id in ("gridX", "gridY", "gridZ"):
            template.append(("grid", "XYZ".index(a.id[-1])))
        elif isinstance(a, ast.Name) and a.id in ("stream", "function"):
            template.append((a.id,))
        elif isinstance(a, ast.Name) and a.id == "kernel_metadata":
            template.append(("meta",))
        elif isinstance(a, ast.Name) and a.id in _NONE_NAMES:
            template.append(("const", None))
        elif isinstance(a, ast.Name) and a.id == "kernel_args":
            template.append(("args", False))
        elif (isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
              and a.value.id == "self" and hasattr(runner, a.attr)):
            template.append(("const", getattr(runner, a.attr)))
        else:
            return None
    kinds = [t[0] for t in template]
    if kinds.count("args") != 1 or kinds.count("stream") != 1:
        return None
    if kinds.index("stream") > kinds.index("args") or "grid" in kinds[kinds.index("args"):]:
        return None
    return template


def _c_fire(runner, template: list, grid: tuple, function: int, meta,
            extra: tuple) -> Callable:
    """``fire(stream, *args)`` calling the C launcher with ``template`` filled in;
    ``extra``: the launcher's own leading values of ``*args`` (metadata, hooks)."""
    launch = runner.launch

    def value(t):
        kind = t[0]
        return (grid[t[1]] if kind == "grid" else function if kind == "function"
                else meta if kind == "meta" else t[1] if kind == "const" else None)

    kinds = [t[0] for t in template]
    i_stream, i_args = kinds.index("stream"), kinds.index("args")
    before = tuple(value(t) for t in template[:i_stream])
    middle = tuple(value(t) for t in template[i_stream + 1:i_args])
    after = tuple(value(t) for t in template[i_args + 1:])
    if template[i_args][1]:  # *args
        def fire(stream, *args):
            launch(*before, stream, *middle, *extra, *args, *after)

        fire.parts = (launch, before, middle + extra, after)  # type: ignore[attr-defined]
    else:  # kernel_args: the tuple of kernel arguments

        def fire(stream, *args):
            launch(*before, stream, *middle, args, *after)

        fire.parts = None  # type: ignore[attr-defined]
    return fire


def bind(compiled, grid: tuple) -> tuple[str, Callable | None]:
    """(tier, ``fire(stream, *args)``) launching ``compiled`` on ``grid`` (3 ints); args
    as ``kernel[grid]`` takes them (constexprs included), pointers as integers."""
    runner = _runner(compiled)
    function = getattr(compiled, "function", None)
    meta = getattr(compiled, "packed_metadata", None)
    named = _call_params(runner) if runner is not None else None
    if runner is None or function is None or meta is None or named is None:
        TIERS["none"] += 1
        _note(f"unknown Triton launcher shape ({type(runner).__name__})")
        return "none", None
    gx, gy, gz = grid
    extra = (meta, None, None, None)[named - 5:]  # what *args receives before the kernel's
    star = list(inspect.signature(type(runner).__call__).parameters)[-1]
    template = _c_template(runner, star)
    if "c" in ALLOW and template is not None and (extra == () or template[[
            t[0] for t in template].index("args")][1]):
        TIERS["c"] += 1
        return "c", _c_fire(runner, template, (gx, gy, gz), function, meta, extra)

    if "run" not in ALLOW:
        TIERS["none"] += 1
        return "none", None

    def fire_run(stream, *args):
        runner(gx, gy, gz, stream, function, meta, None, None, None, *args)

    fire_run.parts = (runner, (gx, gy, gz), (function, meta, None, None, None), ())  # type: ignore[attr-defined]

    TIERS["run"] += 1
    return "run", fire_run
