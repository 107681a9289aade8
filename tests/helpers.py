"""Builders and runners the test files share: tokenizers trained here, tiny models saved with them,
generated documents and corpora, the evaluate.py / train.py runs on them, and the isolated caches they
run under. Test files import from here (or conftest.py), never from one another.

Every builder is deterministic (fixed seeds), so a directory built once per session serves every file
that asks for the same thing (the session fixtures in conftest.py).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# ---------------------------------------------------------------------------------------------
# the compiled CPU kernels: built once per machine, shared by every isolated cache
# ---------------------------------------------------------------------------------------------

# Tests point SPARSESPEC_CACHE at a temporary folder to keep their files apart, and the kernels are
# built under SPARSESPEC_CACHE/kernels: every process under such a cache would compile them again
# (a minute of both cores). The kernels depend only on their sources and this machine, so every
# isolated cache links its kernels folder to this one, built once.
_user_cache = os.environ.get("SPARSESPEC_CACHE") or Path.home() / ".cache" / "sparsespec"
KERNELS = Path(_user_cache).expanduser() / "kernels"


def isolated_cache(cache: Path) -> Path:
    """An empty SPARSESPEC_CACHE folder whose compiled kernels are the shared ones."""
    cache.mkdir(parents=True, exist_ok=True)
    link = cache / "kernels"
    if not link.exists() and not link.is_symlink():
        KERNELS.mkdir(parents=True, exist_ok=True)
        link.symlink_to(KERNELS, target_is_directory=True)
    return cache


# ---------------------------------------------------------------------------------------------
# tokenizers
# ---------------------------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _data_text() -> str:
    rng = random.Random(0)
    words = (
        "the a of and to in is was river ferryman crossed story question answer paragraph summary book key "
        "pass value number sequence digits green sky blue sun yellow grass there back again special magic "
        "hidden text memorize quiz variable chain assigned correct choice read following given passages"
    ).split()
    lines = []
    for i in range(400):
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        lines.append(f"{sent.capitalize()}. {rng.randint(0, 99999)} {{\"k\": \"v\"}}, (A) B-c: {i}!")
    return "\n".join(lines)


def make_tokenizer(chat: bool, texts: list[str] | None = None, vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """The data layer's tokenizer: byte-level BPE (of 600 tokens over the test text, unless given
    `texts` and `vocab_size`), a BOS on every encoding, optionally a chat template."""
    from tokenizers import processors

    tok = _bpe([_data_text()] if texts is None else texts, vocab_size,
               ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if chat:
        hf.chat_template = CHAT_TEMPLATE
    return hf


def _bpe(texts: list[str], vocab_size: int, special: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return tok


def training_tokenizer() -> PreTrainedTokenizerFast:
    """The training tests' tokenizer: byte-level BPE of 300 tokens over `text(0..4)`."""
    tok = _bpe([text(i) for i in range(5)], 300, ["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def other_tokenizer() -> PreTrainedTokenizerFast:
    """Another vocabulary (350 tokens over another text), for a drafter that does not share the target's."""
    tok = _bpe([doc(99)], 350, ["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a speculative decoder drafts tokens and the target verifies them",
    "long context models need scaled rotary embeddings",
    "hello world, this is a tiny tokenizer for tests",
]


def tiny_tokenizer(sentences: list[str] = SENTENCES, vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """The loading tests' tokenizer: a few sentences, `<|endoftext|>` for BOS, EOS and unknown."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sentences, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")


# ---------------------------------------------------------------------------------------------
# generated text
# ---------------------------------------------------------------------------------------------

DOC_WORDS = ("the river ferryman crossed story question answer paragraph summary book key pass value number "
             "sequence digits green sky blue sun yellow grass there back again special magic hidden text").split()
TEXT_WORDS = ("the river ferryman crossed story question answer book key pass value green sky blue sun "
              "yellow grass there back again hidden text quiz chain read passages old man sea boat").split()


def doc(seed: int, n_words: int = 820) -> str:
    """A document of short numbered sentences (about 1.1k tokens of make_tokenizer at the default length)."""
    rng = random.Random(seed)
    lines = []
    while n_words > 0:
        k = rng.randint(5, 12)
        lines.append(" ".join(rng.choice(DOC_WORDS) for _ in range(k)).capitalize() + f". {rng.randint(0, 999)}")
        n_words -= k
    return "\n".join(lines)


def text(seed: int, n: int = 600) -> str:
    """n random words and a full stop."""
    rng = random.Random(seed)
    return " ".join(rng.choice(TEXT_WORDS) for _ in range(n)) + "."


# ---------------------------------------------------------------------------------------------
# tiny Llamas saved with their tokenizer
# ---------------------------------------------------------------------------------------------


def tiny_llama(vocab: int, seed: int = 0, layers: int = 2, max_pos: int = 2048, **over) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
                      initializer_range=0.25, bos_token_id=0, eos_token_id=1, **over)
    return LlamaForCausalLM(cfg).eval()


def tiny_target(vocab: int, seed: int = 0, layers: int = 3) -> LlamaForCausalLM:
    """The training tests' target: tied embeddings, 512 positions."""
    return tiny_llama(vocab, seed, layers, max_pos=512, tie_word_embeddings=True)


def save_model(d: Path, tok, layers: int, seed: int) -> Path:
    """A tiny Llama of tok's vocabulary saved with tok in d."""
    tiny_llama(len(tok), seed, layers).save_pretrained(d)
    tok.save_pretrained(d)
    return d


# ---------------------------------------------------------------------------------------------
# the evaluation harness: a target, a drafter of another vocabulary, documents
# ---------------------------------------------------------------------------------------------

CTX = 192
NEW = 10


def make_harness_env(root: Path) -> dict:
    """A tiny target with make_tokenizer's vocabulary, a drafter with another, six ~1.1k-token documents."""
    tok = make_tokenizer(chat=False)
    model_dir = root / "target"
    tiny_llama(len(tok), seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    other = other_tokenizer()
    other_dir = root / "other_drafter"
    tiny_llama(len(other), seed=1).save_pretrained(other_dir)
    other.save_pretrained(other_dir)
    docs = root / "docs"
    docs.mkdir()
    for i in range(6):  # ~1.1k tokens each, so ctx=1k fits; file names sort in this order
        (docs / f"doc{i}.txt").write_text(doc(i), encoding="utf-8")
    return {"root": root, "tok": tok, "model": model_dir, "other": other_dir, "docs": docs}


def base_overrides(env: dict, out: Path, *extra: str) -> list[str]:
    return [f"model.path={env['model']}", "dataset=text", f"dataset.path={env['docs']}", f"ctx={CTX}",
            f"gen.max_new_tokens={NEW}", "runtime.warmup=false", "runtime.progress=false", "runtime.threads=2",
            f"out_dir={out}", *extra]


def run_inproc(env: dict, out: Path, *extra: str, methods: tuple[str, ...] | None = None) -> list[dict]:
    """evaluate.py's work without the process: compose, one config per listed method, run."""
    from hydra import compose, initialize_config_dir

    from sparsespec.config import register_configs
    from sparsespec.eval.harness import run_evaluation
    from sparsespec.eval.results import read_rows

    register_configs()  # the schemas the dataset and method files extend, as evaluate.py registers them
    ovr = base_overrides(env, out, *extra)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("evaluate", overrides=ovr)
        mcfgs = [compose("evaluate", overrides=[*ovr, f"method={m}"]).method for m in methods] if methods else None
    run_evaluation(cfg, mcfgs)
    return read_rows(out / "results.jsonl")


def evaluate_cmd(env: dict, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "evaluate.py"), *base_overrides(env, out, *extra)]


def sub_env(tmp: Path) -> dict:
    """A child process's environment: caches under tmp (the kernels shared), offline, no progress bars."""
    return {**os.environ, "SPARSESPEC_CACHE": str(isolated_cache(tmp / "cache")),
            "HF_DATASETS_CACHE": str(tmp / "hf_cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TQDM_DISABLE": "1"}


def run_evaluate(env: dict, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(evaluate_cmd(env, out, *extra), cwd=ROOT, env=sub_env(out.parent), capture_output=True,
                          text=True, timeout=300)


def pairs(rows: list[dict]) -> list[tuple[str, str]]:
    return [(r["sample_id"], r["method"]) for r in rows]


# ---------------------------------------------------------------------------------------------
# training: a target directory and a corpus, train.py through Hydra compose
# ---------------------------------------------------------------------------------------------


def make_env(root: Path, layers: int = 3, text_words: int = 600) -> dict:
    """A tiny target directory (model + tokenizer) and a 4-document corpus under root."""
    import json

    tok = training_tokenizer()
    target = tiny_target(len(tok), layers=layers)
    model_dir = root / "target"
    target.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text(100 + i, text_words)}) + "\n" for i in range(4)))
    return {"root": root, "tok": tok, "target": target, "model_dir": model_dir, "corpus": corpus}


def overrides(env: dict, out: Path, *extra: str) -> list[str]:
    return [f"model.path={env['model_dir']}", f"corpus.path={env['corpus']}", "corpus.seq_len=64", "corpus.n_train=4",
            "corpus.n_val=1", "budget.values=[16,32]", "budget.eval_values=[16,32]", "budget.k_sink=4",
            "trainer=debug", "trainer.precision=32-true", f"out_dir={out}", *extra]


def compose_cfg(name: str, ovr: list[str]):
    from hydra import compose, initialize_config_dir

    from sparsespec.config import register_configs

    register_configs()  # the structured bases the YAML groups extend, as train.py / evaluate.py register them
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(name, overrides=ovr)


def run_train(ovr: list[str], command: str | None = None, **kw):
    from sparsespec.training.run import train

    return train(compose_cfg("train", ovr), command=command, **kw)


# ---------------------------------------------------------------------------------------------
# decoding: every drafter kind, exact sampling marginals
# ---------------------------------------------------------------------------------------------


def drafters(family: str) -> dict:
    """A factory per drafter kind (self views, recall indexes, a small model, prompt lookup)."""
    from conftest import tiny_lm

    from sparsespec.decoding.drafters import ModelDrafter, PromptLookup, SelfDrafter
    from sparsespec.kv.policies import FullKV, StreamingKV
    from sparsespec.kv.recall import RecallIndex

    small = tiny_lm(family, seed=7, layers=1)
    return {
        "self_full": lambda: SelfDrafter(FullKV()),
        "magicdec_b24": lambda: SelfDrafter(StreamingKV(budget=24, k_sink=4)),
        "magicdec_r10": lambda: SelfDrafter(StreamingKV(ratio=0.10, k_sink=2)),
        "recall_r10_w16": lambda: SelfDrafter(RecallIndex(ratio=0.10, k_sink=2, k_recent=4, window=16)),
        "recall_r30_w4": lambda: SelfDrafter(RecallIndex(ratio=0.30, k_sink=4, k_recent=8, window=4)),
        "recall_r10_every3": lambda: SelfDrafter(RecallIndex(ratio=0.10, k_sink=2, k_recent=4, refresh_every=3)),
        "snapkv": lambda: SelfDrafter(RecallIndex(budget=32, k_sink=4, k_recent=8, refresh=False)),
        "sd": lambda: ModelDrafter(small, FullKV()),
        "sd_sparse_b16": lambda: ModelDrafter(small, StreamingKV(budget=16, k_sink=2), prefill_chunk=50),
        # unigrams recur in a 64-token vocabulary, so these really draft by lookup (asserted by the tests)
        "lookup1": lambda: (None, PromptLookup(1)),
        "lookup1_sd_sparse": lambda: (ModelDrafter(small, StreamingKV(budget=16, k_sink=2)), PromptLookup(1)),
        "lookup1_recall": lambda: (SelfDrafter(RecallIndex(ratio=0.10, k_sink=2, k_recent=4)), PromptLookup(1)),
    }


def engine(target, made, controller):
    """An engine from a factory's drafter, or its (drafter, prompt lookup) pair."""
    from sparsespec.decoding.engine import SpeculativeEngine

    drafter, lookup = made if isinstance(made, tuple) else (made, None)
    return SpeculativeEngine(target, drafter, controller, prompt_lookup=lookup)


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


BATCH = 100  # sequences decoded together in the distribution tests
TV_BOUND = 0.06  # per-position total variation allowed between n = 1500 draws and the exact marginals


def exact_marginals(target, prompt, steps, sampling):
    """Exact per-position marginals of AR sampling by enumeration (tiny vocabulary)."""
    V = target.vocab_size
    marg = []
    frontier = {(): 1.0}
    for _ in range(steps):
        m = torch.zeros(V)
        nxt = {}
        for seq, w in frontier.items():
            cache = target.new_cache()
            logits = target.prefill(torch.tensor(prompt + list(seq)), cache)[-1]
            p = sampling.probs(logits).cpu()
            m += w * p
            for t in range(V):
                if p[t] > 1e-4:
                    nxt[seq + (t,)] = w * float(p[t])
        marg.append(m)
        frontier = nxt
    return marg


def assert_blocks_match_transformers(hf) -> None:
    """90 tokens as a prefill, then decode- and verification-sized blocks, against one HF forward."""
    from conftest import random_prompt

    from sparsespec.models.runner import CausalLM

    ids = torch.tensor(random_prompt(90))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    lm = CausalLM(hf)
    cache = lm.new_cache(capacity=8)  # forces several capacity doublings
    out, start = [], 0
    for n in (70, 1, 2, 5, 12):
        out.append(lm.forward(ids[start : start + n], cache))
        start += n
    torch.testing.assert_close(torch.cat(out), ref, atol=2e-5, rtol=1e-4)
    assert cache.length == 90


# ---------------------------------------------------------------------------------------------
# the studies (sparsespec.experiments): PG-19-shaped books
# ---------------------------------------------------------------------------------------------


def books(folder: Path, n: int) -> Path:
    """n generated books of about 2.7k tokens in PG-19's JSON Lines schema."""
    import json

    data = folder / "pg19.jsonl"
    data.write_text("".join(json.dumps({"short_book_title": f"Book {i}", "publication_date": "1900",
                                        "url": f"u{i}", "text": doc(i, 2000)}) + "\n" for i in range(n)))
    return data


def run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python ARGS` in cwd with the repository importable, its output captured."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def write_doc_examples(doc_path: Path, folder: Path, expected: set[str]) -> dict[str, Path]:
    """Every ```block``` `doc_path` marks with `<!-- example: PATH -->`, written to folder/PATH (the
    paths must be `expected`: a doc that lost or renamed an example fails here)."""
    import re

    found = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", doc_path.read_text(encoding="utf-8"), re.S)
    assert {p for p, _ in found} == expected
    out = {}
    for rel, body in found:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
        out[rel] = path
    return out
