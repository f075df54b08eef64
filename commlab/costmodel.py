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


def hierarchical_us(f: Fit, machine: Machine, nbytes: float, split: bool = True) -> float:
    """Time of commlab's all_reduce across nodes (``collectives/_hier``): with ``split``
    (auto above 1 MiB) a reduce-scatter inside each node, a ring all-reduce of the 1/L
    shard between nodes (the L rings run at once, one per local index, each GPU on its
    own NIC at ``inter_gbps``), an all-gather inside; without, ``f``'s all-reduce inside,
    then the ring all-reduce of the whole message between nodes. Inside a node ``f``'s
    alpha and beta hold (one half of two-shot each for the reduce-scatter and the
    all-gather); between nodes the network's. Assumed, not measured on real nodes."""
    L, H = machine.gpus_per_node, machine.nodes
    ring_steps, ring_moved = MODELS["nccl_ring"]
    inter = nbytes / L if split else nbytes
    between = (ring_steps(H) * machine.inter_alpha_us
               + ring_moved(inter, H) / (machine.inter_gbps * 1e3)) if H > 1 else 0.0
    if not split:
        return predict_us(f.model, f.alpha_us, f.beta_gbps, nbytes, L) + between
    half = f.alpha_us + nbytes * (L - 1) / L / (f.beta_gbps * 1e3)  # RS or AG inside
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


def report(fits: dict[str, Fit]) -> str:
    lines = [f"{'impl':<26}{'model':<11}{'alpha µs':>10}{'beta GB/s':>11}{'median err':>12}"
             f"{'max err':>9}{'points':>8}"]
    for f in fits.values():
        lines.append(f"{f.impl:<26}{f.model:<11}{f.alpha_us:>10.2f}{f.beta_gbps:>11.1f}"
                     f"{100 * f.median_error:>11.1f}%{100 * f.max_error:>8.1f}%{f.points:>8}")
    return "\n".join(lines)


__all__ = ["MI300X_8", "MODELS", "Fit", "Machine", "NVSWITCH_8", "fit", "fit_points",
           "hierarchical_us", "implied_by_claim", "model_of", "multi_node", "predict_us",
           "project_us", "report"]
