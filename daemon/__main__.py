from lakefeed.ops.cli import main

raise SystemExit(main())
