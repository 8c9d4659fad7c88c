"""``python -m spectune``: the same command line as the ``spectune`` script."""

from spectune.cli import main

raise SystemExit(main())
