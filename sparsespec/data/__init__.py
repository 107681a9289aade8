"""The data layer: benchmark loaders returning tokenized prompts fitted to a context length.

It knows tokenizers and text, never the decoding engine. A dataset is a loader named by a config's
`_target_` (loading.py); see docs/evaluation.md (Datasets, and Your own dataset).
"""

from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.loading import built_in, load_samples, loader_options, resolve_loader, score, scorer
from sparsespec.data.pg19 import pg19_books, pg19_split

__all__ = [
    "DatasetError",
    "Sample",
    "built_in",
    "load_samples",
    "loader_options",
    "pg19_books",
    "pg19_split",
    "resolve_loader",
    "score",
    "scorer",
]
