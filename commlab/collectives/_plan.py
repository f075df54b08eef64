"""Launch plans: what a repeated collective call needs, computed once.

The first call with a given (op, shape, dtype, parameters) validates everything, agrees
with the other ranks, picks the algorithm and compiles the kernel. It leaves a Plan: the
agreement record (``ControlBlock.record``), the algorithm, outputs it owns
(``_outputs.Outputs``) and, when the call was a single launch on CUDA, the compiled
kernel bound to Triton's launcher with every argument but the input's and output's
addresses as integers (``_launcher.bind``; otherwise the plan runs the op's body, as on
the CPU backend). A later identical call publishes the record, takes an output, reads
the raw current stream and fires: a few Python calls. A call repeating the previous one
does not wait for the other ranks (``commlab.runtime._ahead``). The same steps run in C when
the C twin is built (``plan.entry``, ``commlab.runtime._fastcall``): ``fast_call`` asks
it first and carries on in Python whenever it declines; there the kernel goes out through
one ``cuLaunchKernel`` with a parameter block laid out once (``_rawlaunch``) where the
kernel's parameters allow it. Plans live on the
Communicator and die with it; ``COMMLAB_FAST_LAUNCH=0`` makes none.

Every check of the slow path still holds on this one: the key covers what the checks
read (a non-contiguous input takes the slow path), the record is compared with every
rank's (now or, ahead, at the next waiting call), racecheck and the wait records see the
same kernels, and a Triton launch hook (profiling) makes the plan launch through
``kernel[grid]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from commlab import _config
from commlab.collectives import _launcher, _outputs, _rawlaunch
from commlab.collectives._common import traced
from commlab.collectives._outputs import Outputs
from commlab.runtime import _ahead, _control, _native
from commlab.runtime import records as _records
from commlab.runtime._control import Record, Signature
from commlab.runtime._publish import SERVED as _SERVED
from commlab.trace import needed as _tracing
from commlab.trace._recorder import RECORDER as _RECORDER

_raw_stream = _launcher.raw_stream
_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)  # CPU builds
_LAUNCHES = _records.LAUNCHES


@dataclass
class Plan:
    sig: Signature
    raw: bytes
    algorithm: str
    nbytes: int
    compiled: object  # triton CompiledKernel, or None: run ``slow``
    grid: tuple
    tail: tuple  # kernel arguments after (x, out), constexprs included
    make_out: Callable[[torch.Tensor], torch.Tensor]
    slow: Callable[[torch.Tensor, torch.Tensor], object]  # the ordinary path
    record: Record | None = None  # the agreement's fixed record of ``raw``
    outputs: Outputs | None = None
    fire: Callable | None = None  # _launcher.bind: fire(stream, x_ptr, out_ptr, *ints)
    ints: tuple = ()  # ``tail`` with tensors as their addresses (kept alive by ``tail``)
    device: int = -1  # CUDA device index (raw stream), -1 on CPU
    x_aligned: bool = True  # compiled for a 16-byte aligned input
    book: _records.Book | None = None  # the communicator's call records (None: off)
    dtype: str = ""  # the input's dtype as call records name it
    entry: Any = None  # the C twin of a repeated call (runtime._native), None: Python
    capture_choice: bool = False  # "auto" chooses afresh inside a CUDA-graph capture

    def retire(self) -> None:
        """The plan left its communicator: its C entry serves no call again."""
        if self.entry is not None:
            self.entry.retire()


def fast_call(comm, key: tuple, x, out=None, dispatch: bool = True,
              budget=None) -> torch.Tensor | None:
    """Run the cached plan for ``key`` if there is one (into ``out`` when given); None
    means "take the slow path". ``dispatch``: a later call with the same arguments may go
    straight to the plan's C entry (``_publish.SERVED``); ``budget``: only the calls
    online selection grants it (``_adapt.pick``)."""
    try:
        plan = comm.plans.get(key)
    except TypeError:  # an unhashable parameter (op=["sum"]): the checks will refuse it
        return None
    if plan is None or not x.is_contiguous():
        return None
    _SERVED.append((plan.entry if dispatch else None, budget))
    if plan.entry is not None:  # the steady state in C; None: anything else, below
        y = plan.entry(x, out)
        if y is not None:
            return y
    comm.control.repeat(plan.record)
    if plan.device < 0:
        if out is None:
            out = plan.outputs.take(x, 0)
        with traced(plan.sig.op, plan.nbytes, plan.algorithm, comm.device, x, comm):
            _launch(plan, x, out)
        return out
    stream = _raw_stream(plan.device)
    if out is None:
        out = plan.outputs.take(x, stream, _is_capturing())
    xp, op = x.data_ptr(), out.data_ptr()
    # the kernel as built (aligned input and output), no launch hook, no trace or profiler
    if (plan.fire is None or (plan.x_aligned and xp % 16) or op % 16 or _launcher.hooked()
            or _tracing()):
        with traced(plan.sig.op, plan.nbytes, plan.algorithm, comm.device, x, comm):
            _launch(plan, x, out)
        return out
    # traced() inlined: no trace, no profiler; the kernel opens one call record
    plan.fire(stream, xp, op, *plan.ints)
    k1 = _LAUNCHES[0] = _LAUNCHES[0] + 1
    book = plan.book
    if book is not None:
        k1 -= book._base
        book.note(k1 - 1, k1, plan.sig.op, plan.algorithm, plan.nbytes, plan.dtype)
    return out


def build_entry(comm, plan: Plan) -> None:
    """Give ``plan`` its C entry (none with ``COMMLAB_NATIVE=0`` or without the module)."""
    plan.entry = None
    mode = _config.get("COMMLAB_NATIVE")  # True, False or "cpu" (that backend only)
    if mode is True or mode == "cpu" and comm.backend == "cpu":
        plan.entry = _entry(comm, plan, lambda x, out: _host_launch(comm, plan, x, out))
        if plan.entry is not None and plan.capture_choice:
            plan.entry.set_capture_choice(True)


def _host_launch(comm, plan: Plan, x: torch.Tensor, out: torch.Tensor) -> None:
    """A CPU plan's launch under its span (the C twin calls it after the agreement)."""
    with traced(plan.sig.op, plan.nbytes, plan.algorithm, comm.device, x, comm):
        _launch(plan, x, out)


