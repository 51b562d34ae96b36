import sys

from ref_interp.cli import main

sys.exit(main())
