import sys

from bench.programs.run import main

sys.exit(main())
