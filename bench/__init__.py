"""The measuring apparatus: `bench/suites/` are the suites `sharpinf bench` runs, the scripts beside
them the GPU runbooks and profiling tools, and `bench/results/` what they measured, dated."""
