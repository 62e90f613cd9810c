"""Build on a cluster: the real workflow on a real single-node SLURM cluster (tests/slurm_cluster.py: munged,
slurmctld and slurmd from Debian's slurm-wlm + munge, started here) through snakemake-executor-plugin-slurm and
profiles/slurm. Two tiny models are fetched, saved and exported as SLURM jobs; nothing is served.

Skips, saying why, where a cluster cannot start (packages missing, not root) or the plugin is not installed."""

from __future__ import annotations

import os

import pytest

from tests.helpers import BIN, ROOT, make_workflow, tiny_model_entries
from tests.slurm_cluster import SlurmCluster, SlurmUnavailable, missing

pytestmark = pytest.mark.integration

# make test installs the executor apart (envs/slurm-plugin.txt): on PYTHONPATH for this test's runs only
PLUGINS = BIN.parent / "slurm-plugins"
RULES = ("fetch", "pretrained", "export_onnx")


def finished(result) -> list[str]:
    """Rules of the jobs a run saw finish (the SLURM executor logs "Finished jobid: 3 (Rule: fetch)")."""
    text = result.stdout + result.stderr
    return [line.rsplit("Rule: ", 1)[1].rstrip(")") for line in text.splitlines() if line.startswith("Finished jobid:")]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = missing()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as error:
        cluster.stop()
        pytest.skip(f"the SLURM cluster did not start: {error}")
    yield cluster
    cluster.stop()


def test_cluster_runs_a_batch_job(slurm, tmp_path):
    out = tmp_path / "hostname.out"
    submitted = slurm.run("sbatch", "--parsable", "--wait", f"--output={out}", "--wrap", "srun hostname", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    assert out.read_text().strip() == os.uname().nodename
    assert {"id": job, "name": "wrap", "state": "COMPLETED", "comment": "(null)"} in slurm.jobs()


def test_two_models_build_as_slurm_jobs(slurm, tiny_models, tmp_path):
    if not (PLUGINS / "snakemake_executor_plugin_slurm").is_dir():
        pytest.skip(f"the SLURM executor plugin is not installed in {PLUGINS}: make .venv/.installed-test (envs/slurm-plugin.txt)")
    entries = [entry for entry in tiny_model_entries(tiny_models) if entry["name"] in ("embed", "classify")]
    workflow = make_workflow(tmp_path / "work", entries)
    python_path = os.pathsep.join(p for p in (str(PLUGINS), os.environ.get("PYTHONPATH", "")) if p)
    workflow.env = {"SLURM_CONF": str(slurm.conf), "PYTHONPATH": python_path}  # the jobs' snakemake inherits it too
    targets = [f".hf2triton/models/{name}/{step}" for name in ("embed", "classify") for step in ("pretrained", "onnx")]
    result = workflow.run(
        "--profile",
        str(ROOT / "profiles" / "slurm"),
        "--jobs",
        "2",
        # this cluster: no slurmdbd (status from squeue: MinJobAge=3600), no accounts, its CPUs as the cap
        # on the rules' threads (helpers' --cores 1 would make every job 1 CPU), and no reason to wait 40 s
        # before the first status check
        "--slurm-status-command",
        "squeue",
        "--slurm-no-account",
        "--cores",
        str(slurm.cpus),
        "--slurm-init-seconds-before-status-checks",
        "1",
        "--seconds-between-status-checks",
        "2",
        "--slurm-keep-successful-logs",
        "--latency-wait",
        "5",
        *targets,
        timeout=600,
    )
    text = result.stdout + result.stderr
    assert "Using profile" in text and "profiles/slurm" in text, text[-3000:]

    # every job went through SLURM and completed: its comment names the rule and the model
    jobs = [job for job in slurm.jobs() if job["comment"].startswith("rule_")]
    ran = sorted((job["comment"], job["state"]) for job in jobs)
    expected = sorted((f"rule_{rule}_wildcards_{name}", "COMPLETED") for rule in RULES for name in ("embed", "classify"))
    assert ran == expected, f"{ran}\n{text[-4000:]}"
    assert sorted(finished(result)) == sorted(rule for rule in RULES for _ in range(2))

    # with the resources the rules declare (threads capped by --cores at the node's CPUs)
    for job in jobs:
        shown = slurm.run("scontrol", "show", "job", job["id"]).stdout
        rule = job["comment"].split("_wildcards_")[0].removeprefix("rule_")
        memory = {"fetch": "2000M", "pretrained": "8000M", "export_onnx": "16000M"}[rule]
        threads = min({"fetch": 1, "pretrained": 2, "export_onnx": 4}[rule], slurm.cpus)
        assert f"mem={memory}" in shown and f"NumCPUs={threads}" in shown, shown

    # one SLURM log per job, and the outputs on the (here: local) shared filesystem
    logs = workflow.directory / ".snakemake" / "slurm_logs"
    for rule in RULES:
        for name in ("embed", "classify"):
            assert list((logs / f"rule_{rule}" / name).glob("*.log")), sorted(logs.rglob("*"))
    for name in ("embed", "classify"):
        model = workflow.work / "models" / name
        assert (model / "pretrained" / "config.json").is_file()
        assert list((model / "onnx").glob("*.onnx"))

    # a second run finds everything built and submits nothing
    again = workflow.run("--profile", str(ROOT / "profiles" / "slurm"), "--slurm-status-command", "squeue", "--slurm-no-account", *targets)
    assert finished(again) == [] and "Nothing to be done" in again.stdout + again.stderr
    assert len([job for job in slurm.jobs() if job["comment"].startswith("rule_")]) == len(expected)
