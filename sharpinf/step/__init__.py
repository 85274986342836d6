"""The step: one packed batch of prefill chunks and decode tokens through the model, on a backend.

batch.py (what a step holds) -> plan.py (graph buckets) -> buffers.py (its device arrays) ->
kernels.py (which kernel serves each op) -> launches.py (a step's launches in order) -> forward.py
(the step API: submit, forward, sample); beside it slots.py (per-slot sampling state), shapes.py
(the attention's launch shape), binding.py (the bound KV pool's descriptor), dry_run.py (what a
step launches, compiled ahead), graphs.py (capture) and pending.py (a submitted step). kv_pool.py
holds the paged K/V, weights.py the weights on the device. The engine above decides what goes in a
step; the ops below launch the kernels.
"""
