"""nmt-serve's decoding workers keep a level memory under a long, varied load. oneDNN keeps a
compiled product (and its buffers) for every shape it meets, up to 1,024 in each of its two
caches, and decoding meets a new row count at most steps: nmt-serve caps the caches before the
workers fork (nmt.system.runtime.cap_onednn_cache). Uncapped, each worker of the tiny model grew
from 0.43 to 0.86 GB over 5,000 sentences; capped it stays at 0.23 GB."""

import os
import random
from pathlib import Path

import pytest
from test_serve import Server
from translate_helpers import save_tiny_checkpoint

# requests of 1-16 sentences of 1-30 words: ~480 sentences after the warm-up, over which the
# uncapped workers grew from 284 and 281 to 451 and 423 MiB (ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024
# LRU_CACHE_CAPACITY=1024), the capped ones from 215 and 214 to 218 and 217 (2026-11-28)
WARM_UP, REQUESTS = 10, 50


def resident_mib(pid: int) -> float:
    """Process pid's resident memory in MiB (/proc/<pid>/statm)."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def children(pid: int) -> list[int]:
    """The processes that process pid's main thread started."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.long
def test_a_workers_memory_stays_level_over_hundreds_of_sentences_of_varied_lengths(
        tiny_data_dir, tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "checkpoint.pt",
                                (tiny_data_dir / "spm.model").read_bytes())
    words = (tiny_data_dir / "test.clean.en").read_text(encoding="utf-8").split()
    rng = random.Random(0)
    server = Server(ckpt, "workers=2")
    try:
        workers = children(server.proc.pid)
        assert len(workers) == 2
        for request in range(WARM_UP + REQUESTS):
            if request == WARM_UP:
                warm = [resident_mib(pid) for pid in workers]
            texts = [" ".join(rng.choices(words, k=rng.randint(1, 30)))
                     for _ in range(rng.randint(1, 16))]
            assert len(server.translate(texts)) == len(texts)
        after = [resident_mib(pid) for pid in workers]
    finally:
        assert server.stop() == 0
    assert all(a <= 1.1 * w for w, a in zip(warm, after, strict=True)), (warm, after)
