"""The measuring wing: a graph's first call, timed, when its policy asks for it.

A policy says what it wants timed as data (``plan.policy.TimedChoice`` on its
``Choice``); the Arbiter hands that to ``graph.MeasuredGraph``, which stands for the
graph until its first real call has decided. One idea per module:

* ``graph``: ``MeasuredGraph``, the orchestrator of the first call;
* ``decision``: the decision, its cache key, and the rank-0 broadcast under
  torch.distributed;
* ``timing``: the timing service (samples, interleaved rounds, spreads, margins, the
  far-behind cut, the budget);
* ``precision``: acceptance of lower-precision candidates (config `accuracy`);
* ``refine``: refinement (Collage-style moves) and the steered plans it, mixing and the
  cache build placements with;
* ``mix`` (+ ``probes``, the segment probes): the mixed candidate at module boundaries;
* ``winner``: the pick, the policy's margin, and the outcome kept on the graph's record.

docs/policies.md says what each decides. This package imports none of its modules: each
is imported where it is used.
"""
