"""Timers, counters and the metrics computed from them (AU, throughput, latency), their
reduction over ranks and the files and tables they are reported in."""
