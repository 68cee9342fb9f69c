"""The run folder has one owner (`fsi_nb.run_folder`): no other module opens its files or loads a checkpoint, and a run
written before the renovation (checkpoint format 1, a `stages` key in its training config) still loads."""
import ast, json, shutil, socket
from pathlib import Path

import pytest, torch

from fsi_nb.checkpoint import rng_state, save_checkpoint
from fsi_nb.config import FSIEdgeConfig, config_to_dict
from fsi_nb.model import FSIEdgeModel
from fsi_nb.run_folder import UpgradeError, is_smoke_run, load_run, pick_checkpoint, read_checkpoint, read_config, read_status
from fsi_nb.tokenizer import tokenizer_sha256, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
OWNER = 'run_folder'
RUN_FILES = ('status.json', 'config.json', 'eval.json')

# Each entry: (module, the function or code string it is in, what it does) -> why it may.
ALLOWED = {
    ('checkpoint', 'load_checkpoint', 'torch.load'):
        "the checkpoint file format itself: verify one file's SHA-256, then read it weights_only; the owner is its only caller",
    ('export', 'export_hf', 'config.json'):
        "the transformers folder's own config.json (transformers' file name), written into the export folder, not a run's",
    ('export', '_not_replaceable', 'config.json'):
        "reads an earlier transformers export's config.json (model_type fsi_edge) before --force replaces that folder; a run folder is refused first",
    ('export', 'run_hf_check', 'torch.load'):
        "reads back the answer its own transformers subprocess wrote into a temp folder (logits, token ids), not a checkpoint",
    ('export', '_HF_CHECK', 'torch.load'):
        "that subprocess's script (a code string run where fsi_nb cannot be imported) reading the job file run_hf_check wrote",
}

def _findings(tree, module:str, scope:str='<module>') -> set:
    "What `tree` does with a run's files: (module, scope, what) for each file name, torch.load or load_checkpoint."
    out = set()
    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if scope == '<module>' else f'{scope}.{child.name}'
            elif isinstance(child, ast.Assign) and isinstance(child.value, ast.Constant) and isinstance(child.value.value, str):
                code = child.value.value
                if '\n' in code and 'import ' in code:   # a script the module runs in a subprocess
                    try: out.update(_findings(ast.parse(code), module, child.targets[0].id))
                    except (SyntaxError, AttributeError): pass
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                s = child.value.strip()
                out.update((module, scope, name) for name in RUN_FILES if s == name or s.endswith('/' + name))
            elif isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Attribute) and f.attr == 'load' and isinstance(f.value, ast.Name) and f.value.id == 'torch':
                    out.add((module, scope, 'torch.load'))
                if (f.id if isinstance(f, ast.Name) else getattr(f, 'attr', None)) == 'load_checkpoint':
                    out.add((module, scope, 'load_checkpoint'))
            elif isinstance(child, ast.ImportFrom):
                out.update((module, scope, f'import {a.name}') for a in child.names
                           if a.name == 'load_checkpoint' or (child.module == 'torch' and a.name == 'load'))
            visit(child, inner)
    visit(tree, scope)
    return out

def _all_findings() -> set:
    found = set()
    for p in sorted((ROOT/'fsi_nb').glob('*.py')):
        if p.stem.startswith('_') or p.stem == OWNER: continue
        found |= _findings(ast.parse(p.read_text()), p.stem)
    return found

def test_only_the_owner_opens_run_files_or_loads_checkpoints():
    "A module that reads status.json/config.json/eval.json by name, or loads a checkpoint itself, is a second owner."
    extra = sorted(_all_findings() - set(ALLOWED))
    assert not extra, ("these read or write a run's files themselves; ask fsi_nb.run_folder instead (read_status, read_config, "
                       "read_eval, read_checkpoint, pick_checkpoint, load_run), or add a justified entry to ALLOWED:\n"
                       + '\n'.join(f'  fsi_nb/{m}.py, in {s}: {w}' for m, s, w in extra))

def test_every_allowed_caller_still_exists():
    "An entry nothing needs any more goes, so the list stays the list of exceptions."
    stale = sorted(set(ALLOWED) - _all_findings())
    assert not stale, f"ALLOWED entries no module needs any more: {stale}. Fix: delete them."

