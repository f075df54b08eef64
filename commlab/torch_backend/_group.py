"""``CommlabProcessGroup``: torch.distributed's process-group interface on commlab.

A group that spans the whole world runs the collectives in ``_native`` on the
process's one Communicator (built at its first collective, or by ``commlab.init()``);
everything else goes to the ``Fallback`` group of the same ranks. Argument errors are
raised before anything runs, like torch's own backends.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d  # has AllgatherOptions (dist lacks it)
from torch._C._autograd import _profiler_enabled

from commlab.runtime._control import CALL_TIMEOUT
from commlab.torch_backend import _build, _native, _profile
from commlab.torch_backend._fallback import Fallback
from commlab.torch_backend._reduce import op_name
from commlab.torch_backend._traced import CALL as _CALL
from commlab.torch_backend._traced import ROUTES
from commlab.torch_backend._traced import route as _route
from commlab.torch_backend._traced import traced as _traced
from commlab.torch_backend._work import FINISHED, completed
from commlab.trace import RECORDER as _RECORDER

_STRIDED = torch.strided
_ALLREDUCE = ("kernel", "allreduce")  # allreduce's ROUTES key


class CommlabProcessGroup(dist.ProcessGroup):
    """The "commlab" backend's group (made by ``dist.init_process_group("commlab")`` or
    ``dist.new_group(ranks, backend="commlab")``)."""

    def __init__(self, store, rank: int, size: int, timeout, *, spans_world: bool,
                 is_default: bool):
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch stubs lack the (rank, size) overload (torch 2.13)
        self.spans_world = spans_world  # False: every op goes to the fallback
        self.is_default = is_default  # the default group: it closes the Communicator
        self.fallback = Fallback(store, rank, size, timeout)
        # the limit of every wait of this group's native calls (agreement, the lazy
        # build, kernels' host waits); torch's default (no timeout given): commlab's own
        self.timeout_s = (None if timeout is None or timeout == dist.default_pg_timeout
                          else timeout.total_seconds())
        self._name = ""
        self._desc = ""
        self._comm = None
        self._on = "cpu"  # the device type of _comm's tensors (set with _comm)
        self.retired = ""  # why every call raises: commlab.shrink() made a new group
        # commlab's all-reduce algorithm for this group's all_reduce calls ("auto",
        # "one_shot", "two_shot", "ring"); set it on every rank, between calls
        self.all_reduce_algorithm = "auto"

    # -- identity (DDP and DeviceMesh read these) ---------------------------------------
    def getBackendName(self) -> str:
        return "commlab"

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    # -- routing ------------------------------------------------------------------------
    def communicator(self):
        """The Communicator the native ops run on (built on first use, collectively)."""
        comm = self._comm
        if comm is None or comm.closed:
            from commlab.runtime import current_communicator

            call = _CALL.call
            comm = current_communicator() or _build.build(
                call[0] if call else "communicator", self.timeout_s or _default_timeout())
            self._comm, self._on = comm, comm.device.type
        return comm

    def _native(self, *tensors):
        """The Communicator when these tensors (and lists of them) run on commlab's kernels,
        else None (a one-list method passes it unpacked: checked inline, 0.15 us less, CPU)."""
        if not self.spans_world:
            return None
        comm = self._comm
        if comm is None or comm.closed:
            comm = self.communicator()
        cuda = self._on == "cuda"
        for x in tensors:  # _dense_on, its top level inlined
            if isinstance(x, torch.Tensor):
                if not (x.is_cuda if cuda else x.is_cpu) or x.layout is not _STRIDED:
                    return None
            elif isinstance(x, (list, tuple)) and not _dense_on(self._on, x):
                return None
        return comm

    def _done(self, result, comm, opts):
        """The Work of a call that ran on commlab's kernels (and its profiler event). A
        blocking call (``opts.asyncOp`` False: torch only calls its ``wait()``, and the
        kernels have finished or are queued on the caller's stream) gets the one shared
        finished Work."""
        call = _CALL.call
        if call is not None:
            ROUTES[call[4]] += 1
            if call[5]:
                _, event, inputs, args = call[:4]
                _profile.record(f"commlab:{event}", _flat(inputs(args)))
        if opts is not None and not opts.asyncOp:
            return FINISHED  # the kernels are on the caller's stream: nothing to wait for
        return completed(result, comm.device)

    def _fb(self, *tensors):
        """The fallback group for these tensors' device (counted as a fallback call)."""
        call = _route("fallback")
        pg = self.fallback.for_tensors(*tensors)
        if call is not None and _profile.enabled():  # its Works carry commlab's name
            return _profile.Titled(pg, f"commlab:{call[1]}")
        return pg

    # -- native where commlab has the op ------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """``dist.all_reduce``'s common call in one frame: a built group, options given, no
        profiler or trace, strided tensors on its device (issue 29 item 3: 4.1 us a call
        over a no-op runner against 5.0 through ``_traced``, CPU); the rest: ``_allreduce``."""
        comm = self._comm
        if (opts is None or self.retired or _profiler_enabled() or _RECORDER.active
                or comm is None or comm.closed or not self.spans_world):
            return self._allreduce(tensors, opts)
        cuda = self._on == "cuda"
        for t in tensors:  # _native's check
            if (not isinstance(t, torch.Tensor) or not (t.is_cuda if cuda else t.is_cpu)
                    or t.layout is not _STRIDED):
                return self._allreduce(tensors, opts)
        name = op_name(opts.reduceOp)
        limit = CALL_TIMEOUT[0]  # _traced's timeout; _CALL is read only off this path
        CALL_TIMEOUT[0] = self.timeout_s
        try:
            algorithm = self.all_reduce_algorithm
            for t in tensors:
                _native.all_reduce_(comm, t, name, algorithm)
        finally:
            CALL_TIMEOUT[0] = limit
        ROUTES[_ALLREDUCE] += 1
        return FINISHED if not opts.asyncOp else completed(tensors, comm.device)

    @_traced("all_reduce")
    def _allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        comm = self._native(*tensors)
        if comm is None:
            return self._fb(tensors).allreduce(tensors, opts)
        name = op_name(opts.reduceOp)
        for t in tensors:
            _native.all_reduce_(comm, t, name, self.all_reduce_algorithm)
        return self._done(tensors, comm, opts)

    @_traced("all_reduce")
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        comm = self._native(*tensors)
        if comm is None:
            return self._fb(tensors).allreduce_coalesced(tensors, opts)
        name = op_name(opts.reduceOp)
        for t in tensors:
            _native.all_reduce_(comm, t, name, self.all_reduce_algorithm)
        return self._done(tensors, comm, opts)

    @_traced("broadcast")
    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        comm = self._native(*tensors)
        if comm is None:
            return self._fb(tensors).broadcast(tensors, opts)
        for t in tensors:
            _native.broadcast_(comm, t, opts.rootRank)
        return self._done(tensors, comm, opts)

    @_traced("all_gather", lambda a: a[1])
    def allgather(self, output_lists, inputs, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        comm = self._native(output_lists, inputs)
        if comm is None:
            return self._fb(inputs).allgather(output_lists, inputs, opts)
        for outs, inp in zip(output_lists, inputs, strict=True):
            _native.all_gather_list_(comm, outs, inp)
        return self._done(output_lists, comm, opts)

    @_traced("all_gather_into_tensor", lambda a: [a[1]])
    def all_gather_single(self, output, inp, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        comm = self._native(output, inp)
        if comm is None:
            return self._fb(inp)._allgather_base(output, inp, opts)
        _native.all_gather_into_(comm, output, inp)
        return self._done([output], comm, opts)

    _allgather_base = all_gather_single

    @_traced("all_gather_into_tensor_coalesced", lambda a: a[1])
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        comm = self._native(outputs, inputs)
        if comm is None:
            pg = self._fb(inputs)
            return pg.allgather_into_tensor_coalesced(outputs, inputs, opts)
        for out, inp in zip(outputs, inputs, strict=True):
            _native.all_gather_into_(comm, out, inp)
        return self._done(outputs, comm, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_traced("reduce_scatter", lambda a: a[1])
    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        comm = self._native(outputs, input_lists)
        if comm is None:
            pg = self._fb(outputs)
            return pg.reduce_scatter(outputs, input_lists, opts)
        name = op_name(opts.reduceOp)
        for out, ins in zip(outputs, input_lists, strict=True):
            if len(ins) != comm.world_size:
                _native.check(comm, "reduce_scatter",
                              f"reduce_scatter: input list has {len(ins)} tensors; pass "
                              f"world size ({comm.world_size}) tensors")
            flat = torch.cat([t.reshape(-1) for t in ins])
            _native.reduce_scatter_into_(comm, out, flat, name)
        return self._done(outputs, comm, opts)

    @_traced("reduce_scatter_tensor", lambda a: [a[1]])
    def reduce_scatter_single(self, output, inp, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        comm = self._native(output, inp)
        if comm is None:
            return self._fb(inp)._reduce_scatter_base(output, inp, opts)
        _native.reduce_scatter_into_(comm, output, inp, op_name(opts.reduceOp))
        return self._done([output], comm, opts)

    _reduce_scatter_base = reduce_scatter_single

    @_traced("reduce_scatter_tensor_coalesced", lambda a: a[1])
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        comm = self._native(outputs, inputs)
        if comm is None:
            pg = self._fb(inputs)
            return pg.reduce_scatter_tensor_coalesced(outputs, inputs, opts)
        name = op_name(opts.reduceOp)
        for out, inp in zip(outputs, inputs, strict=True):
            _native.reduce_scatter_into_(comm, out, inp, name)
        return self._done(outputs, comm, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_traced("all_to_all", lambda a: [a[1]])
    def all_to_all_single(self, output, inp, output_splits, input_splits, opts=None):
        opts = opts or dist.AllToAllOptions()
        comm = self._native(output, inp)
        if comm is None or (output_splits or input_splits) and not (
                _even(output_splits, output, self.size())
                and _even(input_splits, inp, self.size())):
            pg = self._fb(inp)
            return pg.alltoall_base(output, inp, output_splits, input_splits, opts)
        _native.all_to_all_even_(comm, output, inp)
        return self._done([output], comm, opts)

    alltoall_base = all_to_all_single

    @_traced("all_to_all", lambda a: a[1])
    def alltoall(self, outputs, inputs, opts=None):
        opts = opts or dist.AllToAllOptions()
        comm = self._native(outputs, inputs)
        sizes = {(t.numel(), t.dtype) for t in [*outputs, *inputs]}
        if comm is None or len(sizes) != 1:
            return self._fb(inputs).alltoall(outputs, inputs, opts)
        out = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype,
                          device=outputs[0].device)
        _native.all_to_all_even_(comm, out, torch.cat([t.reshape(-1) for t in inputs]))
        for o, piece in zip(outputs, out.chunk(len(outputs)), strict=True):
            o.copy_(piece.view(o.shape))
        return self._done(outputs, comm, opts)

    @_traced("barrier", lambda a: [])
    def barrier(self, opts=None):
        comm = self._native()
        if comm is None:
            return self._fb().barrier(opts or dist.BarrierOptions())
        from commlab.collectives import barrier

        barrier()
        return self._done([], comm, opts)

    # -- through the fallback group -----------------------------------------------------
    @_traced("send")
    def send(self, tensors, dst: int, tag: int = 0):
        return self._fb(tensors).send(tensors, dst, tag)

    @_traced("recv")
    def recv(self, tensors, src: int, tag: int = 0):
        return self._fb(tensors).recv(tensors, src, tag)

    @_traced("recvAnySource")
    def recv_anysource(self, tensors, tag: int = 0):
        return self._fb(tensors).recv_anysource(tensors, tag)

    # -- to or from one rank: commlab's kernels move it to every rank ------------------
    @_traced("reduce")
    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        comm = self._native(*tensors)
        if comm is None:
            return self._fb(tensors).reduce(tensors, opts)
        name = op_name(opts.reduceOp)
        for t in tensors:
            _native.reduce_(comm, t, name, opts.rootRank, self.all_reduce_algorithm)
        return self._done(tensors, comm, opts)

    @_traced("gather", lambda a: a[1])
    def gather(self, output_lists, inputs, opts=None):
        opts = opts or dist.GatherOptions()
        comm = self._native(output_lists, inputs)
        if comm is None:
            return self._fb(inputs).gather(output_lists, inputs, opts)
        for i, inp in enumerate(inputs):
            outs = output_lists[i] if i < len(output_lists) else []
            _native.gather_(comm, outs, inp, opts.rootRank)
        return self._done(output_lists, comm, opts)

    @_traced("scatter", lambda a: a[1] if a[1] else a[0])
    def scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ScatterOptions()
        comm = self._native(outputs, input_lists)
        if comm is None:
            return self._fb(outputs).scatter(outputs, input_lists, opts)
        for i, out in enumerate(outputs):
            ins = input_lists[i] if i < len(input_lists) else []
            _native.scatter_(comm, out, ins, opts.rootRank)
        return self._done(outputs, comm, opts)

    @_traced("all_gather", lambda a: a[1])
    def allgather_coalesced(self, output_lists, inputs, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        comm = self._native(output_lists, inputs)
        if comm is None:
            return self._fb(inputs).allgather_coalesced(output_lists, inputs, opts)
        W = comm.world_size
        if len(output_lists) != W or any(len(o) != len(inputs) for o in output_lists):
            _native.check(comm, "all_gather_coalesced",
                          f"all_gather_coalesced: pass world size ({W}) output lists of "
                          f"{len(inputs)} tensors each (one per input)")
        for i, inp in enumerate(inputs):
            _native.all_gather_list_(comm, [o[i] for o in output_lists], inp)
        return self._done(output_lists, comm, opts)

    @_traced("monitored_barrier", lambda a: [])
    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False):
        return self._fb().monitored_barrier(timeout, wait_all_ranks)

    def shutdown(self) -> None:
        """``dist.destroy_process_group()``: close the fallback, and the Communicator when
        this group made it (a later ``init_process_group`` builds a fresh one)."""
        if self._comm is not None and self.is_default:
            from commlab.runtime import finalize

            finalize()
            self._comm = None
        self.fallback.shutdown()

    def abort(self) -> None:
        self.shutdown()

    def retire(self, why: str) -> None:
        """Every later call raises CommlabUsageError(``why``); the Communicator lives on
        (``commlab.shrink()`` carries it over to the survivors' group)."""
        self.retired, self._comm, self.is_default = why, None, False


def _default_timeout() -> float:
    from commlab import _config

    return float(_config.get("COMMLAB_TIMEOUT"))


def _flat(items) -> list:
    return list(_tensors(items))


def _tensors(items):
    for x in items:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _tensors(x)


def _dense_on(kind: str, items) -> bool:
    """Whether every tensor in ``items`` (nested lists) is strided on device type ``kind``
    ("cpu" or "cuda", a Communicator's; sparse tensors are gloo's)."""
    cuda = kind == "cuda"
    for x in items:
        if isinstance(x, torch.Tensor):
            if not (x.is_cuda if cuda else x.is_cpu) or x.layout is not _STRIDED:
                return False
        elif isinstance(x, (list, tuple)) and not _dense_on(kind, x):
            return False
    return True


def _even(splits, t: torch.Tensor, world: int) -> bool:
    if not splits:
        return True
    return len(set(splits)) == 1 and len(splits) == world
