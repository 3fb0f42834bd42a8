"""The application: the command line and its flags, the daemon that builds and wires the
layers, reload, the run record and the container health check."""
