"""`python -m fl.train [conf=NAME] [key=value ...]`: the entry point (fl/run/train.py does the work)."""
import sys

from fl.run.train import main

if __name__ == "__main__":
    sys.exit(main())
