"""`distributed.world.launch`: a rank that fails with its own one-line error keeps that line
when the launcher's SIGTERM arrives meanwhile (torchrun stops the survivors once one rank
has exited, and a second rank failing on the same bad input may still be publishing its
line). Acted out in one process: a group of one, `launched()` told it is a torchrun run."""
import os
import signal
import socket

import pytest
import torch

from embcache.distributed import world
from embcache.errors import UserFacingError


@pytest.fixture
def one_rank_group(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(world, "launched", lambda: True)


def test_a_sigterm_while_a_rank_publishes_its_error_leaves_its_line(one_rank_group, monkeypatch):
    """SIGTERM lands while the failing rank publishes its line in the rendezvous store: the
    rank still raises its own `UserFacingError`, "rank 0: ..." (before, the signal raised
    inside the `except` branch and escaped as a traceback), the line is in the store, and
    SIGTERM's handler is the one found before `launch`."""
    published, publish = [], world._publish

    def publish_as_sigterm_lands(line):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher, stopping this rank
        publish(line)
        published.append(world._peer_detail())

    monkeypatch.setattr(world, "_publish", publish_as_sigterm_lands)
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(UserFacingError, match=r"^rank 0: shard part-00000\.parquet is damaged$"):
            with world.launch(torch.device("cpu"), 30.0):
                raise UserFacingError("shard part-00000.parquet is damaged")
        assert published == [" (rank 0: shard part-00000.parquet is damaged)"]
        assert not torch.distributed.is_initialized()
        # the error is now on its way to the command's one line: a SIGTERM landing meanwhile (after
        # `launch` has ended, before the line is printed) must not end the process without it
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, before)  # checked first: SIG_DFL would end pytest
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: nothing raised here
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_rank_that_ends_well_gets_its_sigterm_handler_back(one_rank_group):
    before = signal.getsignal(signal.SIGTERM)
    with world.launch(torch.device("cpu"), 30.0):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before and not torch.distributed.is_initialized()


def test_a_sigterm_while_a_rank_meets_a_dead_peer_leaves_its_line(one_rank_group, monkeypatch):
    """SIGTERM lands while the rank classifies its failed collective (the peer is gone): it
    still ends in its own one line, not in a traceback."""
    classify = world._is_collective_failure

    def classify_as_sigterm_lands(err):
        os.kill(os.getpid(), signal.SIGTERM)
        return classify(err)

    monkeypatch.setattr(world, "_is_collective_failure", classify_as_sigterm_lands)
    try:
        with pytest.raises(world.PeerFailure, match=r"^rank 0: another rank died \(its connection closed\)"):
            with world.launch(torch.device("cpu"), 30.0):
                raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:3249")
    finally:
        if torch.distributed.is_initialized():  # a peer failure leaves the group as it is
            torch.distributed.destroy_process_group()
