import sys

from fl.report.cli import main

sys.exit(main())
