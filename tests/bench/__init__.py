"""The benchmark (bench/): txstream bench, and its CPU counters."""
