"""``python -m tests.compile_targets [--write] [--jobs N]``: compile the matrix, print the
table (and the failures), with --write regenerate bench/results/compile-targets.json."""

from __future__ import annotations

import argparse
import json
import sys

from tests.compile_targets.run import RESULTS, document, run, table


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.compile_targets")
    ap.add_argument("--write", action="store_true", help=f"write {RESULTS}")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = ap.parse_args()
    records, seconds = run(args.jobs)
    print(table(records))
    for r in records:
        if not r["ok"]:
            print(f"FAIL {r['variant']} @ {r['target']}: {r['error']}")
    print(f"{len(records)} compiles checked in {seconds:.0f} s "
          f"({sum(not r.get('cached') for r in records)} compiled, the rest cached)")
    if args.write:
        RESULTS.write_text(json.dumps(document(records), indent=1) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