def _launch(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> None:
    if plan.compiled is None or x.data_ptr() % 16 or out.data_ptr() % 16:
        plan.slow(x, out)  # no single kernel, or not the alignment it was built for
    else:
        plan.compiled[plan.grid](x, out, *plan.tail)  # type: ignore[index]
        _records.launched()  # a plan's one launch is an SM kernel: it writes a record


def _drain(comm, plan: Plan, shape, dtype) -> None:
    """The plan's kernel on zeros: a peer that ran this call ahead needs its partner."""
    x = torch.zeros(shape, dtype=dtype, device=comm.device)
    _launch(plan, x, plan.make_out(x))


def remember(comm, key: tuple | None, call, *, algorithm: str, nbytes: int, launched: list,
             make_out, slow, x=None, out=None, capture_choice: bool = False) -> None:
    """Keep a plan after a slow-path call every rank agreed on; with its compiled kernel
    when the call made exactly one CUDA launch, on ``x`` and ``out`` themselves.

    ``launched`` holds (compiled, grid, args, consts) of every launch the call made."""
    if key is None or call.sig is None or call.sig.error or not _config.get("COMMLAB_FAST_LAUNCH"):
        return
    compiled, grid, tail = None, (), ()
    if comm.backend == "cuda" and len(launched) == 1 and launched[0][0] is not None:
        compiled, grid, args, consts = launched[0]
        if not _same(args[0], x) or not _same(args[1], out):
            compiled = None  # the launch was not on (x, out): the body runs each time
        else:
            grid, tail = (tuple(grid) + (1, 1))[:3], tuple(args[2:]) + tuple(consts.values())
    raw = call.sig.encode()
    plan = Plan(call.sig, raw, algorithm, nbytes, compiled, grid, tail, make_out, slow,
                record=comm.control.record(call.sig, raw), outputs=Outputs(make_out))
    if comm.backend == "cuda":
        plan.device = comm.device.index if comm.device.index is not None else 0
        plan.book = _records.book(comm)
        plan.dtype = str(key[2]).replace("torch.", "")
        if compiled is not None:
            _bind(plan, x)
    plan.capture_choice = capture_choice and key[-1] == "auto"
    build_entry(comm, plan)
    comm.plans[key] = plan
    shape, dtype = key[1], key[2]
    comm.control.ahead.allow(plan.raw, lambda: _drain(comm, plan, shape, dtype))


def _same(a, t) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(t, torch.Tensor)
            and a.data_ptr() == t.data_ptr())


def _bind(plan: Plan, x) -> None:
    """Bind the compiled kernel to Triton's launcher with integer arguments."""
    _, fire = _launcher.bind(plan.compiled, plan.grid)
    if fire is None:
        return
    plan.ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in plan.tail)
    plan.x_aligned = x.data_ptr() % 16 == 0
    plan.fire = fire


def _entry(comm, plan, host_launch):
    """The C twin of ``plan``'s repeated call, or None (no C module, an agreement other
    than one host's block, or a GPU plan without a bound launcher). ``host_launch(x,
    out)``: the plan's launch on the CPU backend."""
    mod = _native.module()
    block = comm.control
    if (mod is None or type(block) is not _control.ControlBlock or plan.record is None
            or plan.outputs is None):
        return None
    state = block._state(0) >> 3  # the words after every rank's slots: ranks' state areas
    layout = (block.RING, block.SLOT_WORDS, state, (block._state(1) >> 3) - state,
              block.checked_word, block.rank)
    outs = plan.outputs
    common = (block, plan.record, tuple(block.peers), _ahead.SYNC_HOOK, _ahead.CALLER, layout,
              (outs.tensors, outs.storages, outs.slots), outs.take, _outputs.REUSE,
              _outputs._use_storage, _native.free_refs(mod))
    tracing = (_RECORDER, torch.autograd._profiler_enabled)  # trace.needed's two tests
    hooked, launches = _launcher.hooked, _records.LAUNCHES
    tail = (plan.sig.op, plan.algorithm, plan.nbytes, plan.dtype)
    if plan.device < 0:
        return mod.Entry(*common, -1, host_launch, (), (), (), (), True, int, bool, hooked,
                         *tracing, launches, None, tail)
    parts = getattr(plan.fire, "parts", None)
    if parts is None:
        return None
    launcher, before, middle, after = parts
    entry = mod.Entry(*common, plan.device, launcher, tuple(before), tuple(middle), tuple(after),
                      tuple(plan.ints), plan.x_aligned, _raw_stream, _is_capturing, hooked,
                      *tracing, launches, plan.book, tail)
    raw = _rawlaunch.spec(plan.compiled, plan.grid, plan.ints)
    if raw is not None:  # one cuLaunchKernel per call instead of Triton's launcher
        entry.set_raw(raw.function, raw.grid, raw.block, raw.shared, raw.values, raw.driver,
                      plan.compiled)
    return entry
