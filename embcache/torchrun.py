"""`python -m embcache.torchrun ...`: torchrun, with the same arguments, minus its traceback on
Ctrl-C.

Under plain `torchrun` a Ctrl-C reaches the workers and the launcher alike: the workers finish
their step, write the checkpoint and say so in one line ("interrupted at step N ...; resume
with --resume"), and then torch's launcher prints a 20-frame `SignalException` traceback of
its own. This entry point runs the same launcher and turns that exception into one line and
exit status 130 (SIGTERM: 143), so that an interrupted run ends as it does in one process.
"""
from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as err:
        name = signal.Signals(err.sigval).name if err.sigval in signal.Signals._value2member_map_ else err.sigval
        print(f"torchrun: stopped by {name}; the workers' last lines say what was kept", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
