"""Training loops that outlive lost ranks and take in newcomers, in place.

    state = commlab.elastic.State(model=model, optimizer=opt, sampler=sampler, step=0)
    while state.step < steps:
        with commlab.elastic.step(state):      # commit on success; rollback + shrink on a
            batch = sampler.next_batch()       # lost rank; newcomers admitted here
            ...
            state.step += 1

A newcomer runs the same loop after ``commlab.init(join=True)``: its first ``step``
receives the state from a live peer over commlab's broadcast.
"""

from commlab.elastic._sampler import ElasticSampler
from commlab.elastic._state import State
from commlab.elastic._step import step

__all__ = ["ElasticSampler", "State", "step"]
