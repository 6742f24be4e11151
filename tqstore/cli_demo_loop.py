"""The training loop that ``python -m tqstore demo`` runs (and kills) in a child process.

A small RL post-training loop with partial rollout on an embedded store:

* producer threads put GRPO groups (``group`` samples per prompt: token ids and logprobs
  as jagged rows, a text, a ``reward``) into partition ``rollout``.  A group is first put
  *partial* (half its tokens, no reward, tag ``status="partial"``) and finished by a later
  put (all tokens, the reward, ``status="finished"``), so unfinished rollouts cross step
  and checkpoint boundaries;
* the trainer consumes whole finished groups with the ``grpo_group_n`` sampler, checks
  each sample bit for bit against what its producer put, and clears them;
* every ``save_every`` steps a :class:`~tqstore.CheckpointManager` saves a generation
  (metadata: step, prompt cursor, acknowledgement count) while the producers wait. With the
  selective dump and load in this build ("pending" mode) the generation holds the
  trainer's side of the buffer (keys, tags, consumption, sampler state;
  ``include_storage=False``) and the pending samples' payload is dumped by key beside it
  (``pending/step-N``, ``blocking=False``); without them ("full" mode) the generation holds
  the whole buffer (``blocking=False``).

Every acknowledged put and every consumed group is an event line on stdout; the
parent (:mod:`tqstore.cli_demo`) reads it to check that nothing acknowledged was lost or
consumed twice.  On ``resume`` the loop restores the newest valid generation (in pending
mode: the newest whose dump was published too, then ``load_data_by_key`` of that dump),
finishes the partial rollouts it finds and goes on.  Sample contents are a
pure function of ``(seed, prompt, sample)``, so any process can recompute them.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO

import numpy as np

from . import layout_dirs as L

PARTITION = "rollout"
TASK = "train"
FIELDS = ["input_ids", "logprobs", "text", "reward"]
PRODUCERS = 2


def sample(seed: int, prompt: int, j: int, tokens: int, final: bool) -> Dict[str, Any]:
    """The fields of sample ``j`` of ``prompt`` (``final``: the finished rollout, else its
    first half): a pure function of its arguments."""
    rng = np.random.default_rng([seed, prompt, j])
    n = int(rng.integers(max(2, tokens // 2), max(3, tokens * 3 // 2)))
    ids = rng.integers(0, 32000, n, dtype=np.int64)
    lp = (-rng.exponential(1.0, n)).astype(np.float32)
    reward = np.float32(rng.random())
    if not final:
        n //= 2
    return {"input_ids": ids[:n], "logprobs": lp[:n], "text": f"prompt {prompt} sample {j}: {n} tokens",
            "reward": reward}


def keys_of(prompt: int, group: int) -> List[str]:
    return [f"p{prompt:06d}-s{j}" for j in range(group)]


def prompt_of(key: str) -> int:
    return int(key[1:7])


def dump_api(tq) -> Dict[str, Any]:
    """The selective dump and load functions of this build (missing ones left out)."""
    return {n: getattr(tq, n) for n in ("dump_data_by_key", "load_data_by_key") if callable(getattr(tq, n, None))}


EVENT = "@ "  # the prefix of an event line on the loop's stdout


class Log:
    """The loop's events, one JSON object a line on its stdout after :data:`EVENT`, flushed at
    once: the parent reads them from the pipe (what was written before a kill -9 is still
    read; nothing goes to a file)."""

    def __init__(self, out: TextIO, run: int) -> None:
        self._out = out
        self.run = run
        self.lock = threading.RLock()
        self.acks = 0

    def write(self, ev: str, **kw: Any) -> None:
        with self.lock:
            if ev == "ack":
                kw["seq"] = self.acks
                self.acks += 1
            self._out.write(EVENT + json.dumps(dict(run=self.run, ev=ev, **kw)) + "\n")
            self._out.flush()

    def say(self, s: str) -> None:
        with self.lock:
            self._out.write(s + "\n")
            self._out.flush()

    def close(self) -> None:
        pass


def read_events(lines: List[str]) -> List[Dict[str, Any]]:
    """The events among the loop's output ``lines`` (a torn last line is left out)."""
    out = []
    for line in lines:
        if line.startswith(EVENT):
            try:
                out.append(json.loads(line[len(EVENT):]))
            except ValueError:
                continue
    return out


