from stgcnd.cli import main

raise SystemExit(main())
