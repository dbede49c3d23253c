"""Socket runners: the only part of the package with sockets, threads and timeouts."""
