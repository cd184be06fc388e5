"""``python -m jaxnet`` is the ``jaxnet`` command."""

from jaxnet.cli import main

raise SystemExit(main())
