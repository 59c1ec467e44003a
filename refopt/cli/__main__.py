import sys

from refopt.cli import main

sys.exit(main())
