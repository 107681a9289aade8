"""Fitting prompts to a context length, in token ids.

Every loader ends here: the result is the exact list of ids the model is fed, never longer than
``ctx``. Two shapes exist:

* QA-style prompts (LongBench, LongBench v2, InfiniteBench files) are tokenized whole and, when too
  long, cut in the middle: the first half and the last half of the budget are kept, as LongBench's
  and InfiniteBench's official code do, because the instruction sits at the start and the question
  at the end. The official code decodes the kept halves and re-encodes them, which can change the
  token count by a few; we cut the ids directly so the prompt hits the budget exactly.
* Generated prompts (synthetic tasks, continuation windows) are built from token ids so they hit
  ``ctx`` exactly.

A chat template, when the tokenizer has one and ``use_chat_template`` is set, wraps the (already
fitted) content as one user message with the generation prompt; its tokens are taken out of the
budget first, so the wrapped prompt still fits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sparsespec.data.base import DatasetError, Sample

# Stands in for the user message while the chat template is rendered; the text around it is the
# template's own. It has no whitespace so templates that trim the content keep it whole.
_SENTINEL = "@@SPARSESPEC_USER_CONTENT_7f3a@@"


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (pieces are joined by the caller)."""
    if not text:
        return []
    # verbose=False: long documents are expected here; the "longer than model_max_length" warning
    # is noise because we fit the ids ourselves.
    return list(tokenizer(text, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"])


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts in front of a text by itself (BOS for Llama-style tokenizers).

    Only the leading special tokens are kept: a trailing EOS, which some tokenizers append, would
    tell the model the prompt is over before it starts generating.
    """
    probe = "a"
    plain = encode(tokenizer, probe)
    full = list(tokenizer(probe, add_special_tokens=True, return_attention_mask=False)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i]
    return []


def chat_template_active(tokenizer: Any, use_chat_template: bool) -> bool:
    return bool(use_chat_template) and getattr(tokenizer, "chat_template", None) is not None


@dataclass(frozen=True)
class Frame:
    """The ids that go before and after the content: BOS or the chat template, answer prefix."""

    before: tuple[int, ...]
    after: tuple[int, ...]
    chat: bool

    @property
    def overhead(self) -> int:
        return len(self.before) + len(self.after)

    def budget(self, ctx: int) -> int:
        """Tokens left for the content when the whole prompt must fit in ``ctx``."""
        left = int(ctx) - self.overhead
        if left <= 0:
            raise DatasetError(
                f"ctx={ctx} leaves no room for the prompt: the {'chat template' if self.chat else 'BOS/answer prefix'} "
                f"alone takes {self.overhead} tokens; use a larger ctx"
            )
        return left

    def wrap(self, content: list[int]) -> list[int]:
        return [*self.before, *content, *self.after]


def make_frame(tokenizer: Any, use_chat_template: bool, answer_prefix: str = "") -> Frame:
    """The frame for this tokenizer: the chat template (one user turn + generation prompt) when it
    has one and ``use_chat_template`` is set, else the tokenizer's own leading special tokens.

    ``answer_prefix`` (RULER's "The special magic numbers ... are") is appended after the
    generation prompt, where RULER puts it for chat models.
    """
    tail = encode(tokenizer, answer_prefix)
    if not chat_template_active(tokenizer, use_chat_template):
        return Frame(tuple(special_prefix(tokenizer)), tuple(tail), chat=False)
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
        )
    except Exception as e:  # a template that needs a system turn, bad Jinja, ...
        raise DatasetError(
            f"the tokenizer's chat template could not render one user message ({type(e).__name__}: {e}); "
            "set dataset.use_chat_template=false to feed raw prompts"
        ) from e
    if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
        raise DatasetError(
            "the tokenizer's chat template does not place the user message verbatim once; "
            "set dataset.use_chat_template=false to feed raw prompts"
        )
    pre, post = rendered.split(_SENTINEL)
    # Like apply_chat_template(tokenize=True): the template text carries its own BOS if it needs one.
    return Frame(tuple(encode(tokenizer, pre)), tuple(encode(tokenizer, post) + tail), chat=True)


def middle_truncate(ids: list[int], budget: int) -> list[int]:
    """Keep the first ``budget // 2`` and the last ``budget - budget // 2`` ids (LongBench's rule)."""
    if len(ids) <= budget:
        return list(ids)
    head = budget // 2
    tail = budget - head
    return list(ids[:head]) + (list(ids[-tail:]) if tail else [])


@dataclass
class Fitted:
    ids: list[int]
    natural_tokens: int  # the prompt's length before truncation (frame included)
    truncated: bool


def fit_text(tokenizer: Any, text: str, ctx: int, frame: Frame) -> Fitted:
    """Tokenize a QA-style prompt and middle-truncate it so the framed prompt is at most ``ctx``.

    A prompt shorter than ``ctx`` is kept at its natural length (never padded): a QA sample is
    defined by its document, and padding would change the task.
    """
    budget = frame.budget(ctx)
    ids = encode(tokenizer, text)
    natural = len(ids) + frame.overhead
    truncated = len(ids) > budget
    return Fitted(frame.wrap(middle_truncate(ids, budget)), natural, truncated)


@dataclass
class Prompt:
    """What a QA loader makes of one row: the prompt text to fit, and the sample's own fields."""

    sample_id: str
    text: str
    answers: list[str] | None
    max_new_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def fit_prompts(prompts: Iterable[Prompt], dataset: str, task: str | None, tokenizer: Any, ctx: int, frame: Frame,
                limit: int | None = None) -> list[Sample]:
    """The first ``limit`` prompts fitted to ``ctx`` inside ``frame`` (fit_text), as samples whose
    meta records the truncation and the chat template. Prompts are drawn one at a time, so a bad row
    past the limit is never read."""
    samples: list[Sample] = []
    rows = iter(prompts)
    while limit is None or len(samples) < limit:
        p = next(rows, None)
        if p is None:
            break
        fitted = fit_text(tokenizer, p.text, ctx, frame)
        meta = {"truncated": fitted.truncated, "natural_tokens": fitted.natural_tokens, "chat_template": frame.chat,
                **p.meta}
        samples.append(Sample(p.sample_id, dataset, task, fitted.ids, p.answers, p.max_new_tokens, meta))
    return samples


def take_tokens(tokenizer: Any, text: str, n: int, start_char: int = 0) -> list[int]:
    """The first ``n`` token ids of ``text[start_char:]`` (fewer when the text ends first).

    Only a slice somewhat longer than needed is tokenized, grown until it yields ``n`` tokens with a
    margin, so a 1 MB book is not tokenized whole for a 4K window. The margin keeps the last kept
    token clear of the slice's cut, which may split a word.
    """
    margin = 16
    if n <= 0:
        return []
    length = max(256, int(n * 4.5) + 256)
    while True:
        piece = text[start_char : start_char + length]
        ids = encode(tokenizer, piece)
        if len(ids) >= n + margin or start_char + length >= len(text):
            return ids[:n]
        length = max(length * 2, int(length * (n + margin) / max(len(ids), 1)) + 256)


def align_to_boundary(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that starts a line (or a word), so a window never
    begins inside a word."""
    if pos <= 0:
        return 0
    nl = text.find("\n", pos, pos + 2000)
    if nl != -1:
        return nl + 1
    sp = text.find(" ", pos, pos + 200)
    return sp + 1 if sp != -1 else pos
