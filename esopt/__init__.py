"""esopt: fine-tune LLM agents with evolution strategies (Agentic ESOpt)."""

__version__ = "0.1.0"
