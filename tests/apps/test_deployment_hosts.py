"""The deployment across hosts of docs/deployment.md (the README links to it), run as written with every box in
its own Linux network namespace.

Boxes: the edge server (SuperLink, ServerApp, decoder data plane), two CU boxes (a Ray head and a SuperNode each),
two device boxes per CU (Ray worker nodes offering ``device_0`` / ``device_1``), a rogue box (a SuperNode with a
key nobody registered) and the operator's commands, run on the server box. They reach each other only through a
bridge (tests/netns_lab.py), at 10.213.0.x. TLS is on for Flower's APIs and for the data plane; SuperNode
authentication is on. The commands are that page's ``deploy-hosts`` block with its placeholders filled in; the
run itself only adds a small model and one short round (``TEST_OVERRIDES``) and an output folder.

Asserted: the round finished on both clusters; device k of cluster n ran in device box (n, k)'s namespace (the
``device-netns`` each device reports); the rogue SuperNode was refused; nothing is left running and no namespace
is left behind. Skipped, with the reason, where network namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.flower_env import ROOT, flower_env
from tests.netns_lab import NetnsLab, why_not_available
from tests.tls_certs import self_signed

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CLUSTERS, DEVICES = 2, 2
BOXES = ["server", *(f"cu{n}" for n in range(CLUSTERS))]
BOXES += [f"d{n}{k}" for n in range(CLUSTERS) for k in range(DEVICES)] + ["rogue"]
TEST_OVERRIDES = (
    "task=classification model=bert_tiny federation=tiny network=small network.devices_per_cluster=2 "
    "method=collapipe_no_ss federation.num_rounds=1 federation.local_steps=3 eval.max_examples=64 run_name=hosts "
)
PLACEHOLDER = re.compile(r"(?<![A-Za-z0-9-])(SERVER|CU|DEVICE|CERTS|KEYS|N|K)(?![A-Za-z0-9])")
ROGUE = 9  # the rogue SuperNode's index: its key is KEYS/cu_9, which nobody registers
STARTED = "block forever"  # what `ray start --block` prints once its node is up

DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"  # the deploy-hosts blocks (the README links there)


def readme_steps(marker: str) -> list[tuple[str, str]]:
    """(box kind, command) of the page's bash block after ``<!-- readme:<marker> -->``, in order; the kind is
    the ``# [kind]`` comment above each group of lines."""
    text = DEPLOYMENT_DOC.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text[text.index(f"<!-- readme:{marker} -->") :], re.S)
    assert block is not None, f"no bash block after docs/deployment.md's {marker} marker"
    steps, kind = [], ""
    for line in block.group(1).splitlines():
        tag = re.match(r"#\s*\[(\w+)\]", line)
        if tag:
            kind = tag.group(1)
        elif line.strip() and not line.startswith("#"):
            steps.append((kind, line.strip()))
    return steps


def readme_toml(marker: str) -> str:
    text = DEPLOYMENT_DOC.read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", text[text.index(f"<!-- readme:{marker} -->") :], re.S)
    assert block is not None, f"no toml block after docs/deployment.md's {marker} marker"
    return block.group(1)


def fill(command: str, values: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], command)


