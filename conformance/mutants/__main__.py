import sys

from conformance.mutants.run import main

sys.exit(main())
