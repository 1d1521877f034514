"""`python -m vmtax` and the `vmtax` command. Importing the command line takes a second or
more; Ctrl-C or SIGTERM in that second exits as interrupted (130, 143), not with a Python
traceback, until vmtax.cli.main.main installs its own handlers."""

import signal
import sys
from types import FrameType


def _interrupted(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("interrupted\n")
    sys.exit(128 + signum)


def run() -> None:
    signal.signal(signal.SIGTERM, _interrupted)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:   # kept for background jobs
        signal.signal(signal.SIGINT, _interrupted)
    from vmtax.cli.main import main
    main()


if __name__ == "__main__":
    run()