def _wait_for(path: Path, text: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(1.0)
    raise TimeoutError(f"{path.name} did not say {text!r} within {timeout_s:.0f} s:\n{path.read_text()[-2000:]}")


class Deployment:
    """The boxes, their folders and environments, and the page's steps run in them."""

    def __init__(self, lab: NetnsLab, work: Path, data_dir: Path) -> None:
        self.lab, self.work = lab, work
        self.certs, self.keys = work / "certs", work / "keys"
        self.keys.mkdir()
        cert, _ = self_signed(self.certs, "server", ips=(lab.address["server"],))  # server.pem, server.key
        shutil.copy(cert, self.certs / "ca.pem")  # self-signed: its own CA
        self.data_dir = data_dir

    def values(self, n: int | str = "", k: int | str = "") -> dict[str, str]:
        a = self.lab.address
        out = {"SERVER": a["server"], "CERTS": str(self.certs), "KEYS": str(self.keys), "N": str(n), "K": str(k)}
        out["CU"] = a.get(f"cu{n}", a["rogue"])
        out["DEVICE"] = a.get(f"d{n}{k}", "")
        return out

    def env(self, box: str) -> dict[str, str]:
        folder = self.work / box
        folder.mkdir(exist_ok=True)
        env = flower_env(folder / "flwr", self.data_dir)
        env.pop("RAY_ADDRESS", None)
        env["RAY_TMPDIR"] = str(folder)  # each box its own /tmp, as separate hosts have
        env["RAY_raylet_start_wait_time_s"] = "120"  # a node's registration, on a machine shared by nine boxes
        return env

    def start(self, box: str, command: str) -> tuple[subprocess.Popen, Path]:
        program = next(word for word in command.split() if "=" not in word)
        log = self.work / f"{box}-{program}.log"
        return self.lab.start(box, command, log, self.env(box), self.work / box), log

    def run(self, box: str, command: str, cwd: Path | None = None, timeout_s: float = 120.0):
        return self.lab.run(box, command, self.env(box), cwd or self.work / box, timeout_s)

    def run_until_ok(self, box: str, command: str, timeout_s: float) -> None:
        """A one-shot step that needs a service still starting (``flwr supernode register``): retried."""
        deadline = time.time() + timeout_s
        while True:
            proc = self.run(box, command)
            if proc.returncode == 0:
                return
            if time.time() > deadline:
                raise AssertionError(f"`{command}` failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
            time.sleep(3.0)


def _deploy_and_run(dep: Deployment, out: Path):
    steps = readme_steps("deploy-hosts")
    assert [kind for kind, _ in steps] == ["operator", "server", "operator", "cu", "cu", "device", "operator"]
    (keygen, link, register, head, supernode, worker, run_cmd) = (cmd for _, cmd in steps)
    home = dep.work / "server" / "flwr"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(fill(readme_toml("deploy-hosts-connection"), dep.values()))
    for n in [*range(CLUSTERS), ROGUE]:
        assert dep.run("server", fill(keygen, dep.values(n))).returncode == 0
    dep.start("server", fill(link, dep.values()))
    for n in range(CLUSTERS):
        dep.run_until_ok("server", fill(register, dep.values(n)), timeout_s=120)
    for n in range(CLUSTERS):  # Ray nodes one at a time: on two busy cores, six starting at once time out
        _wait_for(dep.start(f"cu{n}", fill(head, dep.values(n)))[1], STARTED, 180)
        dep.start(f"cu{n}", fill(supernode, dep.values(n)))
        for k in range(DEVICES):
            _wait_for(dep.start(f"d{n}{k}", fill(worker, dep.values(n, k)))[1], STARTED, 180)
    rogue, rogue_log = dep.start("rogue", fill(supernode, dep.values(ROGUE)))
    run_cmd = fill(run_cmd, dep.values()).replace('overrides="', f'overrides="{TEST_OVERRIDES}', 1)
    run_cmd += f" --run-config 'output-dir=\"{out}\"'"
    return dep.run("server", run_cmd, cwd=ROOT, timeout_s=900), rogue, rogue_log


def test_the_readme_deployment_runs_across_hosts_with_tls_and_supernode_auth(data_dir):
    reason = why_not_available()
    if reason:
        pytest.skip(f"cross-host deployment test: {reason}")
    work = Path(tempfile.mkdtemp(prefix="cpd", dir="/tmp"))  # short: Ray's socket paths live under it
    out = work / "runs"
    passed = False
    try:
        with NetnsLab(BOXES) as lab:
            dep = Deployment(lab, work, data_dir)
            proc, rogue, rogue_log = _deploy_and_run(dep, out)
            inodes = {box: lab.netns_inode(box) for box in BOXES}
            assert rogue.wait(timeout=60) != 0, "the SuperNode with an unregistered key was not refused"
            rogue_said = rogue_log.read_text(errors="replace")
            link_said = next(work.glob("server-flower-superlink.log")).read_text(errors="replace")
        assert not lab.leftovers(), f"namespaces left behind: {lab.leftovers()}"
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + link_said[-3000:]
        found = sorted(str(p.relative_to(work)) for p in work.rglob("rounds.jsonl"))
        assert (out / "hosts" / "rounds.jsonl").exists(), (
            f"no rounds.jsonl in {out}/hosts (found {found}): {proc.stdout[-3000:]}"
        )
        records = [json.loads(x) for x in (out / "hosts" / "rounds.jsonl").read_text().splitlines()]
        clients = next(r for r in records if r["round"] == 1)["clients"]
        assert sorted(clients) == [str(n) for n in range(CLUSTERS)]
        for n in range(CLUSTERS):
            assert clients[str(n)]["steps"] == 3
            want = [inodes[f"d{n}{k}"] for k in range(DEVICES)]
            assert clients[str(n)]["device-netns"] == want, (n, clients[str(n)]["device-netns"], inodes)
        assert "Failed to activate SuperNode" in rogue_said, rogue_said[-2000:]  # Flower's exit code 305
        assert "No SuperNode found with the given public key" in link_said
        passed = True
    finally:
        if passed:
            shutil.rmtree(work, ignore_errors=True)  # else kept for its logs: the failure names the folder
