"""A step whose loss or gradient norm is not finite ends the run (``hybridpar train`` exits 6).

Once a NaN or an infinity reaches the loss or the gradients, AdamW writes it into every weight it
touches and each later step trains garbage, often silently (a NaN loss prints as ``nan`` in a line
nobody reads). Both values are known on every rank after the step (the loss from the step's
all-reduce, the global gradient norm from the optimizer), so every rank decides alike, without a
collective. The run stops before the step is logged, evaluated or saved: its weights are not
written anywhere, and the newest checkpoint is from before it. Megatron-LM's
``--check-for-nan-in-loss-and-grad`` stops the same way (with a traceback).
"""
from __future__ import annotations

import math

EXIT_CODE = 6


class NonFiniteError(RuntimeError):
    def __init__(self, step: int, loss: float, grad_norm: float):
        self.step, self.loss, self.grad_norm = step, loss, grad_norm
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        super().__init__(f"step {step}: the {what} is {loss if what == 'loss' else grad_norm} (loss {loss}, grad norm "
                         f"{grad_norm}): training diverged, and the weights after step {step} are not saved; resume "
                         f"from the newest checkpoint (--resume auto) with a lower train.lr or more warm-up, or skip "
                         f"the data of step {step}")


def check_step(m) -> None:
    """Raise NonFiniteError when step ``m`` (runtime.job.StepMetrics) has a non-finite loss or grad norm."""
    if not (math.isfinite(m.loss) and math.isfinite(m.grad_norm)):
        raise NonFiniteError(m.step, m.loss, m.grad_norm)
