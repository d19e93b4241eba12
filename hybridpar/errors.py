"""Errors that the command line reports as one line with exit code 2 (no traceback)."""
from hybridpar.topology.layout import LayoutError
from hybridpar.topology.models import ModelSpecError
from hybridpar.topology.plan import PlanError


class UsageError(ValueError):
    """Bad input from the user: the message names the problem and the fix."""


# Every error class whose message is meant for the user as-is.
USER_ERRORS = (UsageError, LayoutError, ModelSpecError, PlanError)
