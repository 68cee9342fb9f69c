"""fsi_nb.health on a real model: a tiny MoE whose router bias starves one expert, its routing records built as the training
loop builds them (`fsi_nb.train.routing_record` of the forward's per-layer stats), raises the dead-expert alarm once, after
`checks` records; the same model unstarved raises none."""
import pytest, torch

from fsi_nb.config import FSIEdgeConfig
from fsi_nb.health import RoutingAlarm, routing_alarms
from fsi_nb.model import FSIEdgeModel
from fsi_nb.moe import MoEFFN
from fsi_nb.train import routing_record

CFG = dict(vocab_size=256, d_model=32, n_layers=2, n_heads=4, kv_heads=2, max_seq_len=64, window_size=16,
           n_routed=4, n_shared=1, top_k=2, expert_d_ff=16)


def routing_records(model, n, seed=0) -> list[dict]:
    "`n` log-like records {'step', 'routing'} from forward passes over random token batches."
    g, out = torch.Generator().manual_seed(seed), []
    with torch.no_grad():
        for step in range(n):
            ids = torch.randint(0, CFG['vocab_size'], (4, 32), generator=g)
            out.append(dict(step=step, routing=routing_record(model(ids, labels=ids).routing)))
    return out


def starved_records(n, layer=1, expert=3) -> list[dict]:
    "Records of a tiny MoE whose `layer` never routes a token to `expert`: its router bias is far below any sigmoid affinity."
    torch.manual_seed(0)
    model = FSIEdgeModel(FSIEdgeConfig(**CFG)).eval()
    [m for m in model.modules() if isinstance(m, MoEFFN)][layer].router_bias[expert] = -10.0
    return routing_records(model, n)


def test_a_healthy_tiny_moe_raises_no_alarm():
    torch.manual_seed(0)
    recs = routing_records(FSIEdgeModel(FSIEdgeConfig(**CFG)).eval(), 12)
    assert all(len(r['routing']['entropy']) == 2 and sum(r['routing']['dead_experts']) == 0 for r in recs)
    assert routing_alarms(recs) == []
    assert routing_alarms(recs, RoutingAlarm(checks=1)) == []


def test_a_starved_expert_raises_the_alarm_once_after_checks_records():
    recs = starved_records(12)
    assert all(r['routing']['load'][1][3] == 0 and r['routing']['dead_experts'] == [0, 1] for r in recs)   # the model really starves it
    alarm = RoutingAlarm()
    fired = [(r['step'], line) for r in recs for line in alarm.update(r['routing'], r['step'])]
    dead = [(s, l) for s, l in fired if ' dead ' in l]
    assert [s for s, _ in dead] == [alarm.checks - 1], fired          # the 5th record in a row, and only then
    assert dead[0][1].startswith('ALARM step 4: layer 1 expert 3 dead for 5 checks (load 0); fix: '), dead
    assert 'router_bias_rate' in dead[0][1] and '\n' not in dead[0][1]


def test_an_alarm_fires_again_only_after_the_expert_came_back():
    dead = starved_records(3)   # three starved records, then a healthy one, then three starved again
    torch.manual_seed(0)
    ok = routing_records(FSIEdgeModel(FSIEdgeConfig(**CFG)).eval(), 1)
    seq = [*dead, *ok, *dead]
    alarm = RoutingAlarm(checks=3)
    fired = [i for i, r in enumerate(seq) for _ in alarm.update(r['routing'], i)]
    assert fired == [2, 6]
