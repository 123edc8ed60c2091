"""The measuring wing: a graph's first call, timed, when its policy asks for it.

A policy says what it wants timed as data (``plan.policy.TimedChoice`` on its
``Choice``); the Arbiter hands that to ``graph.MeasuredGraph``, which stands for the
graph until its first real call has decided. One idea per module (docs/design.md's
module map lists them; docs/policies.md says what each decides). This package imports
none of its modules: each is imported where it is used.
"""
