"""hybridpar: hybrid 3D-parallel LLM training, DP outermost, ZeRO on the DP axis."""

__version__ = "0.1.0"
