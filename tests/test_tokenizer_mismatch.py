"A checkpoint and a tokenizer that do not belong together: resuming and evaluating both refuse with a fix, and the run is untouched."
import shutil

import pytest

from fsi_nb.run_folder import load_run
from fsi_nb.tokenizer import train_tokenizer
from fsi_nb.checkpoint import list_checkpoints
from test_train import cli, run

@pytest.fixture(scope='module')
def run_then_swap_tokenizer(prepared_data, tmp_path_factory):
    "A 3-step run, then its data folder's tokenizer replaced by one trained on other text."
    tmp = tmp_path_factory.mktemp('swap')
    data, runs = tmp/'data', tmp/'runs'
    shutil.copytree(prepared_data, data)
    assert run(cli(data, runs, 'r', steps=3)).returncode == 0
    shutil.rmtree(data/'tokenizer')
    train_tokenizer(['def other(x):\n    return [x, {x: (x,)}]\n' * 50, 'Some other English text entirely.\n' * 50], data/'tokenizer', vocab_size=600)
    return data, runs

def test_resume_with_another_tokenizer_is_refused(run_then_swap_tokenizer):
    data, runs = run_then_swap_tokenizer
    before = list_checkpoints(runs/'r'/'checkpoints')
    r = run(cli(data, runs, 'r', steps=6))
    assert r.returncode == 2 and 'tokenizer' in r.stderr and 'Fix:' in r.stderr, r.stderr[-1500:]
    assert list_checkpoints(runs/'r'/'checkpoints') == before   # nothing lost, nothing written

def test_evaluating_with_another_tokenizer_is_refused(run_then_swap_tokenizer):
    data, runs = run_then_swap_tokenizer
    with pytest.raises(ValueError, match='Fix:') as e: load_run(runs/'r', data_dir=data)
    assert 'tokenizer' in str(e.value)
