"""``python -m arbiter.cli``: the ``arbiter`` command."""
import sys

from .main import main

sys.exit(main())
