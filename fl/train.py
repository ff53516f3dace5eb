"""`python -m fl.train [conf=NAME] [key=value ...]` and the `fl-train` command: the entry point (fl/run/train.py
does the work)."""
import sys
from typing import NoReturn

from fl.run.cpu_threads import sleep_at_barriers

sleep_at_barriers()  # before torch loads (fl/run/cpu_threads.py): OpenMP reads it once


def entry() -> NoReturn:
    """Run the command and end the process with its exit code, without the interpreter's teardown
    (fl/run/process_exit.py). Ctrl-C while torch and Lightning import ends quietly, as it does later."""
    from fl.run.process_exit import end_process

    try:
        from fl.run.train import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        end_process(130)
    end_process(main())


if __name__ == "__main__":
    entry()
