"""The CPU's stand-in for a CUDA graph (`tests.cpu_graph`) does what the graph tests rely on:
a replay repeats the capture's device work on the same tensors and none of its Python."""
import pytest
import torch

from tests.cpu_graph import CaptureRefused, ReplayedStep


def test_a_replay_repeats_the_device_work_on_the_same_tensors_and_none_of_the_python():
    weight, calls = torch.zeros(3), []

    def step(x):
        calls.append(1)  # Python: runs at the warmup and the capture only
        weight.add_(x * len(calls))  # the multiplier is baked in at the capture (2)
        return weight.sum() + 1

    replayed = ReplayedStep(step, warmup=1)
    outs = [float(replayed(torch.full((3,), v))) for v in (1.0, 2.0, 3.0, 4.0)]
    assert len(calls) == 2 and replayed.replays == 2
    # 1*1; then 2*2 (capture); replays: 3*2, 4*2, read from fresh inputs copied into the static one
    assert weight.tolist() == [1 + 4 + 6 + 8] * 3
    assert outs == [3 * 1 + 1, 3 * 5 + 1, 3 * 11 + 1, 3 * 19 + 1]


def test_the_host_s_own_tensors_are_left_out_and_a_sync_is_refused():
    count, weight = torch.zeros(()), torch.zeros(2)

    def step(x):
        count.add_(1)  # a host counter (as the dense Adagrad's step): not in the graph
        weight.add_(x)
        return weight

    replayed = ReplayedStep(step, warmup=0, host=[count])
    for _ in range(3):
        replayed(torch.ones(2))
    assert float(count) == 1 and weight.tolist() == [3.0, 3.0]
    with pytest.raises(CaptureRefused, match="sync"):
        ReplayedStep(lambda x: x.sum().item(), warmup=0)(torch.ones(2))
    with pytest.raises(CaptureRefused, match="sync"):
        ReplayedStep(lambda x: x[x > 0], warmup=0)(torch.ones(2))


def test_host_data_made_a_tensor_in_the_capture_is_refused_and_host_numbers_are_recorded_as_fills():
    """CUDA refuses a copy from pageable memory in a capture, and a temporary pinned buffer's
    address would be baked in; `embcache.device.host_numbers` writes the numbers by fills the
    graph records instead, so each replay writes them again (here: into the same tensor)."""
    from embcache.device import host_numbers

    with pytest.raises(CaptureRefused, match="host data"):
        ReplayedStep(lambda x: x + torch.tensor([1.0, 2.0]), warmup=0)(torch.ones(2))
    made = []

    def step(x):
        numbers = host_numbers([3, 5], x.device)
        made.append(numbers)
        return x * numbers

    replayed = ReplayedStep(step, warmup=1)
    outs = [replayed(torch.full((2,), v)).tolist() for v in (1, 2, 3)]
    assert outs == [[3, 5], [6, 10], [9, 15]] and replayed.replays == 1
    made[-1].zero_()  # what later work may leave in the capture's tensor: the replay's fills write it anew
    assert replayed(torch.full((2,), 4)).tolist() == [12, 20] and made[-1].tolist() == [3, 5]
