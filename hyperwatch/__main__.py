from hyperwatch.cli import main

raise SystemExit(main())
