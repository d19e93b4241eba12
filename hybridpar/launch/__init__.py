"""Starting ranks: locally (torch's elastic agent, or forked on CPU), per node with torchrun (node_agent), and the torchrun/SLURM scripts."""
