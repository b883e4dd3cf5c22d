"""The docqa env: questions about generated multi-page documents, answered through page tools.
`env.py` is the env (read it first); `documents.py` generates the documents and their questions from the
invented names, identifiers, dates and amounts of `values.py`."""

from esopt.envs.docqa.documents import DOC_TYPES, generate_document
from esopt.envs.docqa.env import DocQAConfig, DocQAEnv

__all__ = ["DOC_TYPES", "DocQAConfig", "DocQAEnv", "generate_document"]
