"""``python -m tqstore``: see :mod:`tqstore.cli`."""
import sys

from .cli import main

sys.exit(main())
