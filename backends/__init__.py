"""Built-in backends, one module each, installed as ``arbiter.backends``.

Each module registers its backend class with ``@register_backend`` and imports only torch
at module level; the backend's own packages are imported inside its methods.
"""
