"""Planning: which backend runs which node. Nothing here runs a tensor.

* ``capability``: what each backend can run, node by node, and why not
  (``CapabilityTable``: manifests, validators, findings; ``NodeSupport``);
* ``findings``: what first-use checks found wrong, kept, so that the table refuses it;
* ``support``: the interface the partitioner reads (``SupportTable``) and a view of it
  with a preferred backend first (``Preferred``);
* ``partition``: the linear partitioner (``partition_graph`` -> ``Plan``);
* ``planner``: one config's planning facts (chain, table, knobs): what policies read;
* ``policy``: the policies (a registry, like backends) and their candidates;
* ``cost``: the static cost estimate.
"""
