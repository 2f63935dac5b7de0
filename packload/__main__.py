"""``python -m packload pack SRC DEST`` (or any other subcommand); ``python -m packload SRC DEST`` packs."""

import sys

from packload.cli import module_main

sys.exit(module_main())
