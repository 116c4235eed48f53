"""The job's key-value store: hosting a torch TCPStore on a socket rankguard bound, every store
call bounded by its caller's deadline, and the run's secret on every value a rank acts on."""
