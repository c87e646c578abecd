"""``python -m graph_autofusion`` runs the command line."""

from graph_autofusion.cli import main

raise SystemExit(main())
