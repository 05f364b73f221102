"""Running the processes of a parallel run in a test, as torchrun would."""

import subprocess


def run_ranks(commands: list[list[str]], envs: list[dict[str, str]], cwd, timeout: float) -> list[str]:
    """Start one process per rank, as torchrun would, wait for all, and return their stdouts.

    Each must exit with status 0 (its stderr is the failure message); all are killed if one hangs.
    """
    ranks = [subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for command, env in zip(commands, envs)]
    try:
        outputs = [rank.communicate(timeout=timeout) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for rank, (_, err) in zip(ranks, outputs):
        assert rank.returncode == 0, err
    return [out for out, _ in outputs]
