import sys

from fl.train import main

sys.exit(main())
