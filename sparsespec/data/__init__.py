"""The data layer: benchmark loaders returning tokenized prompts fitted to a context length.

It knows tokenizers and text, never the decoding engine. See docs/evaluation.md (Datasets).
"""

from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.pg19 import pg19_books, pg19_split
from sparsespec.data.registry import LOADERS, load_samples, loader_options, score

__all__ = [
    "LOADERS",
    "DatasetError",
    "Sample",
    "load_samples",
    "loader_options",
    "pg19_books",
    "pg19_split",
    "score",
]
