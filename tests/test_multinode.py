"""Multi-node launch on real rendezvous (issue 6 section 5).

`hybridpar launch --nodes 2 --gpus-per-node 4` writes the torchrun command; the test runs it
twice, as two "nodes" (two torchrun agents, c10d rendezvous on 127.0.0.1, 4 ranks each), for
the tiny recipe (TP2 x PP2 x DP2: each node holds one whole DP replica). Steps 1-3 must match
a one-process run (1e-5, as 8 ranks vs 1 in test_train_cli). Then the node without rank 0 is
lost (its agent and its 4 ranks SIGKILLed together, as when a machine dies): the other node's
ranks must report the lost peer and its agent must exit non-zero within FAIL_FAST_S.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "tiny.yaml"
STEPS = 20  # long enough to still be running when the node is killed after step 3
FAIL_FAST_S = 30  # measured: see README "Reliability"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HEAD_NODE="127.0.0.1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for key in ("RANK", "WORLD_SIZE", "HYBRIDPAR_FAULT"):
        env.pop(key, None)
    return env


def _losses(path: Path) -> dict:
    if not path.exists():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _wait_for_listener(port: int, agent: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and agent.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the first node's rendezvous store never listened on port {port}")


def _kill_node(agent: subprocess.Popen) -> None:
    """SIGKILL a "node": the launch script, its torchrun agent and every rank it started."""
    procs = [psutil.Process(agent.pid)] + psutil.Process(agent.pid).children(recursive=True)
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("multinode")
    run = base / "run"
    port = _port()
    gen = subprocess.run(
        [sys.executable, "-m", "hybridpar", "launch", "--recipe", str(TINY), "--nodes", "2", "--gpus-per-node", "4",
         "--port", str(port), "--out", str(base / "launch"), "--", "--steps", str(STEPS), "--timeout-s", "60",
         "--out", str(run)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    script = base / "launch" / "torchrun.sh"
    assert "--nnodes=2" in script.read_text() and "--rdzv-backend=c10d" in script.read_text()
    ref = subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(TINY), "--nproc", "1", "--tp", "1",
                          "--pp", "1", "--dp", "1", "--steps", str(STEPS), "--out", str(base / "ref")],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]

    logs = [(open(base / f"node{i}.out", "w"), open(base / f"node{i}.err", "w")) for i in range(2)]
    # Node 0 starts first and hosts the rendezvous store (a real head node does) before node 1
    # joins: the node lost below is then never the store's host, whose loss would end the
    # survivor's agent through the store before its ranks can report the lost peer.
    agents = []
    for o, e in logs:
        agents.append(subprocess.Popen(["bash", str(script)], cwd=ROOT, env=_env(), stdout=o, stderr=e,
                                       start_new_session=True))
        if len(agents) == 1:
            _wait_for_listener(port, agents[0])
    try:
        deadline = time.time() + 400
        while len(_losses(run / "metrics.jsonl")) < 3:
            assert time.time() < deadline and all(a.poll() is None for a in agents), "two-node run did not reach step 3"
            time.sleep(0.1)
        # rank 0 prints the step lines: its node is the survivor, the other one dies. Node 0, the
        # store's host, started first: torch's rendezvous orders nodes by address, then agent pid,
        # so it holds ranks 0-3.
        first = 0 if "step 1/" in (base / "node0.out").read_text() else 1
        assert first == 0, "rank 0 is not on the node that hosts the rendezvous store"
        victim, survivor = agents[1 - first], agents[first]
        killed_at = time.time()
        _kill_node(victim)
        survivor.wait(timeout=300)
        elapsed = time.time() - killed_at
    finally:
        for a in agents:
            if a.poll() is None:
                _kill_node(a)
                a.wait()
        for o, e in logs:
            o.close()
            e.close()
    return {
        "losses": _losses(run / "metrics.jsonl"), "ref": _losses(base / "ref" / "metrics.jsonl"),
        "rc": survivor.returncode, "elapsed": elapsed,
        "out": (base / f"node{first}.out").read_text(), "err": (base / f"node{first}.err").read_text(),
    }


def test_two_nodes_train_like_one_process(two_nodes):
    got, ref = two_nodes["losses"], two_nodes["ref"]
    assert {1, 2, 3} <= set(got), got
    for step in (1, 2, 3):
        assert abs(got[step] - ref[step]) <= 1e-5, (step, got[step], ref[step])
    assert "world 8 = tp 2 x cp 1 x pp 2 x dp 2" in two_nodes["out"]


def test_losing_a_node_fails_the_other_fast_and_clearly(two_nodes):
    print(f"surviving node's agent exited {two_nodes['elapsed']:.2f} s after the other node was killed")
    assert two_nodes["rc"] != 0
    assert two_nodes["elapsed"] < FAIL_FAST_S
    assert "lost contact with a peer" in two_nodes["err"], two_nodes["err"][-3000:]
    assert len(two_nodes["losses"]) < STEPS
