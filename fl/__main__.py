import sys

from fl.train import entry

sys.exit(entry())
