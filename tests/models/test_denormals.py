"""rlvr.models.denormals.flushing_denormals: subnormal floats read and written as 0 in the calling thread and in
every thread of its OpenMP team while inside, as before after; and the trainer's update runs inside it on the CPU."""

import threading

import pytest
import torch

from rlvr.models.denormals import flushing_denormals

SUBNORMAL = 1e-39  # below fp32's smallest normal, 1.18e-38


@pytest.fixture
def two_threads():
    """A team of two OpenMP threads, whatever the machine: the second one is what set_flush_denormal alone misses."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _flushed_parts() -> list[bool]:
    """Whether each half of a 2M-element product (one per thread of a team of two) and a matrix product read a
    subnormal input as 0."""
    x = torch.full((1 << 21,), SUBNORMAL)
    y = x * 3.0  # elementwise, split across the team
    halves = [bool((part == 0).all()) for part in y.chunk(2)]
    m = torch.full((256, 512), SUBNORMAL) @ torch.ones(512, 256)  # MKL's threads
    return [*halves, bool((m == 0).all())]


def test_every_thread_flushes_inside_and_none_after(two_threads):
    assert _flushed_parts() == [False, False, False]  # subnormals as they are
    with flushing_denormals() as flushed:
        assert flushed is True
        assert _flushed_parts() == [True, True, True]
        assert float(torch.tensor(2e-38) * torch.tensor(0.25)) == 0.0  # a subnormal result is 0 too
    assert _flushed_parts() == [False, False, False]


def test_nested_blocks_and_off(two_threads):
    with flushing_denormals(False) as flushed:
        assert flushed is False and _flushed_parts() == [False, False, False]
    with flushing_denormals():
        with flushing_denormals():
            assert _flushed_parts() == [True, True, True]
        assert _flushed_parts() == [True, True, True]  # the outer block's flags, set back
        with flushing_denormals(False):  # off leaves the flags as they are
            assert _flushed_parts() == [True, True, True]
    assert _flushed_parts() == [False, False, False]


def test_other_threads_untouched(two_threads):
    """A thread started before the block keeps its own flags (and its own team's) while this thread is inside."""
    seen, go = [], threading.Event()

    def other():
        torch.set_num_threads(2)
        _flushed_parts()  # its team made before the block
        go.wait()
        seen.append(_flushed_parts())

    t = threading.Thread(target=other)
    t.start()
    with flushing_denormals():
        go.set()
        t.join()
    assert seen == [[False, False, False]]


@pytest.mark.parametrize("flush", [True, False])
def test_the_update_runs_flushed_on_the_cpu(make_trainer, flush, two_threads):
    """Every training forward of a step (old log-probs and the update's) sees subnormals flushed with flush_denormals
    (the default), none without; generation sees them as they are either way."""
    trainer = make_trainer("steps=1", f"flush_denormals={str(flush).lower()}", "optim.skip_zero_advantage=false")
    seen: dict[bool, list] = {True: [], False: []}  # grad enabled -> what each forward saw

    def look(module, args):
        seen[torch.is_grad_enabled()].append(_flushed_parts())

    trainer.model.register_forward_pre_hook(look)
    trainer.train()
    assert seen[True] and all(parts == [flush] * 3 for parts in seen[True])
    assert _flushed_parts() == [False, False, False]  # back after the update
