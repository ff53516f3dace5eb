import sys

from fl.run.cpu_threads import sleep_at_barriers

sleep_at_barriers()  # before torch loads (fl/run/cpu_threads.py)

from fl.sweep.runner import main  # noqa: E402

sys.exit(main())
