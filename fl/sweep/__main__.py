import sys

from fl.sweep.runner import main

sys.exit(main())
