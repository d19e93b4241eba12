"""hybridpar's benchmarks: each module is one benchmark, run as `hybridpar bench NAME` or
`python -m hybridpar.benchmarks.NAME`; each writes JSON to benchmarks/results/ via results_io."""
