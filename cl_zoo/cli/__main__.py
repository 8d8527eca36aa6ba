import sys

from cl_zoo.cli import main

sys.exit(main())
