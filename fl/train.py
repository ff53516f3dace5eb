"""`python -m fl.train [conf=NAME] [key=value ...]` and the `fl-train` command: the entry point (fl/run/train.py
does the work)."""
import sys

from fl.run.cpu_threads import sleep_at_barriers

sleep_at_barriers()  # before torch loads (fl/run/cpu_threads.py): OpenMP reads it once


def entry() -> int:
    """Ctrl-C while torch and Lightning import ends quietly, as it does later."""
    try:
        from fl.run.train import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(entry())
