"""`python -m rlvr ...` is the same as the `rlvr` console script (and what torchrun launches)."""

from rlvr.cli import main

raise SystemExit(main())
