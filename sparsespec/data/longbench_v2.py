"""``dataset=longbench_v2``: LongBench v2 multiple choice (hub ``THUDM/LongBench-v2``).

The prompt is the official zero-shot template (prompts/0shot.txt); the answer letter is extracted
from the response (metrics.extract_choice). ``task`` filters rows: ``short`` / ``medium`` / ``long``
(length group), ``easy`` / ``hard`` (difficulty), or several joined by commas (``long,hard``).
The hub dataset has a single split, ``train``, which holds the whole benchmark; it is used whatever
``split`` says. Local data: the official ``data.json`` (a JSON array) or jsonl/parquet with the
same fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.metrics import extract_choice
from sparsespec.data.prompts import Prompt, fit_prompts, make_frame
from sparsespec.data.sources import Source, load_rows, resolve, row_error

HUB_ID = "THUDM/LongBench-v2"
HUB_SPLIT = "train"
MAX_NEW_TOKENS = 128  # the official pred.py's budget without chain-of-thought
TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
CHOICES = ("A", "B", "C", "D")
REQUIRED = ("_id", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context")
LENGTHS = ("short", "medium", "long")
DIFFICULTIES = ("easy", "hard")


def build_prompt(row: dict[str, Any]) -> str:
    text = TEMPLATE.replace("$Q$", row["question"].strip())
    for c in CHOICES:
        text = text.replace(f"$C_{c}$", row[f"choice_{c}"].strip())
    # The document goes in last so a "$Q$" inside it is never replaced.
    return text.replace("$DOC$", row["context"].strip())


def _filters(task: str | None) -> list[tuple[str, str]]:
    if task is None:
        return []
    out = []
    for part in (p.strip() for p in str(task).split(",")):
        if part in LENGTHS:
            out.append(("length", part))
        elif part in DIFFICULTIES:
            out.append(("difficulty", part))
        else:
            raise DatasetError(
                f"dataset.task={task!r} for longbench_v2: use {', '.join(LENGTHS + DIFFICULTIES)} or a comma list"
            )
    return out


def _prompts(rows: list[dict], task: str | None) -> Iterator[Prompt]:
    for i, row in enumerate(rows):
        answer = str(row["answer"]).strip()
        if answer not in CHOICES:
            raise row_error(row, i, f"field 'answer' must be one of A, B, C, D, got {row['answer']!r}")
        for key in REQUIRED[1:]:
            if not isinstance(row[key], str):
                raise row_error(row, i, f"field {key!r} must be a string, got {type(row[key]).__name__}")
        meta = {"choices": {c: row[f"choice_{c}"] for c in CHOICES},
                **{k: row.get(k) for k in ("domain", "sub_domain", "difficulty", "length")}}
        yield Prompt(f"longbench_v2/{row['_id']}", build_prompt(row), [answer], MAX_NEW_TOKENS, meta)


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    use_chat_template: bool = True,
) -> list[Sample]:
    filters = _filters(task)
    source = resolve(path) if path is not None else Source([], hub_id=HUB_ID)
    hint = "LongBench v2 rows have _id, question, choice_A..choice_D, answer (a letter), context, length, difficulty."
    rows = load_rows(source, REQUIRED, hub_split=HUB_SPLIT, hint=hint)
    for field, _ in filters:
        lacking = next((r for r in rows if field not in r), None)
        if lacking is not None:
            raise DatasetError(
                f"{lacking['__file__']}: missing field {field!r}, needed by dataset.task={task!r}; "
                f"found fields: {', '.join(k for k in lacking if k != '__file__')}. {hint}"
            )
    rows = [r for r in rows if all(r.get(f) == v for f, v in filters)]
    frame = make_frame(tokenizer, use_chat_template)
    samples = fit_prompts(_prompts(rows, task), "longbench_v2", task, tokenizer, ctx, frame, limit)
    if not samples and filters:
        raise DatasetError(f"{source.label}: no row matches dataset.task={task!r}")
    return samples


def score(sample: Sample, prediction: str) -> float | None:
    if not sample.answers:
        return None
    return float(extract_choice(prediction) == sample.answers[0])
