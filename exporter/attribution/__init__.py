"""Attribution: which pod or Slurm job holds each GPU and each GPU process
(``kubernetes``, ``slurm``). Imports ``core`` and the sources' contract only."""
