"""``python -m portable_softmax``: the ``portable-softmax`` command, where no script is on PATH."""

import sys

from portable_softmax.cli import main

sys.exit(main())
