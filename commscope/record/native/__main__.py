"""python -m commscope.record.native: build the native recorder ahead of time."""

from commscope.record.native import main

raise SystemExit(main())
