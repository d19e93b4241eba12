"""ZeRO's partition rules without a process: which DP rank steps which elements, as DeepSpeed lays
them out (hybridpar/zero/partitions.py), and the partition size the memory audit counts
(hybridpar/observe/memory_audit.py; its bytes against DeepSpeed's: tests/integration/test_memory_audit.py)."""


def test_partition_pieces_follow_deepspeeds_flat_layout():
    """Which DP rank steps which elements (hybridpar/zero/partitions.py), read from DeepSpeed's
    layout: parameters flattened in order with alignment padding after each, cut into equal
    partitions. Here 3 parameters of 5, 2 and 6 elements, each padded to a multiple of 4 but the
    last (offsets 0, 8, 12), 18 elements cut into 2 partitions of 9 (the last 0-padded)."""
    from types import SimpleNamespace

    import torch

    from hybridpar.zero.partitions import partition_pieces

    a, b, c = torch.zeros(5), torch.zeros(2), torch.zeros(2, 3)
    opt = SimpleNamespace(round_robin_bit16_groups=[[a, b, c]], round_robin_bit16_offsets=[[0, 8, 12]],
                          partition_size=[9])
    pieces = partition_pieces(opt)
    runs = {name: [(pc.start, pc.length, pc.owner, pc.offset) for pc in pieces[p]] for name, p in zip("abc", (a, b, c))}
    assert runs["a"] == [(0, 5, 0, 0)]                   # flat [0, 5): rank 0
    assert runs["b"] == [(0, 1, 0, 8), (1, 1, 1, 0)]     # flat [8, 10): cut by the partition edge at 9
    assert runs["c"] == [(0, 6, 1, 3)]                   # flat [12, 18): rank 1 at 3
    covered = sorted((pc.owner, pc.offset, pc.length) for runs_ in pieces.values() for pc in runs_)
    assert sum(length for _, _, length in covered) == 5 + 2 + 6  # every element exactly once


def test_zero_partition_rule():
    from hybridpar.observe.memory_audit import zero_partition

    assert zero_partition(12, 3) == 4  # 12 is a multiple of 2 x 3: no padding
    assert zero_partition(13, 3) == 6  # padded to 18
    assert zero_partition(1, 64) == 2  # one element still costs every rank 2
    assert zero_partition(56320, 3) == 18774
