"""Tools of the text envs: `calculator.py` (safe exact arithmetic) and `actions.py` (reading a reply
as a tool call or a final answer)."""
