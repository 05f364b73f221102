"""Running the processes of a parallel run in a test, as torchrun would."""

import signal
import subprocess


def interruptible() -> None:
    """``preexec_fn`` of a process a test will stop with SIGINT: SIGINT's default action restored.

    A command started in the background by a non-interactive shell (``make test &``, a CI script) inherits
    SIGINT *ignored*, and Python then installs no KeyboardInterrupt handler: the child would never see
    the test's Ctrl-C. Restored, the child behaves as under a terminal's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
