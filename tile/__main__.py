import sys

from tile.cli import main

sys.exit(main())
