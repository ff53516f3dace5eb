import sys

from fl.reproduce.cli import main

sys.exit(main())
