"""Running cells in a real ipykernel (what JupyterLab talks to) and collecting what each
cell shows: the kernel's event loop delivers ipyparallel's late log lines, which a bare
InteractiveShell never runs."""

from __future__ import annotations

import contextlib
import os
import queue

from jupyter_client.manager import start_new_kernel

WIDGET = "application/vnd.jupyter.widget-view+json"


@contextlib.contextmanager
def kernel():
    env = dict(os.environ, COMMLAB_BACKEND="cpu", OMP_NUM_THREADS="1")
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def run(kc, code: str, timeout: float = 240) -> dict:
    """Run ``code``; return {"text": stream + text/plain output (widgets left out),
    "error": (ename, tb lines) or None} of this cell, up to the kernel going idle."""
    msg_id = kc.execute(code)
    texts, error, where = [], None, {}  # where: display_id -> index in texts
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=timeout)
        except queue.Empty as e:
            raise TimeoutError(f"no idle from the kernel within {timeout} s for {code!r}") from e
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            texts.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            if WIDGET not in content["data"]:  # a progress bar: a widget, not a line of text
                did = content.get("transient", {}).get("display_id")
                if did:
                    where[did] = len(texts)
                texts.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "update_display_data":  # what the notebook shows is the last update
            did = content.get("transient", {}).get("display_id")
            if did in where:
                texts[where[did]] = content["data"].get("text/plain", "") + "\n"
        elif kind == "error":
            error = (content["ename"], content["traceback"])
        elif kind == "status" and content["execution_state"] == "idle":
            return {"text": "".join(texts), "error": error}


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]
