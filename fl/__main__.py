import sys

from fl.run.train import main

sys.exit(main())
