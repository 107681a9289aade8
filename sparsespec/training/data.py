"""Training sequences and their teacher targets as a LightningDataModule.

Default corpus: the six PG-19 books shipped in the package (sparsespec/data/pg19_books.jsonl.xz), split with
`sparsespec.data.pg19.pg19_split` (2 of the 6 books, chosen by title hash, are held out for
evaluation; the Figure-1 script evaluates on those). `corpus.path=FILE|DIR` takes any .txt/.jsonl/
.json/.parquet text instead: with 3+ documents a third (by name hash, at least one) is held out;
with fewer, each document's last windows are.

Each sequence is a window of `seq_len` tokens; windows are non-overlapping, start after `offset`
(share of a document's characters, skipping Gutenberg front matter) and are taken round-robin over
documents so every book contributes. With `on_policy_tokens=N` (`teacher.on_policy_tokens`) a
window is `seq_len - N` tokens of the document followed by the target's own greedy continuation
of N tokens, made once by the teacher pass and cached with the targets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from sparsespec.checks import ConfigError, non_negative, number, positive, require
from sparsespec.training.teacher import Teacher, TeacherCache, TeacherCacheError, cache_key

log = logging.getLogger(__name__)


def load_documents(path: str | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train_docs, eval_docs) as (name, text) pairs."""
    from sparsespec.data.pg19 import load_books, pg19_split

    if path is None:
        rows = load_books(None)
        docs = [(str(r["short_book_title"]), r["text"]) for r in rows]
        train, held = pg19_split([n for n, _ in docs])
        return [d for d in docs if d[0] in train], [d for d in docs if d[0] in held]
    from sparsespec.data.text import documents

    docs = [(name, text) for name, text, _ in documents(str(Path(path).expanduser()))]
    names = [f"{i}:{n}" for i, (n, _) in enumerate(docs)]  # unique even if two files share a stem
    if len(docs) >= 3:
        train, held = pg19_split(names, n_eval=max(1, len(docs) // 3))
        return ([d for n, d in zip(names, docs, strict=True) if n in train], [d for n, d in zip(names, docs, strict=True) if n in held])
    return docs, []  # fewer than 3: windows() holds out each document's tail


def windows(docs: list[tuple[str, str]], tokenizer: Any, seq_len: int, n: int, offset: float,
            skip: int = 0) -> list[list[int]]:
    """Up to `n` non-overlapping seq_len windows, round-robin over docs, after skipping `skip` windows
    of each doc."""
    per_doc: list[list[list[int]]] = []
    need = skip + (n + len(docs) - 1) // max(len(docs), 1) + 1
    for _, text in docs:
        start = int(len(text) * offset)
        chars = text[start : start + need * seq_len * 6]  # ~4 chars/token in English prose; margin
        ids = tokenizer(chars, add_special_tokens=False)["input_ids"]
        per_doc.append([ids[i : i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)][skip:])
    out: list[list[int]] = []
    for r in range(max((len(w) for w in per_doc), default=0)):
        for w in per_doc:
            if r < len(w) and len(out) < n:
                out.append(w[r])
    return out


class TeacherDataset(Dataset):
    def __init__(self, ids: torch.Tensor, targets: dict[str, torch.Tensor]):
        self.ids, self.targets = ids, targets

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": self.ids[i].long(), "targets": self.targets["targets"][i].long()}
        if "topk_idx" in self.targets:
            item["topk_idx"] = self.targets["topk_idx"][i].long()
            item["topk_logp"] = self.targets["topk_logp"][i].float()
        return item


class ResumableLoader:
    """The training batches: a fresh permutation per epoch from (seed, epoch) alone, and a position
    that travels with Lightning checkpoints (Lightning saves `state_dict()` of a stateful train
    loader in the checkpoint and loads it back on resume), so a run resumed from last.ckpt draws
    exactly the batches an uninterrupted run would have drawn, mid-epoch included.

    Not a DataLoader subclass on purpose: Lightning then leaves its sampler alone. Under DDP each
    rank takes every world_size-th index of the shared permutation (as DistributedSampler would).
    """

    def __init__(self, dataset: Dataset, batch_size: int, seed: int = 0, num_workers: int = 0,
                 rank: int = 0, world_size: int = 1, drop_last: bool = True):
        self.dataset, self.batch_size, self.seed = dataset, int(batch_size), int(seed)
        self.num_workers, self.rank, self.world_size = int(num_workers), int(rank), max(int(world_size), 1)
        self.drop_last = drop_last
        self.epoch = 0  # the epoch the next (or current) iteration draws from
        self.consumed = 0  # batches of that epoch already handed out

    def _per_rank(self) -> int:
        n = len(self.dataset) // self.world_size
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        return self._per_rank()

    def order(self, epoch: int) -> list[int]:
        """This rank's sample indices for `epoch` (a pure function of seed and epoch)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self.dataset), generator=g).tolist()
        n = len(self.dataset) // self.world_size * self.world_size
        return perm[:n][self.rank :: self.world_size]

    def __iter__(self):
        if self.consumed >= len(self):  # the saved position was the end of an epoch
            self.epoch, self.consumed = self.epoch + 1, 0
        idx = self.order(self.epoch)[self.consumed * self.batch_size :]
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=idx, num_workers=self.num_workers,
                            drop_last=self.drop_last)
        for batch in loader:
            self.consumed += 1
            yield batch
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            log.warning("resuming with seed=%d but the checkpoint drew batches with seed=%s: the data order "
                        "continues with the new seed", self.seed, state.get("seed"))
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


class DraftDataModule(L.LightningDataModule):
    """Sequences (train: train docs; val: held-out docs) with cached full-cache teacher targets.

    `teacher` is a factory for the Teacher (only called when a cache shard is missing);
    `fingerprint` identifies the target model in the cache key.
    """

    def __init__(self, tokenizer: Any = None, teacher: Callable[[], Teacher] | None = None,
                 fingerprint: str = "", path: str | None = None, seq_len: int = 2048, n_train: int = 96,
                 n_val: int = 4, offset: float = 0.02, batch_size: int = 1, num_workers: int = 0,
                 teacher_dtype: str = "bfloat16", topk: int = 8, cache_dir: str | None = None,
                 shard_size: int = 16, seed: int = 0, on_policy_tokens: int = 0):
        super().__init__()
        sizes = {"seq_len": seq_len, "n_train": n_train, "n_val": n_val, "batch_size": batch_size, "shard_size": shard_size}
        for key, value in sizes.items():
            positive(f"corpus.{key}", value, int)
        non_negative("corpus.num_workers", num_workers, int)
        require(0 <= number("corpus.offset", offset) < 1, "corpus.offset", offset,
                "[0, 1): the share of each document's characters to skip")
        require(0 <= number("teacher.on_policy_tokens", on_policy_tokens, int) < seq_len, "teacher.on_policy_tokens",
                on_policy_tokens,
                f"fewer than corpus.seq_len={seq_len}: each window keeps seq_len - on_policy_tokens prompt tokens")
        if path is not None and not Path(str(path)).expanduser().exists():
            raise ConfigError(f"corpus.path={path} does not exist: pass a .txt/.jsonl/.json/.parquet file or a "
                              "directory of them (null: the shipped PG-19 books)")
        self.tokenizer, self.teacher, self.fingerprint = tokenizer, teacher, fingerprint
        self.path, self.seq_len, self.n_train, self.n_val = path, seq_len, n_train, n_val
        self.offset, self.batch_size, self.num_workers = offset, batch_size, num_workers
        self.teacher_dtype, self.topk, self.shard_size = str(teacher_dtype), int(topk), int(shard_size)
        self.seed, self.on_policy_tokens = int(seed), int(on_policy_tokens)
        from sparsespec.models.embedded import cache_root

        self.cache_dir = Path(cache_dir) if cache_dir else cache_root() / "teacher"
        self.splits: dict[str, torch.Tensor] = {}
        self.caches: dict[str, TeacherCache] = {}
        self.computed_shards = 0
        self._teacher: Teacher | None = None
        self.datasets: dict[str, TeacherDataset] = {}

    def _sequences(self) -> dict[str, torch.Tensor]:
        if self.splits:
            return self.splits
        train_docs, eval_docs = load_documents(self.path)
        prompt_len = self.seq_len - self.on_policy_tokens  # the teacher appends the rest
        if eval_docs:
            train = windows(train_docs, self.tokenizer, prompt_len, self.n_train, self.offset)
            val = windows(eval_docs, self.tokenizer, prompt_len, self.n_val, self.offset)
        else:  # few documents: hold out the tail windows of each
            everything = windows(train_docs, self.tokenizer, prompt_len, self.n_train + self.n_val, self.offset)
            train, val = everything[: -self.n_val or None], everything[len(everything) - self.n_val :]
        if not train or not val:
            raise ValueError(f"corpus.path={self.path}: not enough text for {self.n_train}+{self.n_val} windows of "
                             f"corpus.seq_len={self.seq_len} tokens (got {len(train)} train, {len(val)} val)")
        if len(train) < self.n_train:
            log.warning("only %d training windows of %d tokens available (asked %d)", len(train), self.seq_len,
                        self.n_train)
        self.splits = {"train": torch.tensor(train, dtype=torch.int32), "val": torch.tensor(val, dtype=torch.int32)}
        for name, ids in self.splits.items():
            key = cache_key(self.fingerprint, ids, self.teacher_dtype, self.topk, self.on_policy_tokens)
            self.caches[name] = TeacherCache(self.cache_dir, key, ids.shape[0], self.shard_size)
        return self.splits

    def _get_teacher(self) -> Teacher:
        if self._teacher is None:  # built once, and only if some shard is missing
            self._teacher = self.teacher()
        return self._teacher

    def prepare_data(self) -> None:
        """Rank 0 only (Lightning): run the teacher for every missing shard."""
        for name, ids in self._sequences().items():
            meta = {"split": name, "data_path": self.path, "fingerprint": self.fingerprint,
                    "teacher_dtype": self.teacher_dtype, "topk": self.topk,
                    "on_policy_tokens": self.on_policy_tokens}
            self.computed_shards += self.caches[name].build(ids, self._get_teacher, meta)

    def setup(self, stage: str | None = None) -> None:
        for name, ids in self._sequences().items():
            if name not in self.datasets:
                cache = self.caches[name]
                try:
                    targets = cache.load(seq_len=self.seq_len)
                except TeacherCacheError as e:  # damaged since prepare_data: recompute, never read it
                    log.warning("%s; rebuilding", e)
                    self.computed_shards += cache.build(ids, self._get_teacher, {"split": name})
                    targets = cache.load(seq_len=self.seq_len)
                # on-policy: the cached sequences (prompt + the target's continuation) are the inputs
                self.datasets[name] = TeacherDataset(targets.pop("ids", ids), targets)

    def train_dataloader(self) -> ResumableLoader:
        trainer = getattr(self, "trainer", None)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return ResumableLoader(self.datasets["train"], self.batch_size, seed=self.seed,
                               num_workers=self.num_workers, rank=rank, world_size=world)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["val"], batch_size=1, num_workers=self.num_workers)
