"""How a process learns that it is one of several, from the environment its launcher gives it
(jaxnet.parallel.launchers), without starting one: the Slurm and Open MPI 4 environments as
their launchers set them (tests/test_cluster.py runs the real ones), JAX's own detection as the
reference for the coordinator's address, and the one-line errors for a launcher jaxnet cannot
read and for a port in use."""

from __future__ import annotations

import socket
import sys

import pytest
from conftest import run_patiently

from jaxnet.errors import UserError
from jaxnet.parallel import launchers, watch

# What srun gives task 1 of a 4-task step on 2 nodes (copied from a real job's environment).
SLURM_STEP = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NODELIST": "gpu[007-008]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
}
# What Open MPI 4's mpirun gives rank 1 of 2 on one host.
OPEN_MPI = {
    "OMPI_MCA_orte_hnp_uri": "2793734144.0;tcp://10.0.0.5,172.17.0.1:41235",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def _jax_detects(env: dict[str, str], monkeypatch) -> tuple[str, int, int, list[int] | None]:
    """What jax.distributed.initialize() would use in ``env`` (JAX's own cluster detection)."""
    from jax._src import clusters

    for name in [*SLURM_STEP, *OPEN_MPI, "JAX_COORDINATOR_PORT"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 300)


def test_a_slurm_step_is_read_as_jax_reads_it_with_the_first_step_s_port(monkeypatch):
    launch = launchers.find(env=SLURM_STEP)
    address, count, index, devices = _jax_detects(SLURM_STEP, monkeypatch)
    assert (launch.coordinator, launch.num_processes, launch.process_id) == (address, count, index)
    assert launch.coordinator == "gpu007:" + str(61440 + 4711 % 4096)
    assert launch.local_device_ids == (1,) and devices == [1]  # 2 tasks per node: one device each


def test_open_mpi_4_is_read_as_jax_reads_it(monkeypatch):
    launch = launchers.find(env=OPEN_MPI)
    address, count, index, _ = _jax_detects(OPEN_MPI, monkeypatch)
    assert (launch.coordinator, launch.num_processes, launch.process_id) == (address, count, index)
    assert launch.coordinator.startswith("10.0.0.5:") and launch.local_device_ids == (1,)
    # Open MPI inside a Slurm allocation: mpirun's processes, as in JAX
    both = launchers.find(env={**SLURM_STEP, **OPEN_MPI})
    assert both.coordinator == launch.coordinator and both.num_processes == 2


def test_steps_of_one_job_get_ports_of_their_own_and_jax_coordinator_port_overrides(monkeypatch):
    ports = {launchers.slurm_port(4711, step) for step in range(64)}
    assert len(ports) == 64 and all(61440 <= p <= 65535 for p in ports)
    # jobs with nearby ids running one step each, or a few steps, on one node never meet
    near = [launchers.slurm_port(job, step) for job in range(4700, 4720) for step in range(4)]
    assert len(set(near)) == len(near)
    second = launchers.find(env={**SLURM_STEP, "SLURM_STEP_ID": "1"})
    assert second.coordinator != launchers.find(env=SLURM_STEP).coordinator
    assert second.coordinator != _jax_detects({**SLURM_STEP, "SLURM_STEP_ID": "1"}, monkeypatch)[0]  # JAX's: same
    assert launchers.find(env={**SLURM_STEP, "JAX_COORDINATOR_PORT": "23456"}).coordinator == "gpu007:23456"


def test_the_only_process_of_a_node_uses_every_device_it_sees():
    # JAX's detection would give it device 0 alone (SLURM_LOCALID=0): a node of 8 GPUs using 1
    one_per_node = {**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_LOCALID": "0"}
    assert launchers.find(env=one_per_node).local_device_ids == ()
    # srun --gpus-per-task: Slurm gave each task its own GPU, the only one it sees
    assert launchers.find(env={**SLURM_STEP, "SLURM_GPUS_PER_TASK": "1"}).local_device_ids == ()
    assert launchers.find(env={**SLURM_STEP, "CUDA_VISIBLE_DEVICES": "5"}).local_device_ids == ()
    assert launchers.find(env={**SLURM_STEP, "CUDA_VISIBLE_DEVICES": "0,1"}).local_device_ids == (1,)


@pytest.mark.parametrize(
    "nodelist, first",
    [("node1", "node1"), ("node1,node2", "node1"), ("n[08-11]", "n08"), ("n[3,5-7],m1", "n3"),
     ("rack[2-3]-gpu[010-012]", "rack2-gpu010"), ("gpu[07-08]-ib", "gpu07-ib")],
)  # fmt: skip
def test_the_first_host_of_a_slurm_host_list(nodelist, first):
    assert launchers.first_host(nodelist) == first


def test_slurm_s_tasks_per_node_list_is_expanded():
    assert launchers.tasks_per_node("3(x2),1,2(x1)") == [3, 3, 1, 2]
    assert launchers.tasks_per_node("8") == [8]


def test_single_process_runs_and_a_one_task_step_join_nothing():
    assert launchers.find(env={}) is None
    assert launchers.find(env={**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "1"}) is None
    assert launchers.find(env={**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}) is None
    # The batch script's own shell in a job of 2 tasks: one process, with a warning
    assert launchers.batch_shell_tasks({"SLURM_JOB_ID": "4711", "SLURM_NTASKS": "2"}) == 2
    assert launchers.batch_shell_tasks(SLURM_STEP) == 0 and launchers.batch_shell_tasks({}) == 0


@pytest.mark.parametrize(
    "env, rank",
    [
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}, "$OMPI_COMM_WORLD_RANK"),
        ({"PMI_SIZE": "4", "PMI_RANK": "3"}, "$PMI_RANK"),
    ],
)
def test_a_launcher_jaxnet_cannot_read_is_one_line_saying_what_to_give(env, rank):
    with pytest.raises(UserError) as raised:
        launchers.find(env=env)
    message = str(raised.value)
    assert "\n" not in message and "--coordinator HOST:PORT" in message and f"--process-id {rank}" in message


