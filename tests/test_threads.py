"""Training next to other work: with `threads = 0` the trainer keeps torch's CPU threads to the cores other programs
leave free (`fsi_nb.runs.CPUShare`), and every log record says how many it used. A real run next to a real busy
process; what is asserted is the thread count the trainer chose, never a speed."""
import json, os, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

@pytest.mark.skipif(not hasattr(os, 'sched_getaffinity') or len(os.sched_getaffinity(0)) < 2, reason='needs two cores')
def test_a_busy_process_takes_a_thread_away(prepared_data, tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, '-c', f'import os; os.sched_setaffinity(0, {{{cpus[0]}}})\nwhile True: pass'])
    try:
        # six seconds of training (a budget, not a step count: readings come every two seconds, whatever the machine's speed)
        r = subprocess.run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--max-steps', '100000', '--budget-hours', str(6 / 3600),
                            '--batch-size', '2', '--seq-len', '64', '--threads', '0', '--log-interval', '1', '--data-dir', str(prepared_data),
                            '--runs-dir', str(tmp_path), '--run-name', 'shared', '--no-progress', '--set', 'warmup_steps=2'],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
    finally: busy.kill(); busy.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    threads = [json.loads(l)['threads'] for l in (tmp_path/'shared'/'log.jsonl').read_text().splitlines()]
    assert threads and all(1 <= t <= len(cpus) for t in threads), threads
    # the busy process holds a core from before the first step: the first reading counts it
    assert threads[-1] < len(cpus), f'{len(cpus)} cores, one of them busy, and the run kept {threads[-1]} threads'
