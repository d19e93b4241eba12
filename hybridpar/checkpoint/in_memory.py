"""A checkpoint held in memory: rank payloads (``save.rank_payload``) read like files on disk.

Replica-loss recovery (reliability/replica_loss.py) gathers, for each pipeline/TP position, the
payloads of every ZeRO partition of the last complete step (the survivors' own, the lost
replica's from the copies its neighbours kept) and loads them into the rebuilt, smaller or larger
job through the same ``load.load_into`` as a checkpoint on disk: the fragment format does not
depend on DP size or ZeRO stage, so any DP size reads it.
"""
from __future__ import annotations

from types import SimpleNamespace

from hybridpar.checkpoint.reshard import CheckpointReader


class MemoryCheckpoint(CheckpointReader):
    def __init__(self, step: int, tp: int, payloads: list[dict], metas: dict, indexes: list[list]):
        """``payloads[i]`` with its fragment index ``indexes[i]`` ([cname, tp_rank, pp_rank, start,
        numel] rows); ``metas``: canonical name -> {full_shape, split, gated}."""
        files = {f"mem-{i:05d}": {"fragments": index} for i, index in enumerate(indexes)}
        adam_steps = {p["adam_step"] for p in payloads}
        if len(adam_steps) > 1:
            raise RuntimeError(f"the payloads disagree on AdamW's step count: {sorted(adam_steps)}")
        self.manifest = SimpleNamespace(step=step, save_id="memory", plan={"tp": tp}, params=metas,
                                        adam_step=adam_steps.pop() if adam_steps else 0,
                                        rank_files=lambda: files)
        self.step_dir = f"<state of step {step} in memory>"
        self.tp = tp
        self._open = {name: payload for name, payload in zip(files, payloads)}
        index: dict[tuple, dict[int, list]] = {}
        for name, rows in files.items():
            for cname, tp_rank, pp_rank, start, n in rows["fragments"]:
                index.setdefault((cname, tp_rank), {}).setdefault(pp_rank, []).append((name, start, n))
        self._index = {key: by_pp[min(by_pp)] for key, by_pp in index.items()}

    def file(self, name: str) -> dict:
        return self._open[name]
