"""Collection: the backends and the kernel parsers they read with, Kubernetes and Slurm
attribution, the hub that runs them and publishes snapshots, the merge, the energy split
and the health verdicts. Imports only the core."""
