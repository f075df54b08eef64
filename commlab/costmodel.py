"""An alpha-beta cost model of all-reduce algorithms, fit from measured records.

Each algorithm is described by two counts for a message of ``n`` bytes on ``W`` ranks:

    steps(W)         synchronisation rounds that cost a latency alpha each
    moved(n, W)      bytes through the busiest link of one rank

    time = alpha · steps(W) + moved(n, W) / beta

| algorithm  | steps      | moved          | why |
| ---------- | ---------- | -------------- | --- |
| one_shot   | 1          | n·(W−1)        | every rank reads every peer's whole input |
| two_shot   | 2          | 2n·(W−1)/W     | reduce-scatter then all-gather, direct |
| ring       | 2(W−1)     | 2n·(W−1)/W     | same volume, W−1 neighbour hops per phase |
| nccl_ring  | 2(W−1)     | 2n·(W−1)/W     | NCCL's ring |
| nccl_tree  | 2·log2(W)  | 2n             | NCCL's tree: reduce up, broadcast down |

``fit`` solves for alpha and beta per implementation by least squares on *relative*
error (sizes span eight decades), so both the latency plateau and the bandwidth slope
count. ``project`` applies the fitted constants to other machines: one NVLink domain
(8 GPUs behind NVSwitch keep each GPU's link bandwidth) or many nodes, where a ring or
tree crosses the network at ``inter_gbps`` per GPU with ``inter_alpha_us`` per step.
One-shot and two-shot need load/store access to every peer, so they stop at the edge
of the NVLink domain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MODELS = {  # name -> (steps(W), moved(n, W))
    "one_shot": (lambda w: 1, lambda n, w: n * (w - 1)),
    "two_shot": (lambda w: 2, lambda n, w: 2 * n * (w - 1) / w),
    "ring": (lambda w: 2 * (w - 1), lambda n, w: 2 * n * (w - 1) / w),
    "nccl_ring": (lambda w: 2 * (w - 1), lambda n, w: 2 * n * (w - 1) / w),
    "nccl_tree": (lambda w: 2 * math.ceil(math.log2(max(w, 2))), lambda n, w: 2 * n),
}
LOAD_STORE_ONLY = ("one_shot", "two_shot")  # need every peer in one NVLink domain


def model_of(impl: str) -> str | None:
    """Which model describes a benchmark impl ("commlab:two_shot" -> "two_shot")."""
    if impl in ("nccl", "gloo"):
        return "nccl_ring"
    algo = impl.split(":", 1)[-1]
    return algo if algo in MODELS else None


def predict_us(model: str, alpha_us: float, beta_gbps: float, nbytes: float, world: int) -> float:
    steps, moved = MODELS[model]
    return alpha_us * steps(world) + moved(nbytes, world) / (beta_gbps * 1e3)


@dataclass
class Fit:
    impl: str
    model: str
    alpha_us: float  # latency per step
    beta_gbps: float  # effective bandwidth of the busiest link, GB/s
    median_error: float  # |predicted − measured| / measured over the fitted points
    max_error: float
    points: int

    def predict_us(self, nbytes: float, world: int) -> float:
        return predict_us(self.model, self.alpha_us, self.beta_gbps, nbytes, world)


def fit_points(model: str, points) -> tuple[float, float]:
    """Least squares (relative error) for alpha [µs] and beta [GB/s] from
    (bytes, world, time_us) points; both kept positive."""
    steps, moved = MODELS[model]
    a = np.array([[steps(w), moved(n, w) / 1e3] for n, w, _ in points], dtype=float)
    t = np.array([p[2] for p in points], dtype=float)
    aw, tw = a / t[:, None], np.ones_like(t)  # divide each row by its time: relative error
    coef = np.linalg.lstsq(aw, tw, rcond=None)[0]
    if coef[0] <= 0 or coef[1] <= 0:  # one term does not show: fit the other alone
        col = 1 if coef[0] <= 0 else 0
        c = float(np.linalg.lstsq(aw[:, [col]], tw, rcond=None)[0][0])
        coef = np.array([0.0, max(c, 1e-12)] if col == 1 else [max(c, 0.0), 1e-12])
    alpha, inv_beta = float(coef[0]), float(coef[1])
    return alpha, 1.0 / inv_beta  # inv_beta is µs per KB = 1/(GB/s)


def fit(records, op: str = "all_reduce", mode: str = "eager", dtype: str | None = None,
        min_bytes: int = 0) -> dict[str, Fit]:
    """One Fit per implementation found in ``records`` (commlab.bench Records or dicts)."""
    groups: dict[str, list] = {}
    for r in records:
        r = r if isinstance(r, dict) else r.__dict__
        if r["op"] != op or r["mode"] != mode or (dtype and r["dtype"] != dtype):
            continue
        if r["bytes"] < min_bytes or model_of(r["impl"]) is None:
            continue
        groups.setdefault(r["impl"], []).append((r["bytes"], r["world_size"], r["time_us"]))
    fits = {}
    for impl, pts in sorted(groups.items()):
        model = model_of(impl)
        if len(pts) < 2 or model is None:  # the filter above kept only modelled impls
            continue
        alpha, beta = fit_points(model, pts)
        errs = [abs(predict_us(model, alpha, beta, n, w) - t) / t for n, w, t in pts]
        fits[impl] = Fit(impl, model, alpha, beta, float(np.median(errs)), max(errs), len(pts))
    return fits


# --- projection to machines we do not have ----------------------------------------


@dataclass
class Machine:
    name: str
    gpus: int
    gpus_per_node: int
    inter_gbps: float = 50.0  # network per GPU, GB/s (400 Gb/s InfiniBand = 50 GB/s)
    inter_alpha_us: float = 5.0  # per network step (assumed: IB hop + NCCL proxy)
    mesh_link_gbps: float | None = None  # fully connected node: one link per GPU pair, GB/s

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


NVSWITCH_8 = Machine("8 GPUs, NVSwitch", 8, 8)
# 8x MI300X: every pair on one xGMI link of 64 GB/s per direction (AMD's data sheet; the
# topology sample commlab/topology/data/8xmi300x-xgmi.json)
MI300X_8 = Machine("8x MI300X, xGMI mesh", 8, 8, mesh_link_gbps=64.0)


def multi_node(nodes: int, gpus_per_node: int = 8, inter_gbps: float = 50.0,
               inter_alpha_us: float = 5.0) -> Machine:
    return Machine(f"{nodes} nodes x {gpus_per_node} GPUs, IB {inter_gbps * 8:g} Gb/s/GPU",
                   nodes * gpus_per_node, gpus_per_node, inter_gbps, inter_alpha_us)


def project_us(f: Fit, machine: Machine, nbytes: float, model: str | None = None) -> float | None:
    """Time of ``f``'s algorithm (or ``model``, with ``f``'s constants) on ``machine``:
    inside one node the fitted alpha and beta hold (each GPU keeps its NVLink bandwidth
    behind NVSwitch); across nodes the network's alpha and bandwidth do. None where the
    algorithm cannot run (load/store algorithms across nodes)."""
    model = model or f.model
    w = machine.gpus
    if machine.nodes <= 1:
        beta = f.beta_gbps  # a mesh: a ring uses one link, the rest stripe over W-1 (assumed)
        if machine.mesh_link_gbps:
            beta = machine.mesh_link_gbps * (1 if model == "ring" else w - 1)
        return predict_us(model, f.alpha_us, beta, nbytes, w)
    if model in LOAD_STORE_ONLY:
        return None
    beta = min(f.beta_gbps, machine.inter_gbps)
    alpha = max(f.alpha_us, machine.inter_alpha_us)
    return predict_us(model, alpha, beta, nbytes, w)


def hierarchical_us(f: Fit, machine: Machine, nbytes: float, split: bool = True,
                    latency: str = "step") -> float:
    """Time of commlab's all_reduce across nodes (``collectives/_hier``): with ``split``
    (auto above 1 MiB) a reduce-scatter inside each node, a ring all-reduce of the 1/L
    shard between nodes (the L rings run at once, one per local index, each GPU on its
    own NIC at ``inter_gbps``), an all-gather inside; without, ``f``'s all-reduce inside,
    then the ring all-reduce of the whole message between nodes. Inside a node ``f``'s
    alpha and beta hold; between nodes the network's. ``latency="step"``: ``f``'s alpha
    is per step, so the reduce-scatter and the all-gather pay one half of two-shot's
    latency each (compiled kernels in graphs); ``"call"``: it is the cost of a call, so
    each pays ``f``'s whole latency (eager launches, Triton's interpreter). Assumed, not
    measured on real nodes; ``check_hierarchical`` sets it beside simulated hosts."""
    L, H = machine.gpus_per_node, machine.nodes
    ring_steps, ring_moved = MODELS["nccl_ring"]
    inter = nbytes / L if split else nbytes
    between = (ring_steps(H) * machine.inter_alpha_us
               + ring_moved(inter, H) / (machine.inter_gbps * 1e3)) if H > 1 else 0.0
    if not split:
        return predict_us(f.model, f.alpha_us, f.beta_gbps, nbytes, L) + between
    fixed = f.alpha_us if latency == "step" else f.alpha_us * MODELS[f.model][0](L)
    half = fixed + nbytes * (L - 1) / L / (f.beta_gbps * 1e3)  # RS or AG inside
    return 2 * half + between


def implied_by_claim(time_ms: float, utilization: float, machine: Machine) -> dict:
    """What an all-reduce claim ("T ms at U of bandwidth on M") implies, by nccl-tests'
    definitions: busbw = U · link bandwidth, algbw = busbw · W / (2(W−1)), bytes = algbw · T."""
    w = machine.gpus
    busbw = utilization * machine.inter_gbps
    algbw = busbw * w / (2 * (w - 1))
    nbytes = algbw * 1e9 * time_ms * 1e-3
    ring_latency_ms = MODELS["nccl_ring"][0](w) * machine.inter_alpha_us / 1e3
    tree_latency_ms = MODELS["nccl_tree"][0](w) * machine.inter_alpha_us / 1e3
    return {"gpus": w, "busbw_gbps": busbw, "algbw_gbps": algbw, "bytes": nbytes,
            "ring_latency_ms": ring_latency_ms, "tree_latency_ms": tree_latency_ms,
            "ring_time_ms": ring_latency_ms + MODELS["nccl_ring"][1](nbytes, w)
            / (machine.inter_gbps * 1e9) * 1e3,
            "tree_time_ms": tree_latency_ms + MODELS["nccl_tree"][1](nbytes, w)
            / (machine.inter_gbps * 1e9) * 1e3}


# --- the projection checked on a world across hosts ---------------------------------

LEVEL_SIZES = (4 << 10, 256 << 10, 2 << 20)  # both sides of the 1 MiB split


def measure_levels(comm=None, sizes=LEVEL_SIZES, reps: int = 3) -> list[dict]:
    """Time, in a world across hosts, the hierarchical all_reduce (fp32) and its two
    levels alone: ``inside`` (commlab's all_reduce on ``comm.local``) and ``between``
    (torch.distributed all_reduce on the group of one local index, one rank per host),
    the latter of the whole message and of the 1/L shard the split path sends. Each
    call after a barrier, its time the slowest rank's, the median of ``reps``; the
    hierarchical result is checked against gloo first. Collective; records as in
    DESIGN.md, ``impl`` one of "commlab:hier", "inside", "between"."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    import commlab
    from commlab.runtime.communicator import get_communicator, using

    comm = comm or get_communicator()
    if comm.across is None:
        raise ValueError("measure_levels: this world runs on one host; start ranks on two "
                         "or more hosts (torchrun --nnodes 2)")
    L, cross = comm.local.world_size, comm.across.cross_group

    def timed(fn) -> float:
        fn()  # warm-up (and the launch plan's first compile)
        out = []
        for _ in range(reps):
            dist.barrier(group=comm.cpu_group)
            t0 = time.perf_counter()
            fn()
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=comm.cpu_group)
            out.append(t.item() * 1e6)
        return statistics.median(out)

    def inside(x):
        with using(comm.local):
            commlab.all_reduce(x)

    records = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(comm.rank))
        ref = x.clone()
        dist.all_reduce(ref, group=comm.cpu_group)
        torch.testing.assert_close(commlab.all_reduce(x), ref, rtol=1e-5, atol=1e-4)
        shard = x[: -(-x.numel() // L)]
        for impl, fn, world, n in (
                ("commlab:hier", lambda x=x: commlab.all_reduce(x), comm.world_size, nbytes),
                ("inside", lambda x=x: inside(x), L, nbytes),
                ("between", lambda x=x: dist.all_reduce(x.clone(), group=cross),
                 len(comm.hosts), nbytes),
                ("between", lambda s=shard: dist.all_reduce(s.clone(), group=cross),
                 len(comm.hosts), shard.numel() * 4)):
            records.append({"op": "all_reduce", "impl": impl, "dtype": "float32", "bytes": n,
                            "world_size": world, "time_us": timed(fn), "mode": "eager"})
    return records


def check_hierarchical(records, split_bytes: int = 1 << 20) -> dict:
    """Fit each level of ``measure_levels``' records alone (inside: two_shot's counts;
    between: a ring's, per host), project the hierarchical all_reduce of the same world
    with ``hierarchical_us`` (latency per call: eager, interpreted) and set it beside
    what it measured: {"inside", "between", "rows": [{bytes, measured_us, projected_us,
    ratio, projected_step_us}]} (ratio = projected / measured). Not in the model: the
    agreement between hosts each call makes, and the copies of the split path."""
    recs = [r if isinstance(r, dict) else r.__dict__ for r in records]
    inside = [(r["bytes"], r["world_size"], r["time_us"]) for r in recs if r["impl"] == "inside"]
    between = [(r["bytes"], r["world_size"], r["time_us"]) for r in recs
               if r["impl"] == "between"]
    hier = [r for r in recs if r["impl"] == "commlab:hier"]
    a_in, b_in = fit_points("two_shot", inside)
    a_x, b_x = fit_points("nccl_ring", between)
    local, hosts = inside[0][1], between[0][1]
    f = Fit("inside", "two_shot", a_in, b_in, 0.0, 0.0, len(inside))
    m = Machine(f"{hosts} hosts x {local} ranks (measured levels)", hosts * local, local,
                inter_gbps=b_x, inter_alpha_us=a_x)
    rows = []
    for r in sorted(hier, key=lambda r: r["bytes"]):
        split = r["bytes"] > split_bytes
        proj = hierarchical_us(f, m, r["bytes"], split=split, latency="call")
        rows.append({"bytes": r["bytes"], "measured_us": r["time_us"], "projected_us": proj,
                     "ratio": proj / r["time_us"], "split": split,
                     "projected_step_us": hierarchical_us(f, m, r["bytes"], split=split)})
    return {"inside": {"alpha_us": a_in, "beta_gbps": b_in, "model": "two_shot"},
            "between": {"alpha_us": a_x, "beta_gbps": b_x, "model": "nccl_ring"},
            "machine": m.name, "rows": rows}


# --- the seed's claim, next to the projection ---------------------------------------

SEED_CLAIM = {"nodes": 128, "gpus_per_node": 8, "time_ms": 12.3, "baseline_ms": 18.7,
              "utilization": 0.82}  # the seed's table: all_reduce, 128 nodes


def seed_claim(intra: Fit, machine: Machine | None = None, claim: dict | None = None) -> dict:
    """The seed's 128-node table (all_reduce in 12.3 ms against 18.7 ms, 82% of the
    bandwidth) next to this model's projection, at the message size the claim implies
    (``implied_by_claim``). ``intra`` is the fit that holds inside a node (e.g. commlab's
    two_shot on 2xH200, graph mode); the network is ``machine``'s (default: 128 nodes x
    8 GPUs, 50 GB/s and 5 µs per step per GPU: assumed, not measured)."""
    c = {**SEED_CLAIM, **(claim or {})}
    m = machine or multi_node(c["nodes"], c["gpus_per_node"])
    implied = implied_by_claim(c["time_ms"], c["utilization"], m)
    n, w = implied["bytes"], m.gpus
    hier_ms = hierarchical_us(intra, m, n) / 1e3
    ring_ms = (predict_us("nccl_ring", m.inter_alpha_us, m.inter_gbps, n, w)) / 1e3
    tree_ms = (predict_us("nccl_tree", m.inter_alpha_us, m.inter_gbps, n, w)) / 1e3

    def busbw_use(ms: float) -> float:  # nccl-tests busbw over the network's rate per GPU
        return n / (ms * 1e-3) * 2 * (w - 1) / w / (m.inter_gbps * 1e9)

    # what each NIC carries in the hierarchical schedule: the ring of the 1/L shard
    nic_bytes = MODELS["nccl_ring"][1](n / m.gpus_per_node, m.nodes)
    nic_use = nic_bytes / (hier_ms * 1e-3) / (m.inter_gbps * 1e9)
    rows = [("hierarchical all_reduce (ms)", c["time_ms"], hier_ms),
            ("baseline (ms): flat ring / tree over the network", c["baseline_ms"],
             f"{ring_ms:.1f} / {tree_ms:.1f}"),
            ("bandwidth use: busbw / network rate per GPU", c["utilization"],
             f"{busbw_use(hier_ms):.0%} (flat ring {busbw_use(ring_ms):.0%})"),
            ("bandwidth use: bytes through each NIC / time / NIC rate", "—", nic_use)]
    assumptions = [
        f"{m.name}: {w} GPUs, {m.inter_gbps:g} GB/s and {m.inter_alpha_us:g} µs per network "
        f"step per GPU (assumed; every GPU on its own NIC, no congestion)",
        f"inside a node: {intra.impl} ({intra.model}) alpha {intra.alpha_us:.2f} µs, beta "
        f"{intra.beta_gbps:.0f} GB/s, fit on {intra.points} points (median error "
        f"{100 * intra.median_error:.0f}%); 8 GPUs behind NVSwitch keep each GPU's rate",
        f"message {n / 2**20:.0f} MiB: what {c['time_ms']} ms at {c['utilization']:.0%} of "
        f"{m.inter_gbps:g} GB/s implies (busbw {implied['busbw_gbps']:.1f} GB/s, algbw "
        f"{implied['algbw_gbps']:.1f} GB/s, nccl-tests' definitions)",
        "hierarchical = reduce-scatter inside, ring all_reduce of the 1/8 shard between "
        "nodes (8 rings at once), all-gather inside (commlab.collectives._hier); its "
        "busbw counts the whole message, each NIC carries 1/8 of it: busbw / NIC rate "
        "can pass 100%"]
    return {"machine": m.name, "bytes": n, "rows": rows, "assumptions": assumptions,
            "hierarchical_ms": hier_ms, "ring_ms": ring_ms, "tree_ms": tree_ms,
            "busbw_use": busbw_use(hier_ms), "nic_use": nic_use}


def claim_table(result: dict) -> str:
    """``seed_claim``'s result as a markdown table with its assumptions below."""
    def cell(v) -> str:
        if isinstance(v, str):
            return v
        return f"{v:.0%}" if v < 1 else f"{v:.1f}"

    lines = ["| 128 nodes x 8 GPUs | seed's table | commlab's projection |", "| --- | --- | --- |"]
    lines += [f"| {name} | {cell(a)} | {cell(b)} |" for name, a, b in result["rows"]]
    return "\n".join(lines + [""] + [f"- {a}" for a in result["assumptions"]])


def report(fits: dict[str, Fit]) -> str:
    lines = [f"{'impl':<26}{'model':<11}{'alpha µs':>10}{'beta GB/s':>11}{'median err':>12}"
             f"{'max err':>9}{'points':>8}"]
    for f in fits.values():
        lines.append(f"{f.impl:<26}{f.model:<11}{f.alpha_us:>10.2f}{f.beta_gbps:>11.1f}"
                     f"{100 * f.median_error:>11.1f}%{100 * f.max_error:>8.1f}%{f.points:>8}")
    return "\n".join(lines)


__all__ = ["LEVEL_SIZES", "MI300X_8", "MODELS", "NVSWITCH_8", "SEED_CLAIM", "Fit", "Machine",
           "check_hierarchical", "claim_table", "fit", "fit_points", "hierarchical_us",
           "implied_by_claim", "measure_levels", "model_of", "multi_node", "predict_us",
           "project_us", "report", "seed_claim"]
