"""What a run shows: per-step metrics, reports, the communication trace, the text sample, the memory and activation audits."""
