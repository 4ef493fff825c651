"""What the step loop measured (the epoch trace) and what is computed from it: AU, throughput
and latency, the time series (intervals) and the per-request trace, reduced over the ranks."""
