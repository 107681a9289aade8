"""python -m sparsespec.experiments NAME [options]: see sparsespec.experiments.driver."""

from sparsespec.experiments.driver import main

raise SystemExit(main())
