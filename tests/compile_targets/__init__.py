"""Compile every kernel commlab ships for five GPU targets, without a GPU.

    matrix.py   the targets, the kernel variants (by name) and the pairs known to fail today
    kernels.py  each variant: the kernel, its argument types and constexprs at the launch
                shapes the host code uses (imported only in a compiling subprocess)
    worker.py   compiles a list of (variant, target) jobs, one process, cached
    run.py      the matrix with two workers; writes bench/results/compile-targets.json

    .venv/bin/python -m tests.compile_targets            # print the table
    .venv/bin/python -m tests.compile_targets --write    # also regenerate the JSON

``tests/test_compile_targets.py`` asserts the whole matrix compiles and fits each target's
shared memory.
"""
