"""Automated heuristic design: LLM-written heuristics evolved (EoH, Sample) or co-evolved with ES.
Read `loops.py` first (the search loops); `tasks/` holds the problems, scored in the sandbox."""
