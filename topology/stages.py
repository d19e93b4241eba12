"""What each pipeline rank holds: transformer layers, embedding, output layer, and parameters.

Pure arithmetic on a Plan; memory.py and cost.py both read it. Parameters are counted per
tensor-parallel rank: attention and MLP matrices and the vocabulary are split over TP, norm
weights are replicated.
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import Plan


@dataclass(frozen=True)
class Stage:
    rank: int  # pipeline rank 0..pp-1
    layers: int  # transformer layers on this rank (all its virtual chunks together)
    has_embedding: bool
    has_output: bool  # output layer (logits) and the loss

    @property
    def name(self) -> str:
        if self.has_embedding and self.has_output:
            return "only stage"
        return "first stage" if self.has_embedding else ("last stage" if self.has_output else f"stage {self.rank}")


def stages(plan: Plan) -> list[Stage]:
    """The distinct pipeline ranks that can be the largest: first, one middle, last."""
    m, p = plan.model, plan.pp
    if p == 1:
        return [Stage(0, m.layers, True, True)]
    per_rank = (m.layers + 2) // p if plan.lighter_end_stages else m.layers // p
    end = per_rank - 1 if plan.lighter_end_stages else per_rank
    out = [Stage(0, end, True, False)]
    if p > 2:
        out.append(Stage(1, per_rank, False, False))
    out.append(Stage(p - 1, end, False, True))
    return out


def layer_params_per_rank(plan: Plan) -> float:
    m, t = plan.model, plan.tp
    return (m.attention_params_per_layer + m.mlp_params_per_layer) / t + 2 * m.hidden


def params_per_rank(plan: Plan, stage: Stage) -> float:
    m, t = plan.model, plan.tp
    n = stage.layers * layer_params_per_rank(plan)
    if stage.has_embedding:
        n += m.embedding_params / t
    if stage.has_output:
        # Tied embeddings still keep a copy of the matrix on the last stage when pp > 1.
        if not (m.tied_embeddings and stage.has_embedding):
            n += m.embedding_params / t
        n += m.hidden  # final norm
    return n