class Loop:
    """One run of the loop (see the module docstring); ``cfg`` is the demo's settings."""

    def __init__(self, cfg: Dict[str, Any], out: TextIO) -> None:
        import tqstore as tq

        self.tq = tq
        self.cfg = cfg
        self.out = out
        self.base = Path(cfg["dir"])
        self.seed, self.group, self.tokens = int(cfg["seed"]), int(cfg["group"]), int(cfg["tokens"])
        self.groups_per_step = int(cfg["rows"]) // self.group
        self.total_prompts = int(cfg["steps"]) * self.groups_per_step
        self.log = Log(out, int(cfg["run"]))
        self.put_lock = threading.RLock()  # held for a put and its log line, and by the trainer for a cut
        self.cursor = 0  # next prompt to start
        self.inflight: List[List[int]] = [[] for _ in range(PRODUCERS)]  # partial groups of each producer
        self.credits = threading.Semaphore(3 * self.groups_per_step)  # groups started and not consumed
        self.stop = threading.Event()
        self.errors: List[BaseException] = []
        self.threads: List[threading.Thread] = []
        self.api = dump_api(tq)
        # "pending": generations hold the trainer's side, the pending samples go in a dump beside each;
        # "full" (a build without the selective load): generations hold the whole buffer
        self.mode = cfg.get("mode") or ("pending" if len(self.api) == 2 else "full")
        self.stats: Dict[str, Any] = {"run": self.log.run, "saves": [], "restore": None, "mode": self.mode}
        self.step = 0

    # ------------------------------------------------------------------ producers
    def _put(self, prompt: int, final: bool, step: int) -> None:
        rows = [sample(self.seed, prompt, j, self.tokens, final) for j in range(self.group)]
        fields: Dict[str, Any] = {"input_ids": [r["input_ids"] for r in rows],
                                  "logprobs": [r["logprobs"] for r in rows], "text": [r["text"] for r in rows]}
        if final:
            fields["reward"] = np.array([r["reward"] for r in rows], dtype=np.float32)
        status = "finished" if final else "partial"
        tags = [{"status": status, "prompt": prompt, "step": step} for _ in rows]
        keys = keys_of(prompt, self.group)
        with self.put_lock:
            self.tq.kv_batch_put(keys, PARTITION, fields=fields, tags=tags)
            self.log.write("ack", prompt=prompt, version=status)  # acknowledged: the put returned

    def _producer(self, i: int) -> None:
        rng = np.random.default_rng([self.seed, 1000 + i, self.log.run])
        mine = self.inflight[i]
        try:
            while not self.stop.is_set():
                if mine and (len(mine) >= 2 or rng.random() < 0.5 or self.cursor >= self.total_prompts):
                    self._put(mine.pop(0), True, self.step)  # finish the oldest partial rollout
                    continue
                if self.cursor >= self.total_prompts:
                    if not mine:
                        return
                    continue
                if not self.credits.acquire(timeout=0.05):  # the buffer is full: finish, or wait
                    if mine:
                        self._put(mine.pop(0), True, self.step)
                    continue
                with self.put_lock:  # take the prompt and put it in one hold: a cut sees both or neither
                    p = self.cursor if self.cursor < self.total_prompts else None
                    if p is not None:
                        self.cursor += 1
                        self._put(p, False, self.step)
                        mine.append(p)
                if p is None:
                    self.credits.release()
        except BaseException as e:  # surfaced by the trainer
            self.errors.append(e)

    # ------------------------------------------------------------------ trainer
    def _check(self, keys: List[str], data: Any) -> None:
        for i, k in enumerate(keys):
            want = sample(self.seed, prompt_of(k), int(k.rsplit("s", 1)[1]), self.tokens, True)
            ok = (np.array_equal(np.asarray(data["input_ids"][i]), want["input_ids"])
                  and np.array_equal(np.asarray(data["logprobs"][i]), want["logprobs"])
                  and data["text"][i] == want["text"] and np.float32(data["reward"][i]) == want["reward"])
            if not ok:
                raise AssertionError(f"sample {k} does not read back as it was put")

    def _train_step(self, step: int) -> int:
        got = 0
        while got < self.groups_per_step:
            if self.errors:
                raise self.errors[0]
            meta = self.tq.get_client().get_meta(FIELDS, self.group, PARTITION, task_name=TASK, timeout_s=0.5)
            if not meta.global_indexes:
                if not any(t.is_alive() for t in self.threads):
                    raise AssertionError(f"step {step}: the producers are done and only {got} of "
                                         f"{self.groups_per_step} groups came: samples were lost")
                continue
            keys = list(meta.keys)
            self.log.write("consumed", step=step, keys=keys)
            self._check(keys, self.tq.kv_batch_get(keys, PARTITION, select_fields=FIELDS))
            self.tq.kv_clear(keys, PARTITION)
            self.credits.release()
            got += 1
        return got * self.group

    def _pending(self) -> List[str]:
        return sorted(self.tq.kv_list(PARTITION).get(PARTITION, {}))

    def _pending_dir(self, step: int) -> Path:
        return self.base / "pending" / f"step-{step:010d}"

    def _save(self, m, step: int) -> Dict[str, Any]:
        """Save generation ``step`` while the producers wait (a consistent cut of what was
        acknowledged).  Full mode: the whole buffer, ``blocking=False``.  Pending mode: the
        trainer's side of the buffer (keys, tags, consumption, sampler state) as a
        metadata-only generation, and the pending samples' payload dumped by key beside it
        with ``blocking=False``."""
        t0 = time.perf_counter()
        with self.put_lock:  # the cut sees every put acknowledged so far and none half-logged
            meta = {"step": step, "next_prompt": self.cursor, "run": self.log.run, "acked": self.log.acks,
                    "mode": self.mode}
            if self.mode == "full":
                handle = m.save(step, metadata=meta, blocking=False)
                gen = None
            else:
                gen = m.save(step, metadata=meta, include_storage=False)
            pending = self._pending()
            if self.mode == "pending":
                handle = self.api["dump_data_by_key"](str(self._pending_dir(step)), pending, PARTITION, blocking=False)
        held = time.perf_counter() - t0
        rec: Dict[str, Any] = {"step": step, "stall_s": held, "cut_s": handle.stall_s, "handle": handle, "gen": gen,
                               "pending": len(pending)}
        self.log.write("cut", step=step, stall_s=held, cut_s=handle.stall_s, pending=len(pending), mode=self.mode)
        return rec

    def _settle(self, m, rec: Dict[str, Any]) -> None:
        res = rec.pop("handle").result()
        gen = rec.pop("gen")
        if gen is None:
            rec.update(bytes=res.total_bytes, write_s=res.write_s)
        else:  # the metadata-only generation, then the dump of the pending samples
            rec.update(bytes=gen.total_bytes + res["bytes"], write_s=gen.write_s + res["write_s"])
            keep = set(m.steps())
            for d in sorted((self.base / "pending").glob("step-*")):
                st = int(d.name[5:15])
                if st in keep or st >= rec["step"]:
                    continue
                if d.is_dir():  # its generation was pruned: so is the dump
                    L.remove_tree(d, ignore_errors=True)
                elif d.name.endswith(".lock"):  # and its lock file (its dump's call ended: no one holds it)
                    L.remove_file(d)
        self.stats["saves"].append(rec)
        self.log.write("saved", **rec)

    # ------------------------------------------------------------------ resume
    def _restore_pending_mode(self, m):
        """The newest generation whose pending dump was published too: restore both."""
        from .errors import CheckpointError, CorruptionError

        for step in sorted(m.steps(), reverse=True):
            d = self._pending_dir(step)
            if not (d / "MANIFEST.json").is_file():
                self.say(f"resume: generation {step} has no published pending dump (killed in between); trying an "
                         f"older one")
                continue
            try:
                m.restore(step)
                rep = self.api["load_data_by_key"](str(d))
            except (CorruptionError, CheckpointError) as e:
                self.say(f"resume: generation {step} or its pending dump does not load ({e}); trying an older one")
                continue
            return step, int(rep.get("bytes", 0)), d
        raise self.tq.CheckpointNotFoundError("no generation with a pending dump")

    def _restore(self, m) -> int:
        from .checkpoint import read_manifest

        t0 = time.perf_counter()
        try:
            if self.mode == "full":
                step, extra, pend_dir = m.restore(), 0, None
            else:
                step, extra, pend_dir = self._restore_pending_mode(m)
        except (self.tq.CheckpointNotFoundError, self.tq.CheckpointError):
            what = "generation" if self.mode == "full" else "generation with its pending dump"
            self.say(f"resume: no {what} was published before the kill; starting over")
            self.tq.kv_clear(self._pending(), PARTITION)
            self.log.write("restored", step=0, fresh=True)
            self.stats["restore"] = {"step": 0, "fresh": True}
            return 0
        restore_s = time.perf_counter() - t0
        meta = m.metadata(step)
        nbytes = read_manifest(m.path(step)).total_bytes + extra
        self.cursor = int(meta["next_prompt"])
        pending = self.tq.kv_list(PARTITION).get(PARTITION, {})
        partial = sorted({int(t["prompt"]) for t in pending.values() if t.get("status") == "partial"})
        for n, p in enumerate(partial):
            self.inflight[n % PRODUCERS].append(p)
        for _ in range(len(pending) // self.group):
            self.credits.acquire()
        self.log.write("restored", step=step, from_run=int(meta["run"]), acked=int(meta["acked"]),
                       pending=sorted(pending), partial=partial, mode=self.mode)
        self.log.write("restore_stats", step=step, bytes=nbytes, restore_s=restore_s)
        self.stats["restore"] = {"step": step, "bytes": nbytes, "restore_s": restore_s, "pending": len(pending),
                                 "partial_groups": len(partial)}
        how = f" and the pending samples from {pend_dir.parent.name}/{pend_dir.name}" if pend_dir else ""
        self.say(f"resume: restored generation {step}{how} ({nbytes / 2**20:.1f} MiB in {restore_s * 1e3:.0f} ms); "
                 f"{len(pending)} pending samples back ({len(partial)} partial groups to finish), prompt cursor "
                 f"{self.cursor}")
        return step

    # ------------------------------------------------------------------ run
    def say(self, s: str) -> None:
        self.log.say(s)

    def run(self) -> Dict[str, Any]:
        tq = self.tq
        cfg = self.cfg
        tq.init({"path": str(self.base / "store"), "num_units": 2, "result_type": "dict",
                 "sampler": {"name": "grpo_group_n", "n_samples_per_prompt": self.group}})
        try:
            m = tq.CheckpointManager(str(self.base / "generations"), keep_last=3)
            self.log.write("start", mode=self.mode, resume=bool(cfg.get("resume")))
            self.step = 0
            start = self._restore(m) if cfg.get("resume") else 0
            threads = self.threads = [threading.Thread(target=self._producer, args=(i,), daemon=True)
                                      for i in range(PRODUCERS)]
            for t in threads:
                t.start()
            last: Optional[Dict[str, Any]] = None
            for step in range(start + 1, int(cfg["steps"]) + 1):
                self.step = step
                t0 = time.perf_counter()
                n = self._train_step(step)
                if last is not None and last["handle"].wait(0):  # the background write is done
                    self._settle(m, last)
                    last = None
                line = f"step {step:3d}: trained {n} samples ({n // self.group} groups) in " \
                       f"{(time.perf_counter() - t0) * 1e3:5.0f} ms"
                if step % int(cfg["save_every"]) == 0 and step < int(cfg["steps"]):
                    if last is not None:
                        self._settle(m, last)
                    last = self._save(m, step)
                    what = "saved" if self.mode == "full" else "saved (metadata), pending samples dumped"
                    line += f" | generation {step} {what}: stall {last['stall_s'] * 1e3:.2f} ms, " \
                            f"{last['pending']} pending samples"
                self.say(line)
                if cfg.get("lockstep") and step < int(cfg["steps"]):
                    sys.stdin.readline()  # (the demo's go for the next step: it may kill the loop during it)
            self.stop.set()
            for t in threads:
                t.join()
            if last is not None:
                self._settle(m, last)
            if self.errors:
                raise self.errors[0]
            self.stats["left_pending"] = self._pending()
            self.log.write("done", left=self.stats["left_pending"])
        finally:
            self.stop.set()
            tq.close()
            self.log.close()
        return self.stats


def run_loop(cfg: Dict[str, Any], out: TextIO) -> Dict[str, Any]:
    """Run the loop with settings ``cfg`` (dir, steps, rows, group, tokens, save_every, seed,
    run, resume); returns its statistics (saves, restore)."""
    return Loop(cfg, out).run()