def test_the_command_under_open_mpi_5_stops_with_that_line_before_starting_jax(tmp_path):
    from conftest import cpu_env

    env = {**cpu_env(1), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}
    command = [sys.executable, "-m", "jaxnet", "train", "transformer_shakespeare:smoke", "--workdir", str(tmp_path)]
    result = run_patiently(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("jaxnet: error: this process was started by")
    assert "Open MPI 5" in result.stderr and not (tmp_path / "config.json").exists()


def test_a_coordinator_port_in_use_is_one_line_naming_it(tmp_path):
    from conftest import cpu_env

    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "jaxnet", "train", "transformer_shakespeare:smoke", "--workdir", str(tmp_path)]
        command += ["--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", "0"]
        result = run_patiently(command, capture_output=True, text=True, env=cpu_env(1), timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"jaxnet: error: [process 0 of 2] the coordinator's port {port} is in use on this host (by another run, "
        "perhaps); give --coordinator a free port, the same for every process"
    )


def test_a_port_held_by_another_run_s_coordinator_counts_as_in_use():
    """JAX's coordinator (gRPC) binds with SO_REUSEPORT, so a second coordinator on the same port
    would start without a word; the check binds without it and sees the port taken."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        other.bind(("::", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(UserError, match=f"JAXNET_WATCH_PORT={port}: port {port} is in use"):
            launchers.check_port(port, f"JAXNET_WATCH_PORT={port}: port", "set it to a free port (or 0 for any)")
    launchers.check_port(port, "the port", "free it")  # free again: no error


def test_each_line_a_process_prints_names_it(monkeypatch):
    monkeypatch.setattr(watch, "_who", None)
    assert watch.tagged("jaxnet: error: no such file") == "jaxnet: error: no such file"
    watch.identify(3, 8)
    assert watch.tagged("jaxnet: error: no such file") == "jaxnet: error: [process 3 of 8] no such file"
    assert watch.tagged("jaxnet: warning: slow") == "jaxnet: warning: [process 3 of 8] slow"
    assert watch.tagged("jaxnet: interrupted; rerun") == "jaxnet: [process 3 of 8] interrupted; rerun"
    watch.identify(0, 1)  # a single process names nobody
    assert watch.tagged("jaxnet: error: x") == "jaxnet: error: x"


def test_the_plan_names_both_process_layouts_and_where_tensor_groups_sit():
    from jaxnet import planner

    layout = planner.process_layout(16, {"data": 4, "fsdp": 2, "tensor": 2})
    assert (layout["hosts"], layout["gpus_per_host"]) == (2, 8)
    assert layout["per_host"] == {"processes": 2, "srun": "--nodes=2 --ntasks-per-node=1 --gpus-per-node=8"}
    assert layout["per_gpu"] == {"processes": 16, "srun": "--nodes=2 --ntasks-per-node=8 --gpus-per-task=1"}
    assert layout["tensor_within_host"]
    across = planner.process_layout(32, {"data": 2, "fsdp": 1, "tensor": 16})
    (line,) = planner._processes_line({"processes": across, "mesh": {"tensor": 16}})
    assert "either 4 (one per host" in line and "or 32 (one per GPU" in line and "ACROSS hosts" in line
    assert planner.process_layout(1, {"tensor": 1})["per_gpu"]["processes"] == 1
