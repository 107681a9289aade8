"""The sample type every loader returns, and the error every loader raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class DatasetError(ValueError):
    """A dataset could not be loaded or turned into prompts.

    The message always names what is wrong (the file, the field, the key or the option) and how to
    fix it, because the harness shows it to the user as is.
    """


@dataclass
class Sample:
    """One prompt, tokenized and fitted to the requested context length."""

    sample_id: str
    dataset: str  # "text", "pg19", "longbench", "longbench_v2", "infinitebench", "ruler"
    task: str | None
    prompt_ids: list[int]  # exactly what the model is fed
    answers: list[str] | None  # references for scoring, None for pure continuation
    max_new_tokens: int | None  # the benchmark's own generation length, if it has one
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)
