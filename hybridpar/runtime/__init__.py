"""The training runtime: process-group mesh, the megatron-core model and its initial weights, attention, pipeline schedules, the step loop."""
