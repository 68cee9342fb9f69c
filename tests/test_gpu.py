"""The model and the trainer on a CUDA GPU, against the CPU as the reference. Skipped where torch sees no GPU (CI);
run on a GPU machine with `pytest tests/test_gpu.py`. The speed, MFU and memory of the GPU presets are measured by
`python -m fsi_nb.bench --only gpu`, never asserted here."""
import json, math, subprocess, sys

import pytest, torch

from fsi_nb.attention import _code_like_ids
from fsi_nb.evaluate import validation_loss
from fsi_nb.run_folder import load_run
from fsi_nb.model import FSIEdgeModel
from fsi_nb.moe import MoEFFN
from test_model import small_cfg   # the model tests' size: Helix merges often at T=300, 8 experts in two populations

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU (torch.cuda.is_available() is False)')

@pytest.fixture(autouse=True)
def exact_fp32():
    "fp32 matmuls in full fp32 (no TF32), so a GPU is compared with a CPU at fp32 accuracy."
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old

def rel(a, b): return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_cuda_forward_and_backward_equal_cpu(moe):
    "Same weights, same batch: loss, logits and every gradient on the GPU equal the CPU's (fp32)."
    torch.manual_seed(0)
    cpu = FSIEdgeModel(small_cfg(moe))
    gpu = FSIEdgeModel(small_cfg(moe)).cuda(); gpu.load_state_dict(cpu.state_dict())
    ids = _code_like_ids(2, 300, 512, seed=1)
    oc, og = cpu(input_ids=ids, labels=ids), gpu(input_ids=ids.cuda(), labels=ids.cuda())
    oc.loss.backward(); og.loss.backward()
    assert abs(oc.loss.item() - og.loss.item()) <= 1e-5 * oc.loss.item()
    assert rel(og.logits.cpu(), oc.logits) <= 1e-4
    for (name, pc), pg in zip(cpu.named_parameters(), gpu.parameters()):
        assert rel(pg.grad.cpu(), pc.grad) <= 1e-3, name

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_cuda_streaming_equals_parallel(moe):
    "Token-by-token generation state on the GPU (ring buffer, anchors, Helix slots) reproduces the parallel logits."
    torch.manual_seed(0)
    m = FSIEdgeModel(small_cfg(moe)).cuda().eval()
    ids = _code_like_ids(2, 300, 512, seed=1).cuda()
    with torch.no_grad():
        par = m(ids).logits
        state = m.init_state(2)
        seq = torch.stack([m.step(ids[:, t], state) for t in range(ids.shape[1])], 1)
    assert rel(seq, par) <= 1e-4

def test_cuda_grouped_dispatch_equals_loop_in_bf16():
    "The GPU's `torch._grouped_mm` expert dispatch (what 'auto' picks under bf16) equals the per-expert loop."
    cfg = small_cfg(True, d_model=96, n_routed=16, top_k=4, expert_d_ff=64)
    torch.manual_seed(0)
    grouped = MoEFFN(cfg, dispatch='grouped').cuda()
    loop = MoEFFN(cfg, dispatch='loop').cuda(); loop.load_state_dict(grouped.state_dict())
    x = torch.randn(4, 256, 96, device='cuda', requires_grad=True)
    outs, grads = [], []
    for moe in (grouped, loop):
        with torch.autocast('cuda', dtype=torch.bfloat16):
            y, aux, routing = moe(x)
        (y.float().square().mean() + aux['orthogonality']).backward()
        outs.append(y.float()); grads.append((x.grad.clone(), moe.routed_w13.grad.clone())); x.grad = None
    assert rel(outs[0], outs[1]) <= 2e-2
    for g, l in zip(*grads): assert rel(g, l) <= 3e-2

def test_train_on_cuda_then_evaluate_on_cpu(prepared_data, tmp_path):
    "`python -m fsi_nb.train --device cuda` trains in bf16 and checkpoints; the run loads on the CPU and the GPU to the same validation loss."
    cmd = [sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--device', 'cuda', '--max-steps', '6', '--batch-size', '4',
           '--seq-len', '64', '--save-interval', '3', '--log-interval', '1', '--no-progress',
           '--data-dir', str(prepared_data), '--runs-dir', str(tmp_path), '--run-name', 'gpu']
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    log, config = [json.loads(l) for l in (tmp_path/'gpu'/'log.jsonl').read_text().splitlines()], json.loads((tmp_path/'gpu'/'config.json').read_text())
    assert [x['step'] for x in log] == list(range(6)) and all(math.isfinite(x['loss']) for x in log)
    assert config['device'].startswith('cuda')
    assert abs(log[0]['loss'] - math.log(32768)) < 0.1  # the step-0 gate, on the GPU too
    assert config['train']['precision'] == 'bf16'
    losses = [validation_loss(load_run(tmp_path/'gpu', device=d).model, prepared_data, batches=2, batch_size=2, seq_len=64)['loss']
              for d in ('cpu', 'cuda')]
    assert abs(losses[0] - losses[1]) <= 1e-4 * losses[0], losses
