"""The step: one packed batch of prefill chunks and decode tokens through the model, on a backend.

batch.py (what a step holds) -> plan.py (graph buckets) -> buffers.py (its device arrays) ->
kernels.py (which kernel serves each op) -> forward.py (the ops in order); kv_pool.py holds the
paged K/V, weights.py the weights on the device. The engine above decides what goes in a step;
the ops below launch the kernels.
"""
