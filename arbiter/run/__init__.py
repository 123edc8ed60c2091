"""Running: what executes tensors once a plan exists.

* ``lower``: Dynamo's graph -> AOTAutograd's ATen graphs (forward, backward, inference);
* ``split``: a plan's partitions cut out, and one stitched graph calling them;
* ``piece``: one partition, compiled lazily, demoted down its chain on failure;
* ``checks``: a piece's checks (``checks.verify``: its outputs, metadata every call,
  numbers on demand; around each call; first-use checks);
* ``freeze``: frozen weights guarded on every call;
* ``measured``: policy `measure`'s timing on the first real call;
* ``record``: what happened to one compiled graph (read by the report);
* ``resources``: one thread budget and arena per process.
"""
