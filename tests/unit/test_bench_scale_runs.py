"""A measured command's peak RSS is its own, however large the measuring process has grown.

Linux carries a process's RSS high-water mark across exec (exec_mmap keeps the old image's
hiwater in signal->maxrss), and a child spawned with vfork or fork starts from its parent's image,
so a small command spawned by a large parent reported the parent's peak (bench.scale parses
simulate's answer, hundreds of MiB at 5,000 nodes, and measured the next floor after it).
"""

from __future__ import annotations

import sys

from bench.scale.runs import run_timed

BALLAST_MIB = 300


def test_a_small_child_of_a_large_parent_reports_its_own_peak() -> None:
    ballast = bytearray(BALLAST_MIB * 1024 * 1024)
    for at in range(0, len(ballast), 4096):  # touch every page: resident, not just reserved
        ballast[at] = 1
    done = run_timed([sys.executable, "-c", "pass"], 60)
    assert done.returncode == 0
    assert done.peak_mib < BALLAST_MIB / 3, f"{done.peak_mib:.0f} MiB is the parent's peak, not the child's"
    del ballast


def test_the_command_output_status_and_times_come_back() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sum(range(10**6)); sys.exit(3)"
    done = run_timed([sys.executable, "-c", code], 60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert done.cpu_s > 0 and 0 < done.wall_s < 60 and done.peak_mib > 0
