"""``status.txt``: every test of torch's suite with its status on each world size, the CI
tag, and for each skip or expected failure the reason.

One line per test: ``name  w2  w3  tag  reason``; statuses are ``pass``, ``skip``,
``xfail`` (fails on commlab for the reason given) and ``-`` (not run at that size); the
tag is ``ci`` for the tests ``tests/test_torch_suite.py`` runs on every push, else ``-``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WORLDS = (2, 3)
_HEADER = """\
# PyTorch's DistributedTest._DistTestBase (torch/testing/_internal/distributed/
# distributed_test.py of the installed torch) on backend "commlab", CPU ranks.
# Written by `python -m tests.torch_suite.run --write`, checked by --check and by
# tests/test_torch_suite.py; the reasons are kept by hand (a skip gloo shares says so).
# test{pad}w2     w3     tag  reason
"""


@dataclass
class Entry:
    statuses: dict = field(default_factory=dict)  # world size -> status
    tags: set = field(default_factory=set)
    reason: str = ""


def read(path: str) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split(None, 4)
            name, w2, w3, tag = parts[:4]
            out[name] = Entry({2: w2, 3: w3}, set() if tag == "-" else set(tag.split(",")),
                              parts[4].strip() if len(parts) > 4 else "")
    return out


def write(path: str, entries: dict[str, Entry]) -> None:
    width = max(len(n) for n in entries) + 2
    with open(path, "w") as f:
        f.write(_HEADER.format(pad=" " * (width - 4)))
        for name in sorted(entries):
            e = entries[name]
            cols = [e.statuses.get(w, "-") for w in WORLDS]
            tag = ",".join(sorted(e.tags)) or "-"
            line = f"{name:<{width}}{cols[0]:<7}{cols[1]:<7}{tag:<5}{e.reason}"
            f.write(line.rstrip() + "\n")


def _listed_status(result: dict) -> str:
    return {"pass": "pass", "skip": "skip"}.get(result["status"], "xfail")


def merge(listed: dict[str, Entry], results: dict[int, dict]) -> dict[str, Entry]:
    """The results' statuses with the list's tags and reasons (a new skip or failure gets
    torch's reason or the error, to be edited)."""
    out = {n: Entry(dict(e.statuses), set(e.tags), e.reason) for n, e in listed.items()}
    for world, records in results.items():
        for name, rec in records.items():
            e = out.setdefault(name, Entry())
            e.statuses[world] = _listed_status(rec)
            if e.statuses[world] != "pass" and not e.reason:
                e.reason = ("torch skips it: " if rec["status"] == "skip" else "") + rec["reason"]
    for e in out.values():
        if all(s in ("pass", "-") for s in e.statuses.values()):
            e.reason = ""
    return out


def compare(listed: dict[str, Entry], results: dict[int, dict]) -> list[str]:
    problems = []
    for world, records in results.items():
        if not records:
            problems.append(f"world {world}: no results (the runner itself failed)")
        for name, rec in sorted(records.items()):
            want = listed[name].statuses.get(world, "-") if name in listed else None
            got = _listed_status(rec)
            if want is None:
                problems.append(f"world {world}: {name} is not in status.txt ({rec['status']})")
            elif rec["status"] == "timeout" or got != want:
                problems.append(f"world {world}: {name}: {rec['status']} "
                                f"({rec['reason'][:200]}), status.txt says {want}")
    return problems


def summary(results: dict[int, dict], backend: str, wall: float, reach=None) -> str:
    lines = [f"torch's DistributedTest._DistTestBase on {backend!r} ({wall:.0f} s)"]
    for world, records in results.items():
        counts: dict[str, int] = {}
        for rec in records.values():
            counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        secs = sum(r["seconds"] for r in records.values())
        lines.append(f"  world {world}: " + ", ".join(
            f"{counts.get(s, 0)} {s}" for s in ("pass", "skip", "fail", "timeout"))
            + f" ({len(records)} tests, {secs:.0f} s)")
        if reach is not None and records:
            r = reach(records)
            native = len(r["kernels"])
            collective = native + len(r["fallback_only"])
            pct = 100.0 * native / collective if collective else 100.0
            lines.append(
                f"    reached commlab's kernels: {native}; fallback only: "
                f"{len(r['fallback_only'])} (+{len(r['fallback_by_design'])} whose ops commlab "
                f"leaves to gloo: send/recv, monitored_barrier); no call on the group: "
                f"{len(r['no_group_call'])}; kernels / collective tests = {pct:.0f}%")
            if r["fallback_only"]:
                lines.append("    fallback only: " + ", ".join(sorted(r["fallback_only"])))
    return "\n".join(lines)
