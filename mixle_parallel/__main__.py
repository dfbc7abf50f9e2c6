"""``python -m mixle_parallel`` runs the command-line interface."""

from mixle_parallel.cli import main

raise SystemExit(main())
