"""``python -m packer SRC DEST`` packs; ``python -m packer info|verify|unpack ...`` as ``packload``."""

import sys

from .cli import module_main

sys.exit(module_main())
