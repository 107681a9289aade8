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
of N tokens, made once by the teacher pass and cached with the targets. With
`far_copy_share=S` about that share of the windows (train and validation) end in
`far_copy_span` tokens copied from D tokens back (D drawn from `far_copy_distances`), text where
the next token depends on something far outside a small KV budget (sparsespec.data.far_copy).
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
from sparsespec.data.far_copy import mix_far_copies
from sparsespec.training.distributed import World, world
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
        # "row": the dataset index, by which validation counts a row the distributed sampler repeats once
        item = {"input_ids": self.ids[i].long(), "targets": self.targets["targets"][i].long(), "row": torch.tensor(i)}
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

    `teacher` is a factory for the Teacher (only called when a cache shard is missing; if it has a
    `release()` method, as TargetTeacher does, it is called once the targets are loaded);
    `fingerprint` identifies the target model in the cache key. With several processes the
    teacher pass is sharded across ranks in setup(); `computed_shards` counts this process's.
    """

    def __init__(self, tokenizer: Any = None, teacher: Callable[[], Teacher] | None = None,
                 fingerprint: str = "", path: str | None = None, seq_len: int = 2048, n_train: int = 96,
                 n_val: int = 4, offset: float = 0.02, batch_size: int = 1, num_workers: int = 0,
                 teacher_dtype: str = "bfloat16", topk: int = 8, cache_dir: str | None = None,
                 shard_size: int = 16, seed: int = 0, on_policy_tokens: int = 0, far_copy_share: float = 0.0,
                 far_copy_distances: tuple[int, ...] = (200, 700, 2000, 3800), far_copy_span: int = 256):
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
        require(0 <= number("corpus.far_copy_share", far_copy_share) <= 1, "corpus.far_copy_share", far_copy_share,
                "[0, 1]: the share of windows whose last corpus.far_copy_span tokens repeat the text D tokens back")
        if far_copy_share:
            positive("corpus.far_copy_span", far_copy_span, int)
            require(far_copy_span < seq_len, "corpus.far_copy_span", far_copy_span, f"fewer than corpus.seq_len={seq_len}")
            far_copy_distances = [int(d) for d in far_copy_distances]
            fits = seq_len - far_copy_span
            require(bool(far_copy_distances) and all(1 <= d <= fits for d in far_copy_distances),
                    "corpus.far_copy_distances", far_copy_distances,
                    f"distances between 1 and corpus.seq_len - corpus.far_copy_span = {fits}")
            require(not on_policy_tokens, "corpus.far_copy_share", far_copy_share,
                    "0 with teacher.on_policy_tokens > 0 (a window is either a far copy or ends in the target's "
                    "own continuation)")
        if path is not None and not Path(str(path)).expanduser().exists():
            raise ConfigError(f"corpus.path={path} does not exist: pass a .txt/.jsonl/.json/.parquet file or a "
                              "directory of them (null: the shipped PG-19 books)")
        self.tokenizer, self.teacher, self.fingerprint = tokenizer, teacher, fingerprint
        self.path, self.seq_len, self.n_train, self.n_val = path, seq_len, n_train, n_val
        self.offset, self.batch_size, self.num_workers = offset, batch_size, num_workers
        self.teacher_dtype, self.topk, self.shard_size = str(teacher_dtype), int(topk), int(shard_size)
        self.seed, self.on_policy_tokens = int(seed), int(on_policy_tokens)
        self.far_copy = (float(far_copy_share), list(far_copy_distances), int(far_copy_span))
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
        share, distances, span = self.far_copy
        if share:  # the teacher then labels the copies too: the cache key covers the token ids
            train = mix_far_copies(train, share, distances, span, salt="train")
            val = mix_far_copies(val, share, distances, span, salt="val")
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

    def _meta(self, name: str) -> dict[str, Any]:
        return {"split": name, "data_path": self.path, "fingerprint": self.fingerprint,
                "teacher_dtype": self.teacher_dtype, "topk": self.topk, "on_policy_tokens": self.on_policy_tokens}

    def teacher_cached(self) -> bool:
        """Every split's teacher targets are on disk and verified: the target is not needed for them."""
        return all(self.caches[name].complete() for name in self._sequences())

    def release_teacher(self) -> None:
        """Drop the teacher and, if the factory holds the target (TargetTeacher), the target too."""
        self._teacher = None
        release = getattr(self.teacher, "release", None)
        if callable(release):
            release()

    def prepare_data(self) -> None:
        """One process: run the teacher for every missing shard. Several: nothing; setup() does it.

        Why not here with several processes: Lightning calls prepare_data on local rank 0 alone
        while the other ranks wait in a collective barrier, so one GPU per node would do all the
        work and a long pass would run into the process group's timeout. setup() runs on every rank
        once the process group exists, so each rank computes its share of the shards there."""
        if world(self.trainer).size > 1:
            return
        for name, ids in self._sequences().items():
            self.computed_shards += self.caches[name].build(ids, self._get_teacher, self._meta(name))

    def _sharded_teacher_pass(self, w: World) -> None:
        """The missing shards, divided among the ranks; then one process per node checks its view of
        the cache is complete (filling any hole) and writes meta.json; then everyone may read."""
        # rank 0 lists what is missing, once, for every rank: the ranks then agree on the division
        # even if another job writes into the same cache meanwhile (a shard it finishes first is
        # skipped by compute(), so the overlap costs nothing but time)
        todo = w.broadcast([(name, i) for name in self._sequences() for i in self.caches[name].missing()]
                           if w.rank == 0 else None)
        mine = todo[w.rank :: w.size]  # a fresh cache: rank r takes shards r, r + W, r + 2W, ... (train, then val)
        if todo:
            log.info("teacher pass on %d ranks: %d shard(s) missing, %d on rank %d", w.size, len(todo), len(mine),
                     w.rank)
        for name, ids in self._sequences().items():
            shards = [i for n, i in mine if n == name]
            if shards:
                self.computed_shards += self.caches[name].compute(ids, self._get_teacher, shards)
        w.barrier("teacher_shards")
        # A cache_dir not shared between nodes lacks, on each node, the shards the other nodes wrote.
        # Every rank of the node takes its share of those holes: one process filling them alone
        # would keep the others waiting in the next barrier, past the process group's timeout
        # (30 minutes by default) on a long pass. On a shared directory there are none.
        holes = [(name, i) for name in self._sequences() for i in self.caches[name].missing()]
        w.barrier("teacher_holes_listed")  # every rank of a node lists the same holes before any is filled
        if holes and w.local_rank == 0:
            log.warning("teacher cache: %d shard(s) other ranks wrote are not visible on this node (cache_dir not "
                        "shared between nodes?); the %d rank(s) here compute them", len(holes), w.node_size)
        for name, ids in self._sequences().items():
            shards = [i for n, i in holes[w.local_rank :: w.node_size] if n == name]
            if shards:
                self.computed_shards += self.caches[name].compute(ids, self._get_teacher, shards)
        w.barrier("teacher_holes")
        if w.local_rank == 0:
            # one process per node writes meta.json once every shard verifies (a shard damaged since
            # is recomputed here); a repeated meta.json write is atomic
            for name, ids in self._sequences().items():
                cache = self.caches[name]
                if cache.complete():
                    continue
                late = cache.missing()
                if late:
                    self.computed_shards += cache.compute(ids, self._get_teacher, late)
                cache.write_meta(ids, self._meta(name))
        w.barrier("teacher_cache_complete")

    def setup(self, stage: str | None = None) -> None:
        """Every rank: (several processes) the sharded teacher pass, then read the cache; the teacher
        and the target it holds are released once every split is loaded."""
        if all(name in self.datasets for name in self._sequences()):
            return
        w = world(self.trainer)
        if w.size > 1:
            self._sharded_teacher_pass(w)
        for name, ids in self._sequences().items():
            if name not in self.datasets:
                cache = self.caches[name]
                try:
                    targets = cache.load(seq_len=self.seq_len)
                except TeacherCacheError as e:  # damaged since it was checked: recompute, never read it
                    log.warning("%s; rebuilding", e)
                    cache.forget()
                    self.computed_shards += cache.build(ids, self._get_teacher, self._meta(name))
                    targets = cache.load(seq_len=self.seq_len)
                # on-policy: the cached sequences (prompt + the target's continuation) are the inputs
                self.datasets[name] = TeacherDataset(targets.pop("ids", ids), targets)
        self.release_teacher()  # the targets are in memory now; the target model is no longer needed

    def train_dataloader(self) -> ResumableLoader:
        trainer = getattr(self, "trainer", None)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return ResumableLoader(self.datasets["train"], self.batch_size, seed=self.seed,
                               num_workers=self.num_workers, rank=rank, world_size=world)

    def val_dataloader(self) -> DataLoader:
        """Lightning's distributed sampler shares the rows among the ranks; where they do not divide
        evenly it repeats a few so that every rank has a batch (which Lightning requires)."""
        return DataLoader(self.datasets["val"], batch_size=1, num_workers=self.num_workers)
