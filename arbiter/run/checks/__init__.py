"""A piece's checks, in one room: what is checked around a compiled partition's calls.

* ``verify``: a piece's outputs checked (metadata every call, numbers on demand); also
  what ``arbiter probe`` and ``arbiter.load`` compare with;
* ``reference``: a float64 reference, judging a difference from eager that the
  tolerance rejects;
* ``calls``: checks around one call (non-finite inputs, input indices, inputs a backend
  wrote into, output buffers a second call reuses);
* ``piece_checks``: which calls are checked (config ``verify``), a checked call judged;
* ``first_use``: verify mode ``unverified``: a partition holding unverified ops checked
  on its first call, a failure traced to its op.

This package imports none of its modules: each is imported where it is used.
"""