def test_the_caller_test_sees_what_it_forbids():
    "The scanner finds each forbidden thing (so a pass above means something)."
    code = '''
import torch
from .checkpoint import load_checkpoint
SCRIPT = """import torch
torch.load(p)
"""
def f(run): return json.loads((run/'status.json').read_text()), torch.load(run), load_checkpoint(run)
class C:
    def g(self, d): return d/'eval.json', f"{d}/config.json"
'''
    found = {(s, w) for _, s, w in _findings(ast.parse(code), 'x')}
    assert found == {('<module>', 'import load_checkpoint'), ('SCRIPT', 'torch.load'), ('f', 'status.json'), ('f', 'torch.load'),
                     ('f', 'load_checkpoint'), ('C.g', 'eval.json'), ('C.g', 'config.json')}, found


# ---- a run written before the renovation ------------------------------------------------------------------------------
# The formats below mirror what fsi_nb wrote at commit 86b41f0, the last commit before b6f4a28 ("WIP renovation: ...
# stages as data in config") replaced TrainConfig.stages with `stage`: `train.py`'s checkpoint (format
# 'fsi_nb.checkpoint/1': the loop's counters at the top level, no train_state or world_size), its config.json (no stage,
# objective, init_from or world_size) and its final status.json. FSIEdgeConfig had no `arch` then.
OLD_COMMIT = '86b41f0797eb4b5c5a140575a5bd5a0961c3595c'
OLD_TRAIN = dict(batch_size=1, grad_accum=1, seq_len=64, seq_curriculum=[], max_steps=2, lr=3e-4, min_lr=1e-5, warmup_steps=1,
                 weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0, precision='fp32', device='cpu', compile=False,
                 seed=1337, log_interval=1, save_interval=200, save_minutes=30.0, keep_checkpoints=3, max_bad_steps=5,
                 budget_hours=None, stages=['stage1'])

