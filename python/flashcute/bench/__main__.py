"""``python -m flashcute.bench``: see the package docstring."""

import sys

from .cli import main

sys.exit(main())
