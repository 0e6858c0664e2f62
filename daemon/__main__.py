from lakefeed.cli import main

raise SystemExit(main())