def _old_run(tmp_path, stages=('stage1',), step=2, **train):
    "A run folder as fsi_nb 86b41f0 left it after a 2-step smoke run of a small dense model."
    data = tmp_path/'data'
    if not (data/'tokenizer').exists():
        train_tokenizer(['def f(x):\n    return [x, {x: (x,)}]\n' * 40, 'Some English text.\n' * 40], data/'tokenizer', vocab_size=300)
    cfg = FSIEdgeConfig(vocab_size=512, d_model=32, n_layers=1, n_heads=4, kv_heads=2, d_ff=64, max_seq_len=64, window_size=16)
    torch.manual_seed(0)
    model = FSIEdgeModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model_cfg = {k: v for k, v in config_to_dict(cfg).items() if k != 'arch'}
    train_cfg = OLD_TRAIN | dict(stages=list(stages)) | train
    tok_sha, man_sha = tokenizer_sha256(data/'tokenizer'), 'e' * 64
    stage = stages[min(step // OLD_TRAIN['max_steps'], len(stages) - 1)]
    run = tmp_path/'runs'/'tiny-smoke'
    ck = dict(format='fsi_nb.checkpoint/1', step=step, loss=6.1, model=model.state_dict(), optimizer=opt.state_dict(),
              scheduler=sched.state_dict(), config=dict(model=model_cfg, train=train_cfg),
              args=dict(preset='tiny', run_name='tiny-smoke', smoke=True, overrides={}), rng=rng_state(), token_offset=step * 64,
              data=dict(seed=1337, stage=stage, step=step, token_offset=step * 64), tokenizer_sha256=tok_sha,
              manifest_sha256=man_sha, loss_window=[6.2, 6.1], bad_steps=0, elapsed_seconds=1.5,
              torch_version=str(torch.__version__), git_commit=OLD_COMMIT)
    save_checkpoint(ck, run/'checkpoints', step)
    info = dict(preset='tiny', run_name='tiny-smoke', smoke=True, total_steps=OLD_TRAIN['max_steps'] * len(stages), model=model_cfg,
                train=train_cfg, overrides={}, settings=dict(data_dir=str(data), runs_dir=str(tmp_path/'runs')), device='cpu',
                threads=1, git_commit=OLD_COMMIT, torch=str(torch.__version__), host=socket.gethostname(),
                data=dict(dir=str(data), tokenizer_sha256=tok_sha, manifest_sha256=man_sha), resumed_from=None)
    (run/'config.json').write_text(json.dumps(info, indent=1))
    (run/'status.json').write_text(json.dumps(dict(state='finished', message='finished 2/2 steps', step=step, total_steps=2, loss=6.1,
                                                   checkpoint=str(run/'checkpoints'/f'step_{step:07d}.pt'), tokens_per_sec=100.0,
                                                   ended=1.0, pid=1)))
    return run, model

def test_a_run_from_before_the_renovation_loads(tmp_path):
    run, model = _old_run(tmp_path)
    r = load_run(run)
    assert (r.step, r.train_config.stage, r.train_config.max_steps, r.model_config.arch) == (2, 'stage1', 2, 'hybrid')
    assert all(torch.equal(r.model.state_dict()[k], v) for k, v in model.state_dict().items())
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad(): assert torch.equal(r.model(ids).logits, model.eval()(ids).logits)
    assert (r.info.git_commit, r.info.stage, r.info.world_size, r.info.train_config.stage) == (OLD_COMMIT, None, 1, 'stage1')
    ck = read_checkpoint(r.checkpoint)   # format 1's counters, where a resume looks for them today
    assert ck.train_state == dict(step=2, tokens=128, elapsed_seconds=1.5, bad_steps=0, loss=6.1, loss_window=[6.2, 6.1])
    assert (ck.format, ck.world_size, ck.data['stage']) == ('fsi_nb.checkpoint/1', 1, 'stage1')
    assert (read_status(run).state, is_smoke_run(run)) == ('finished', True)
    with pytest.raises(FileNotFoundError, match='no best checkpoint.*older kit.*Fix:'): pick_checkpoint(run, 'best')

def test_an_old_multi_stage_run_maps_onto_the_stage_it_was_in(tmp_path):
    "The old kit trained `stages` in turn inside one run; a checkpoint records the stage it was saved in."
    run, _ = _old_run(tmp_path, stages=('stage1', 'stage1b'), step=2)   # step 2 of max_steps 2: into stage1b
    assert load_run(run).train_config.stage == 'stage1b'
    with pytest.raises(UpgradeError, match='does not record the stage'): read_config(run).train_config   # config.json does not

def test_an_unknown_key_is_refused_with_the_commit_and_the_fix(tmp_path):
    run, _ = _old_run(tmp_path, warp_drive=9)
    with pytest.raises(UpgradeError) as e: load_run(run)
    msg = str(e.value)
    assert "train field(s) ['warp_drive']" in msg and OLD_COMMIT in msg and 'fsi_nb.checkpoint/1' in msg
    assert 'Fix: read it with the kit that wrote it' in msg and 'CONFIG_UPGRADES' in msg, msg

# ---- a run written at c516f28, before the objectives' settings left TrainConfig ---------------------------------------
# At c516f28 (format 'fsi_nb.checkpoint/2') TrainConfig still carried every objective's settings (e8fd0fb moved them
# into SFTConfig/GRPOConfig/DPOConfig); a checkpoint's train config had these nine keys with these defaults.
C516_OBJECTIVE = dict(epochs=0.0, group_size=8, max_new_tokens=96, temperature=1.0, clip_eps=0.2, kl_coef=0.0, dpo_beta=0.1,
                      tasks='coldstart', num_prompts=256)

def test_a_run_from_c516f28_loads_with_its_objective_settings(tmp_path):
    from fsi_nb.config import TrainConfig, config_to_dict
    run, model = _old_run(tmp_path)
    old = torch.load(run/'checkpoints'/'step_0000002.pt', weights_only=True)
    train = config_to_dict(TrainConfig(max_steps=2, stage='stage3b')) | C516_OBJECTIVE | dict(kl_coef=0.05, tasks='arith')
    old.update(format='fsi_nb.checkpoint/2', config=dict(model=old['config']['model'], train=train), world_size=1,
               train_state=dict(step=2, tokens=128, elapsed_seconds=1.5, bad_steps=0, loss=6.1, loss_window=[6.1]),
               data=dict(old['data'], stage='stage3b'), git_commit='c516f28')
    for k in ('loss_window', 'bad_steps', 'elapsed_seconds'): old.pop(k)
    shutil.rmtree(run/'checkpoints'); save_checkpoint(old, run/'checkpoints', 2)
    r = load_run(run)
    assert (r.step, r.train_config.stage) == (2, 'stage3b') and all(torch.equal(r.model.state_dict()[k], v) for k, v in model.state_dict().items())
    ck = read_checkpoint(r.checkpoint)   # the GRPO settings of that run, in its objective section; DPO's and SFT's dropped
    assert ck.objective_config == dict(tasks='arith', group_size=8, max_new_tokens=96, temperature=1.0, clip_eps=0.2, kl_coef=0.05, num_prompts=256)
