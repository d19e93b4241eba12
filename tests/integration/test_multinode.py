"""Multi-node launch on real rendezvous (issue 6 section 5).

`hybridpar launch --nodes 2 --gpus-per-node 4` writes the torchrun command; the test runs it
twice, as two "nodes" (two torchrun agents, c10d rendezvous on 127.0.0.1, 4 ranks each), for
the tiny recipe (TP2 x PP2 x DP2: each node holds one whole DP replica). Steps 1-3 must match
a one-process run (1e-5, as 8 ranks vs 1 in test_train_cli). Then the node without rank 0 is
lost (its agent and its 4 ranks SIGKILLed together, as when a machine dies): the other node's
ranks must report the lost peer and its agent must exit non-zero within FAIL_FAST_S. A second
two-node run loses the head node instead (node 0: the c10d store's host and ranks 0-3): node 1's
agent (hybridpar.launch.node_agent) must say so in one line, without a traceback, and exit 1 as fast.
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

ROOT = Path(__file__).resolve().parents[2]
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


def _two_node_run(base: Path, lose: str, reference: bool = False) -> dict:
    """Write the launch script, run it as two nodes (node 0 first), lose one node after step 3
    (``lose``: "head", node 0, which hosts the rendezvous store and rank 0, or "other", node 1)
    and wait for the surviving node's agent. Returns the losses, its exit code, time to exit and
    output."""
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
    if reference:
        ref = subprocess.run([sys.executable, "-m", "hybridpar", "train", "--recipe", str(TINY), "--nproc", "1", "--tp",
                              "1", "--pp", "1", "--dp", "1", "--steps", str(STEPS), "--out", str(base / "ref")],
                             cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
        assert ref.returncode == 0, ref.stderr[-3000:]

    logs = [(open(base / f"node{i}.out", "w"), open(base / f"node{i}.err", "w")) for i in range(2)]
    # Node 0 starts first and hosts the rendezvous store (a real head node does) before node 1
    # joins, so which node is lost is chosen, not left to a race: losing the store's host ends
    # the survivor's agent through the store (hybridpar.launch.node_agent's one line), losing the other
    # node lets the survivor's ranks report the lost peer.
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
        # Rank 0 prints the step lines. Node 0, the store's host, started first: torch's
        # rendezvous orders nodes by address, then agent pid, so it holds ranks 0-3.
        assert "step 1/" in (base / "node0.out").read_text(), "rank 0 is not on the node that hosts the rendezvous store"
        lost = 0 if lose == "head" else 1
        victim, survivor = agents[lost], agents[1 - lost]
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
        "losses": _losses(run / "metrics.jsonl"),
        "ref": _losses(base / "ref" / "metrics.jsonl") if reference else None,
        "rc": survivor.returncode, "elapsed": elapsed,
        "out": (base / f"node{1 - lost}.out").read_text(), "err": (base / f"node{1 - lost}.err").read_text(),
        "port": port,
    }


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    return _two_node_run(tmp_path_factory.mktemp("multinode"), lose="other", reference=True)


@pytest.fixture(scope="module")
def head_node_lost(tmp_path_factory):
    return _two_node_run(tmp_path_factory.mktemp("multinode_head"), lose="head")


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


def test_losing_the_head_node_fails_the_other_fast_in_one_line(head_node_lost):
    """Node 0 (the rendezvous store's host, ranks 0-3) is lost: node 1's agent stops its ranks and
    says so in one line (hybridpar.launch.node_agent) instead of torch's store traceback."""
    got = head_node_lost
    print(f"surviving node's agent exited {got['elapsed']:.2f} s after the head node was killed")
    line = f"hybridpar: lost the rendezvous store at 127.0.0.1:{got['port']} on the head node"
    assert got["rc"] == 1, got["err"][-3000:]
    assert got["elapsed"] < FAIL_FAST_S
    assert line in got["err"] and "restart the job" in got["err"], got["err"][-3000:]
    # torch's log lines (stopping the ranks, a failed keep-alive heartbeat) may come before it,
    # but no Python traceback, no ChildFailedError report and no C++ stack from the store client.
    for noise in ("Traceback", "ChildFailedError", "Exception raised from", "frame #"):
        assert noise not in got["err"], got["err"][-3000:]


def test_no_head_node_to_join_is_one_line():
    """An agent that never reaches the store (wrong HEAD_NODE, head not started) says so."""
    port = _port()
    res = subprocess.run([sys.executable, "-m", "hybridpar.launch.node_agent", "--nnodes=2", "--nproc-per-node=1",
                          "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=none",
                          "--rdzv-conf=is_host=0,read_timeout=2", "-m", "hybridpar", "train", "--recipe", str(TINY)],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    assert f"hybridpar: cannot reach the rendezvous store at 127.0.0.1:{port}" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
