"""``dataset=longbench``: LongBench v1 (hub ``THUDM/LongBench``), one task per run.

The prompt templates (dataset2prompt), generation lengths (dataset2maxlen) and metrics
(dataset2metric) follow the official repository. Prompts longer than ``ctx`` are cut in the middle
(prompts.fit_text). As in the official pred.py, the few-shot and code-completion tasks (trec,
triviaqa, samsum, lsht, lcc, repobench-p) are fed without the chat template, since chat models do
better on them as raw continuations.

Local data: the official ``data.zip`` unpacks to ``data/<task>.jsonl``; pass that directory (or one
file) as ``dataset.path``. LongBench-E subsets are the task names with ``_e``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sparsespec.data import metrics
from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.prompts import Prompt, fit_prompts, make_frame
from sparsespec.data.sources import Source, load_rows, pick_task_files, resolve, row_error

HUB_ID = "THUDM/LongBench"

_PASSAGES = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\n"
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nQuestion: {input}\nAnswer:"
)
_QASPER_RULES = (
    "as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered "
    'based on the information in the article, write "unanswerable". If the question is a yes/no question, answer '
    '"yes", "no", or "unanswerable". Do not provide any explanation.'
)

DATASET2PROMPT: dict[str, str] = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "as concisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\nNow, answer the question based on the story as concisely as you can, using a single "
        "phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question " + _QASPER_RULES
        + "\n\nArticle: {context}\n\n Answer the question based on the above article " + _QASPER_RULES
        + "\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on "
        "the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "multifieldqa_zh": "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",
    "hotpotqa": _PASSAGES,
    "2wikimqa": _PASSAGES,
    "musique": _PASSAGES,
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting "
        "transcript in one or more sentences.\n\nQuery: {input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:"
    ),
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. "
        "The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In "
        "other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final "
        "count of unique paragraphs after removing duplicates. The output format should only contain the number, "
        "such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of "
        'the paragraph that the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", '
        "etc.\n\nThe answer is: "
    ),
    "passage_retrieval_zh": (
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n"
        '请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：'
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

DATASET2MAXLEN: dict[str, int] = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64,
    "hotpotqa": 32, "2wikimqa": 32, "musique": 32, "dureader": 128,
    "gov_report": 512, "qmsum": 512, "multi_news": 512, "vcsum": 512,
    "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64,
    "passage_count": 32, "passage_retrieval_en": 32, "passage_retrieval_zh": 32,
    "lcc": 64, "repobench-p": 64,
}  # fmt: skip


def _classification(pred: str, ref: str, sample: Sample) -> float:
    return metrics.classification(pred, ref, sample.meta.get("all_classes") or [])


def _plain(fn: Callable[[str, str], float]) -> Callable[[str, str, Sample], float]:
    return lambda pred, ref, _sample: fn(pred, ref)


DATASET2METRIC: dict[str, Callable[[str, str, Sample], float]] = {
    "narrativeqa": _plain(metrics.qa_f1), "qasper": _plain(metrics.qa_f1),
    "multifieldqa_en": _plain(metrics.qa_f1), "multifieldqa_zh": _plain(metrics.qa_f1_zh),
    "hotpotqa": _plain(metrics.qa_f1), "2wikimqa": _plain(metrics.qa_f1), "musique": _plain(metrics.qa_f1),
    "dureader": _plain(metrics.rouge_l_zh), "gov_report": _plain(metrics.rouge_l),
    "qmsum": _plain(metrics.rouge_l), "multi_news": _plain(metrics.rouge_l), "vcsum": _plain(metrics.rouge_l_zh),
    "trec": _classification, "triviaqa": _plain(metrics.qa_f1), "samsum": _plain(metrics.rouge_l),
    "lsht": _classification, "passage_retrieval_en": _plain(metrics.retrieval),
    "passage_count": _plain(metrics.count), "passage_retrieval_zh": _plain(metrics.retrieval_zh),
    "lcc": _plain(metrics.code_sim), "repobench-p": _plain(metrics.code_sim),
}  # fmt: skip

NO_CHAT_TEMPLATE = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})
FIRST_LINE_ONLY = frozenset({"trec", "triviaqa", "samsum", "lsht"})  # official scorer keeps line 1
CLASSIFICATION = frozenset({"trec", "lsht"})
REQUIRED = ("input", "context", "answers", "_id")  # length, dataset, language, all_classes: meta


def base_task(task: str) -> str:
    """``qasper_e`` (LongBench-E) uses qasper's prompt, length and metric."""
    return task[:-2] if task.endswith("_e") and task[:-2] in DATASET2PROMPT else task


def check_task(task: str | None) -> str:
    if task is None or base_task(task) not in DATASET2PROMPT:
        raise DatasetError(
            f"dataset=longbench needs dataset.task= one of {', '.join(DATASET2PROMPT)} (or <task>_e for LongBench-E); "
            f"got {task!r}"
        )
    return task


def _rows(path: str | None, task: str, split: str) -> list[dict[str, Any]]:
    source = resolve(path) if path is not None else Source([], hub_id=HUB_ID)
    source = pick_task_files(source, task)
    required = REQUIRED + (("all_classes",) if base_task(task) in CLASSIFICATION else ())
    rows = load_rows(
        source, required, hub_name=task, hub_split=split,
        hint="LongBench rows have input, context, answers (a list), _id, and all_classes for trec/lsht.",
    )
    if not source.hub_id and any("dataset" in r for r in rows):
        # One file may hold several tasks (its rows name theirs in "dataset").
        tagged = [r for r in rows if r.get("dataset") in (task, base_task(task), None)]
        if not tagged:
            found = sorted({str(r.get("dataset")) for r in rows})
            raise DatasetError(f"{source.label}: no row with dataset == {task!r}; the rows are of {', '.join(found)}")
        rows = tagged
    return rows


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    split: str = "test",
    use_chat_template: bool = True,
) -> list[Sample]:
    task = check_task(task)
    base = base_task(task)
    frame = make_frame(tokenizer, use_chat_template and base not in NO_CHAT_TEMPLATE)
    return fit_prompts(_prompts(_rows(path, task, split), task, base), "longbench", task, tokenizer, ctx, frame, limit)


def _prompts(rows: Iterable[dict], task: str, base: str) -> Iterator[Prompt]:
    for i, row in enumerate(rows):
        answers = row["answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers) or not answers:
            raise row_error(row, i, f"field 'answers' must be a non-empty list of strings, got {answers!r:.80}")
        for key in ("input", "context"):
            if not isinstance(row[key], str):
                raise row_error(row, i, f"field {key!r} must be a string, got {type(row[key]).__name__}")
        if base in CLASSIFICATION and not row.get("all_classes"):
            raise row_error(row, i, f"field 'all_classes' must list the classes for {base}")
        meta = {k: row.get(k) for k in ("all_classes", "length", "language")}
        yield Prompt(f"longbench/{task}/{row['_id']}", DATASET2PROMPT[base].format(context=row["context"], input=row["input"]),
                     list(answers), DATASET2MAXLEN[base], meta)


def score(sample: Sample, prediction: str) -> float | None:
    if not sample.answers:
        return None
    base = base_task(sample.task or "")
    if base not in DATASET2METRIC:
        raise DatasetError(f"longbench sample {sample.sample_id}: unknown task {sample.task!r}")
    if base in FIRST_LINE_ONLY:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = DATASET2METRIC[base]
    return max(metric(prediction, ref, sample) for ref in sample.answers)
