"""A notebook on a simulated host (tests/test_launchers.py): a real InteractiveShell that
starts a world with ``%dist_start --launcher ...`` and runs cells on it.

    python -m tests.worlds.notebook OUT.json "--launcher ssh --hosts h0:2,h1:2" stop|wait

Each step's captured output (or error) goes to OUT.json as it happens, with the pids and
directories of every world, so the test can check them after this process ended. With
``wait`` the world stays up and the script sleeps (the test SIGKILLs it).
"""

from __future__ import annotations

import json
import sys
import time

from IPython.utils.capture import capture_output

from tests.engine_helpers import shell

OUT: dict = {"steps": {}, "worlds": []}


def save() -> None:
    with open(sys.argv[1] + ".part", "w") as f:
        json.dump(OUT, f)
    import os

    os.replace(sys.argv[1] + ".part", sys.argv[1])


def step(name: str, fn) -> None:
    t0 = time.monotonic()
    err = ""
    with capture_output() as cap:
        try:
            fn()
        except BaseException as e:  # the test reads the message
            err = f"{type(e).__name__}: {getattr(e, 'report', None) or e}"
    OUT["steps"][name] = {"stdout": cap.stdout, "stderr": cap.stderr, "error": err,
                          "s": round(time.monotonic() - t0, 2)}
    save()


def record() -> None:
    from commlab.engine import current_world
    from commlab.engine._launch import remote_dir

    w = current_world()
    OUT["worlds"].append({"ranks": [[ri.rank, ri.host, ri.pid] for ri in w.ranks],
                          "pids": w.pids(), "dirs": [w.stack_dir, remote_dir(w.stack_dir)],
                          "hub": [w.hub.host, w.hub.port], "relay": list(w.relay.address[:2])})
    save()


def main() -> None:
    flags, end = sys.argv[2], sys.argv[3]
    ip = shell()

    def cell(code: str, line: str = ""):
        return lambda: ip.run_cell_magic("distributed", line, code)

    step("start", lambda: ip.run_line_magic("dist_start", f"-n 4 --backend cpu {flags}"))
    record()
    step("status", lambda: ip.run_line_magic("dist_status", ""))
    step("all_reduce", cell("import socket\nprint(socket.gethostname())\n"
                            "print('sum', commlab.all_reduce(torch.ones(2) * (rank + 1))"
                            ".tolist())\nprint('local', comm.local.world_size)"))
    step("error", cell("if rank == 3:\n    raise ValueError('boom on rank 3')\n"))
    step("hang", cell("x = torch.ones(4)\nif rank == 3:\n    commlab.all_reduce(x)\n",
                      "--grace 2"))
    step("after_hang", cell("print('sum', commlab.all_reduce(torch.ones(1)).tolist())"))
    import commlab.engine._wait as wait

    answers = ["p secret * 2", "c"]
    OUT["prompts"] = []
    wait.ask = lambda prompt: OUT["prompts"].append(prompt) or answers.pop(0)
    step("debugger", cell("secret = 21 + rank\nif rank == 3:\n    breakpoint()\n"
                          "print('after', secret)"))
    if end == "wait":
        OUT["ready"] = True
        save()
        time.sleep(600)
        return
    step("uneven", lambda: ip.run_line_magic("dist_resize", "3"))
    step("shrink", lambda: ip.run_line_magic("dist_resize", "2"))
    step("after_shrink", cell("import socket\nprint(socket.gethostname())\n"
                              "print('sum', commlab.all_reduce(torch.ones(1)).tolist())"))
    step("grow", lambda: ip.run_line_magic("dist_resize", "4"))
    step("restart", lambda: ip.run_line_magic("dist_restart", ""))
    record()
    step("after_restart", cell("print('sum', commlab.all_reduce(torch.ones(1)).tolist())"))
    step("stop", lambda: ip.run_line_magic("dist_stop", ""))
    OUT["done"] = True
    save()


if __name__ == "__main__":
    main()
