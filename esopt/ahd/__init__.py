"""Automated heuristic design: LLM-written heuristics evolved (EoH, Sample) or co-evolved with ES.
Read `loops.py` first (one run: propose, score, update); `config.py` holds the settings, `proposers.py`
the Sample and EoH prompt writers, `candidates.py` scoring, `prompts.py` the prompts, `report.py` the
reports, `cli.py` the `esopt ahd` commands, and `tasks/` the problems (scored in the sandbox)."""
