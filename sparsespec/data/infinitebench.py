"""``dataset=infinitebench``: InfiniteBench (hub ``xinrongzhang2022/InfiniteBench``).

Tasks: passkey, number_string, kv_retrieval, longbook_qa_eng, longbook_choice_eng,
longbook_sum_eng, math_find, code_debug. Prompt templates are the official ones (src/prompt.py):
the GPT-4 family when the prompt goes through a chat template, the Yarn-Mistral family (ending in
an answer cue such as "The pass key is") for raw prompts; ``template=chat|base`` overrides the
choice. Generation lengths and scorers follow src/eval_utils.py and src/compute_scores.py.

Without ``dataset.path`` the three retrieval tasks are generated procedurally at exactly ``ctx``
tokens, offline and deterministic for a ``seed``, in the official construction
(data/construct_synthetic_dataset.py): the repeated "The grass is green..." noise with one pass key
or digit string at ``depth``, or a JSON object of random UUID pairs with the asked key at
``depth``. The book/code/math tasks need data: the hub id or a directory of ``<task>.jsonl``.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterator
from typing import Any

from sparsespec.data import metrics, synthetic
from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.prompts import Frame, Prompt, chat_template_active, encode, fit_prompts, make_frame
from sparsespec.data.sources import load_rows, pick_task_files, resolve, row_error

HUB_ID = "xinrongzhang2022/InfiniteBench"
TASKS = (
    "passkey", "number_string", "kv_retrieval", "longbook_qa_eng", "longbook_choice_eng",
    "longbook_sum_eng", "math_find", "code_debug",
)  # fmt: skip
SYNTHETIC = ("passkey", "number_string", "kv_retrieval")
CHOICE_TASKS = ("longbook_choice_eng", "code_debug")
MAX_NEW_TOKENS = {
    "passkey": 6, "number_string": 12, "kv_retrieval": 50, "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40, "longbook_qa_eng": 40, "math_find": 3, "code_debug": 5,
}  # fmt: skip
DEFAULT_SAMPLES = 10
REQUIRED = ("id", "context", "input", "answer")

_FIND = "There is an important info hidden inside a lot of irrelevant text. Find it"
_PASSKEY_HEAD = _FIND + " and memorize them. I will quiz you about the important information there.\n\n"
_NUMBER_HEAD = _FIND + ". I will quiz you about the important information there.\n\n"
_KV_HEAD = "Extract the value corresponding to the specified key in the JSON object below.\n\n"
_OPTIONS = "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}"

CHAT_TEMPLATES = {  # the official gpt4_templates
    "passkey": _PASSKEY_HEAD + "{context}\n\n{input}",
    "number_string": _NUMBER_HEAD + "{context}\n\n{input}",
    "kv_retrieval": _KV_HEAD + "{context}\n\n{input}",
    "longbook_qa_eng": "Read the book below and answer a question.\n\n{context}\n\nQuestion: {question}\n\nBe very concise.",
    "longbook_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n\nOnly one of the following "
        "options is correct, tell me the answer using one single letter (A, B, C, or D). Don't say anything else.\n"
        + _OPTIONS
    ),
    "longbook_sum_eng": "Summarize the following book.\n\n{context}",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "code_debug": (
        "There is ONLY ONE function in the large project that is deliberately made to include an obvious error. "
        "Please find the function that contains the most obvious errors. I will give you four options to narrow "
        "your scope. You can inspect through the options and think. Eventually, tell me the answer using one "
        "single letter (A, B, C, or D).\n\n{context}\n\nWhich funtion has deliberate error?\n" + _OPTIONS
        + "\n\nYou should first find the functions in the options. Repeat their content, inspect through code, and "
        "at last give me your answer for the function that has the deliberate and obvious error in A, B, C, or D."
    ),
}
BASE_TEMPLATES = {  # the official yarn_mistral_templates, for models fed raw text
    "passkey": _PASSKEY_HEAD + "{context}\n\n{input}\n\nThe pass key is",
    "number_string": _NUMBER_HEAD + "{context}\n\n{input}\n\nThe sequence of digits is",
    "kv_retrieval": _KV_HEAD + "{context}\n\n{input}",
    "longbook_qa_eng": (
        "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\n"
        "Question: {question}\nAnswer:"
    ),
    "longbook_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n" + _OPTIONS
        + "\n\nThe letter of the correct answer is"
    ),
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "code_debug": (
        "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes "
        "it crash.\n\n{context}\n\nOptions:\n" + _OPTIONS + "\n\nThe correct option is:"
    ),
}

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
NUMBER_NEEDLE = "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n"
QUESTIONS = {"passkey": "What is the pass key?", "number_string": "What is the sequence of digits?"}
KV_INPUT = 'Key: "{key}"\nThe value associated with the specified key is: '
_CTX = "\x00CONTEXT\x00"


def _templates(tokenizer: Any, use_chat_template: bool, template: str) -> dict[str, str]:
    if template == "auto":
        return CHAT_TEMPLATES if chat_template_active(tokenizer, use_chat_template) else BASE_TEMPLATES
    if template == "chat":
        return CHAT_TEMPLATES
    if template == "base":
        return BASE_TEMPLATES
    raise DatasetError(f"option template={template!r} for infinitebench: use auto, chat or base")


def _split_template(template: str, **fields: str) -> tuple[str, str]:
    head, tail = template.format(context=_CTX, **fields).split(_CTX)
    return head, tail


# ---------------------------------------------------------------------------------------------
# procedural retrieval tasks
# ---------------------------------------------------------------------------------------------


def _digits(rng: random.Random, task: str) -> str:
    if task == "passkey":
        return "".join(str(rng.randint(0, 9)) for _ in range(5))
    # number_string: 5 digits, then 5 of them repeated in place (the official construction)
    keys = [str(rng.randint(0, 9)) for _ in range(5)]
    for k in range(5):
        pos = rng.randint(0, 5 + k - 1)
        keys.insert(pos, keys[pos])
    return "".join(keys)


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _one_token_pad(tokenizer: Any) -> list[int] | None:
    """A whitespace piece that is one token, to pad JSON to the exact length (JSON allows it)."""
    for piece in (" ", "\n", "\t"):
        ids = encode(tokenizer, piece)
        if len(ids) == 1:
            return ids
    return None


def _kv_prompt(tokenizer: Any, ctx: int, frame: Frame, template: str, depth: float, rng: random.Random) -> tuple[list[int], str, str, int]:
    key, value = _uuid(rng), _uuid(rng)
    head, tail = _split_template(template, input=KV_INPUT.format(key=key))
    head_ids = encode(tokenizer, head + "JSON data:\n{")
    tail_ids = encode(tokenizer, "}" + tail)
    sep = encode(tokenizer, ", ")
    asked = encode(tokenizer, f'"{key}": "{value}"')
    room = frame.budget(ctx) - len(head_ids) - len(tail_ids) - len(asked)
    if room < 0:
        raise DatasetError(f"ctx={ctx} is too small for kv_retrieval; use a larger ctx")
    entries: list[list[int]] = []
    used = 0
    while True:
        entry = encode(tokenizer, f'"{_uuid(rng)}": "{_uuid(rng)}"')
        if used + len(sep) + len(entry) > room:
            break
        entries.append(entry)
        used += len(sep) + len(entry)
    where = round(depth * len(entries))
    entries.insert(where, asked)
    pad = _one_token_pad(tokenizer)
    short = room - used
    body: list[int] = []
    for j, entry in enumerate(entries):
        if j:
            body += sep
            # Spread the leftover tokens as whitespace after the separators (valid JSON).
            if pad and short > 0:
                extra = -(-short // (len(entries) - j))
                body += pad * extra
                short -= extra
        body += entry
    if pad and short > 0:
        body = pad * short + body
    return frame.wrap(head_ids + body + tail_ids), key, value, where


def generate(
    tokenizer: Any, ctx: int, task: str, n: int, seed: int, depths: list[float], use_chat_template: bool, template: str
) -> list[Sample]:
    tmpl = _templates(tokenizer, use_chat_template, template)[task]
    frame = make_frame(tokenizer, use_chat_template)
    samples = []
    for i in range(n):
        rng = random.Random(f"infinitebench:{task}:{seed}:{i}")
        meta: dict[str, Any] = {"generated": True, "chat_template": frame.chat, "truncated": False, "requested_depth": depths[i]}
        if task == "kv_retrieval":
            ids, key, answer, where = _kv_prompt(tokenizer, ctx, frame, tmpl, depths[i], rng)
            meta.update(key=key, entry_index=where)
        else:
            answer = _digits(rng, task)
            head, tail = _split_template(tmpl, input=QUESTIONS[task])
            needle = (PASSKEY_NEEDLE if task == "passkey" else NUMBER_NEEDLE).format(key=answer)
            built = synthetic.build(
                tokenizer, ctx, frame, head, tail, synthetic.noise_haystack(tokenizer, NOISE), [(depths[i], needle)],
                prefer_lines=True,
            )
            ids = built.ids
            meta.update(depth=round(built.depths[0], 4), needle_positions=built.needle_positions)
        samples.append(Sample(f"infinitebench/{task}/{i:04d}", "infinitebench", task, ids, [answer], MAX_NEW_TOKENS[task], meta))
    return samples


# ---------------------------------------------------------------------------------------------
# rows from files or the hub
# ---------------------------------------------------------------------------------------------


def _hub_kwargs() -> dict[str, Any]:
    from datasets import Features, Sequence, Value

    # The hub files mix types across tasks; the dataset card loads them with these features.
    features = Features({
        "id": Value("int64"), "context": Value("string"), "input": Value("string"),
        "answer": Sequence(Value("string")), "options": Sequence(Value("string")),
    })  # fmt: skip
    return {"features": features}


def _answers(row: dict[str, Any], i: int, task: str) -> list[str]:
    raw = row["answer"]
    answers = [str(a) for a in raw] if isinstance(raw, list) else [str(raw)]
    if not answers:
        raise row_error(row, i, "field 'answer' is empty")
    if task not in CHOICE_TASKS:
        return answers
    options = row.get("options")
    if not isinstance(options, list) or len(options) != 4:
        raise row_error(row, i, f"field 'options' must list 4 options for {task}, got {options!r:.80}")
    if len(answers) == 2 and answers[1] in ("A", "B", "C", "D"):
        return answers
    if answers[0] in options:
        return [answers[0], "ABCD"[options.index(answers[0])]]
    if answers[0] in ("A", "B", "C", "D"):
        return [str(options["ABCD".index(answers[0])]), answers[0]]
    raise row_error(row, i, f"field 'answer' {answers[0]!r:.60} is not one of the options")


def _format(row: dict[str, Any], task: str, template: str) -> str:
    fields: dict[str, str] = {"context": row["context"], "input": row["input"], "question": row["input"]}
    if task in CHOICE_TASKS:
        fields.update({f"OPTION_{c}": str(o) for c, o in zip("ABCD", row["options"], strict=True)})
    if task == "math_find":
        found = re.findall(r"The \w+ number", row["input"])
        fields["prefix"] = f"What is {found[0].lower()} in the following list?" if found else ""
    return template.format(**fields)


def _from_rows(
    tokenizer: Any, ctx: int, task: str, path: str, split: str, limit: int | None, use_chat_template: bool, template: str
) -> list[Sample]:
    source = pick_task_files(resolve(path), task)
    required = REQUIRED + (("options",) if task in CHOICE_TASKS else ())
    rows = load_rows(
        source, required, hub_split=task, hub_kwargs=_hub_kwargs() if source.hub_id else None,
        hint="InfiniteBench rows have id, context, input, answer (a list) and options.",
    )
    tmpl = _templates(tokenizer, use_chat_template, template)[task]
    frame = make_frame(tokenizer, use_chat_template)
    return fit_prompts(_prompts(rows, task, tmpl), "infinitebench", task, tokenizer, ctx, frame, limit)


def _prompts(rows: list[dict], task: str, tmpl: str) -> Iterator[Prompt]:
    for i, row in enumerate(rows):
        answers = _answers(row, i, task)
        if not isinstance(row["context"], str) or not isinstance(row["input"], str):
            raise row_error(row, i, "fields 'context' and 'input' must be strings")
        meta = {"choices": dict(zip("ABCD", row["options"], strict=True))} if task in CHOICE_TASKS else {}
        yield Prompt(f"infinitebench/{task}/{row['id']}", _format(row, task, tmpl), answers, MAX_NEW_TOKENS[task], meta)


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    split: str = "test",
    seed: int = 0,
    use_chat_template: bool = True,
    template: str = "auto",
    depth: Any = None,
    num_samples: int | None = None,
) -> list[Sample]:
    task = task or "passkey"
    if task not in TASKS:
        raise DatasetError(f"dataset.task={task!r} for infinitebench: use one of {', '.join(TASKS)}")
    if path is None:
        if task not in SYNTHETIC:
            raise DatasetError(
                f"infinitebench task {task} needs data: dataset.path={HUB_ID} (hub) or a directory with {task}.jsonl; "
                f"only {', '.join(SYNTHETIC)} are generated offline"
            )
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
            raise DatasetError(f"option num_samples={num_samples!r}: use an integer >= 1")
        n = num_samples or limit or DEFAULT_SAMPLES
        n = min(n, limit) if limit is not None else n
        return generate(tokenizer, ctx, task, n, seed, synthetic.parse_depths(depth, n), use_chat_template, template)
    return _from_rows(tokenizer, ctx, task, path, split, limit, use_chat_template, template)


def score(sample: Sample, prediction: str) -> float | None:
    if not sample.answers:
        return None
    task, answers = sample.task, sample.answers
    if task in ("passkey", "number_string"):
        return float(metrics.first_int(prediction) == answers[0])
    if task == "kv_retrieval":
        return metrics.kv_match(prediction, answers[0])
    if task == "longbook_qa_eng":
        return max(metrics.qa_f1(prediction, a) for a in answers)
    if task == "longbook_sum_eng":
        return metrics.rouge_lsum(prediction, answers[0])
    if task == "longbook_choice_eng":
        return metrics.choice_match(prediction, answers)
    if task == "code_debug":
        return metrics.code_debug_match(prediction, answers)
    if task == "math_find":
        return metrics.math_find_match(prediction, answers[0])
    raise DatasetError(f"infinitebench sample {sample.sample_id}: unknown task {task!r}")
