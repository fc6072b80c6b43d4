"""The trainer's training order (train/dtc_train/dali_data.py, ``ReadOrder``; issue #20 item 2):
every epoch reads each sample once over the ranks, and a job resumed mid-epoch at another world
size goes on with the samples the old job had not read: none skipped, none read twice."""

from collections import Counter

import numpy as np
import pytest
from PIL import Image

from dtc_train import dali_data
from dtc_train.channel import list_images

SAMPLES = 96
BATCH = 4


def _order(world_size: int, lane: int = 0, micro_batches: int = 1, start=(0, 0, 0), samples: int = SAMPLES):
    steps = dali_data.steps_per_epoch(samples, BATCH, world_size)
    return dali_data.ReadOrder(samples, BATCH, lane, world_size, steps // micro_batches * micro_batches, seed=5,
                               start=start)


def _read(world_size: int, first: int, last: int, **order) -> list[int]:
    """Listing indices every rank of ``world_size`` reads in the pipeline's batches ``first`` to
    ``last`` (exclusive)."""
    return [int(i) for lane in range(world_size) for batch in range(first, last)
            for i in _order(world_size, lane, **order).indices(batch)]


def test_every_epoch_reads_each_sample_once_over_the_ranks_and_the_next_another_order():
    for world_size in (1, 2, 3):
        batches = _order(world_size).batches_per_epoch
        epoch_1, epoch_2 = _read(world_size, 0, batches), _read(world_size, batches, 2 * batches)
        assert sorted(epoch_1) == sorted(epoch_2) == list(range(SAMPLES))
        assert epoch_1 != epoch_2
    # the epoch's order is the same whatever the world size: rank r of a global batch takes the
    # r-th slice of it
    assert _read(2, 0, 1) == _read(1, 0, 2)
    assert [int(i) for i in _order(2, lane=1).indices(0)] == _read(1, 1, 2)


@pytest.mark.parametrize("old, new, done", [
    ((2, 1), (1, 1), 5),    # two ranks stopped after 5 steps, one rank goes on
    ((1, 1), (2, 1), 6),    # one rank stopped after 6 steps, two go on
    ((3, 1), (2, 2), 4),    # three ranks, two with gradient accumulation of 2 batches per step
])
def test_a_job_resumed_at_another_world_size_reads_the_rest_of_the_epoch_once(old, new, done):
    (old_size, old_micro), (new_size, new_micro) = old, new
    epoch = 2
    old_order = _order(old_size, micro_batches=old_micro)
    read_before = _read(old_size, 2 * old_order.batches_per_epoch, 2 * old_order.batches_per_epoch + done * old_micro)
    offset = old_order.offset(epoch, done * old_micro)
    assert offset == len(read_before)

    start = _order(new_size, micro_batches=new_micro).resumed_start(epoch, offset, new_micro)
    assert start[1] % new_micro == 0                                  # an optimizer step's first batch
    new_order = _order(new_size, micro_batches=new_micro, start=start)
    batches_left = new_order.batches_per_epoch - start[1]
    read_after = _read(new_size, 0, batches_left, micro_batches=new_micro, start=start)
    counts = Counter(read_before + read_after)
    assert set(counts) == set(range(SAMPLES))                         # nothing skipped
    assert max(counts.values()) == 1                                  # nothing twice
    # and the next epoch is a whole one at the new world size
    next_epoch = _read(new_size, batches_left, batches_left + new_order.batches_per_epoch,
                       micro_batches=new_micro, start=start)
    assert sorted(next_epoch) == list(range(SAMPLES))


def test_a_resume_whose_rest_the_new_global_batch_does_not_divide_repeats_only_in_its_last_step():
    """After 7 of one rank's batches of 4 (28 samples), two ranks need 9 steps of 8 for the 68
    left: the last step's batches run 4 past the epoch's end and wrap to its start, as the last
    step of an epoch of 100 samples over 8 per step would."""
    start = _order(2).resumed_start(0, 28)
    assert start == (0, 3, 28)
    read = _read(1, 0, 7) + _read(2, 0, 9, start=start)
    counts = Counter(read)
    assert set(counts) == set(range(SAMPLES))
    assert sorted(i for i, n in counts.items() if n > 1) == sorted(_read(1, 0, 1))   # the epoch's first 4


def test_a_host_sharded_order_permutes_the_ranks_own_shard():
    order = dali_data.ReadOrder(10, BATCH, 0, 1, 2, seed=5, first=30)
    epoch = np.concatenate([order.indices(0), order.indices(1)])
    assert set(epoch) <= set(range(30, 40)) and len(set(epoch)) == 2 * BATCH


def test_dali_reads_the_order_and_a_resumed_rank_reads_the_rest(tmp_path):
    """The real pipelines: 24 images, each its own class, so a label names its sample. Two ranks
    read two batches of 3 each; one rank, from ``resumed_start``, reads the other 12 samples of the
    epoch; a pipeline restored from a DALI checkpoint asks for the batches after it."""
    for i in range(24):
        (tmp_path / f"c{i:02d}").mkdir()
        Image.fromarray(np.full((8, 8), 10 * i, dtype=np.uint8)).save(tmp_path / f"c{i:02d}" / "0.png")
    listing = list_images(str(tmp_path))

    def labels(order, batches: int, position=None):
        pipe = dali_data.training_pipeline(listing, 3, dali_data.Decoding(None, "CHW"), order, position=position)
        read = [int(label) for _ in range(batches) for label in np.array(pipe.run()[1].as_tensor()).ravel()]
        return read, pipe

    orders = [dali_data.ReadOrder(24, 3, rank, 2, 4, seed=11) for rank in range(2)]
    before = [label for order in orders for label in labels(order, 2)[0]]
    start = dali_data.ReadOrder(24, 3, 0, 1, 8, seed=11).resumed_start(0, orders[0].offset(0, 2))
    assert start == (0, 4, 12)
    after, pipe = labels(dali_data.ReadOrder(24, 3, 0, 1, 8, seed=11, start=start), 2)
    restored, _ = labels(dali_data.ReadOrder(24, 3, 0, 1, 8, seed=11, start=start), 2, position=pipe.checkpoint())
    assert sorted(before + after + restored) == list(range(24))
    assert after + restored == [int(i) for i in np.concatenate(
        [dali_data.ReadOrder(24, 3, 0, 1, 8, seed=11, start=start).indices(b) for b in range(4)])]
