"""`python -m tokview` runs the same entry point as the `tokview` script."""

import sys

from tokview.entry import main

sys.exit(main())
