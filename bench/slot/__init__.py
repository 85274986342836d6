"""A GPU slot spent by plan: bench/gpu_slot.py and its parts (plan, gate, runner, spend, state, pack, figures, summary, carry)."""
