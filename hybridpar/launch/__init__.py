"""Starting ranks: locally under torch's elastic agent, per node with torchrun (node_agent), and the torchrun/SLURM scripts."""
